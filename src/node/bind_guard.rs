//! The bind guard on one node: the program of [`super::bind_program`] attached to the node's
//! `kubepods` cgroup for IPv4 and IPv6 binds, and its maps, which the agent keeps equal to what
//! it knows. An attachment outlives the agent, so a restarted agent finds the programs an
//! earlier one attached (by name) and takes over their maps: the guard holds while no agent
//! runs, and no bind is ever judged by an empty map.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::bind_program::{
    CONFIG_NETNS_COOKIE, CONFIG_OWNERS_UNTIL, CONFIG_POD_LEVEL, MapFds, PORTS, PROTOCOLS, QOS_DIR,
    VerdictKey, bind_program,
};
use super::bpf_sys::{self, ANY, F_ALLOW_MULTI, F_NO_PREALLOC, MAP_TYPE_ARRAY, MAP_TYPE_HASH};

/// Program names, as `bpftool prog` shows them.
const PROGRAM_NAMES: [(&str, u32); 2] = [
    ("portalloc_bind4", bpf_sys::CGROUP_INET4_BIND),
    ("portalloc_bind6", bpf_sys::CGROUP_INET6_BIND),
];
const MAP_NAMES: [&str; 6] = [
    "pa_config",
    "pa_modes",
    "pa_pods",
    "pa_owners",
    "pa_claims",
    "pa_verdicts",
];
/// Pods (and QoS directories) one node may run: far above kubelet's 110 default and 1,000
/// asked for.
const MAX_PODS: u32 = 16_384;
const MAX_OWNED: u32 = 131_072;
const MAX_CLAIMS: u32 = 16_384;
const MAX_VERDICTS: u32 = 16_384;

/// Why the guard cannot run on this node.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("cannot open the pod cgroup {path}: {source}")]
    Cgroup { path: PathBuf, source: io::Error },
    #[error(
        "the kernel refused to create the guard's BPF maps ({0}); it needs CAP_BPF and \
         CAP_NET_ADMIN (or CAP_SYS_ADMIN) and a kernel with BPF"
    )]
    Maps(io::Error),
    #[error("the kernel refused the guard's program ({error}); verifier log:\n{log}")]
    Load { error: io::Error, log: String },
    #[error(
        "cannot attach the guard to {path} ({source}); it needs cgroup v2 there and \
         CAP_NET_ADMIN (or CAP_SYS_ADMIN)"
    )]
    Attach { path: PathBuf, source: io::Error },
    #[error("reading or writing the guard's maps: {0}")]
    Map(io::Error),
}

/// The maps, owned.
struct Maps {
    config: OwnedFd,
    modes: OwnedFd,
    pods: OwnedFd,
    owners: OwnedFd,
    claims: OwnedFd,
    verdicts: OwnedFd,
}

impl Maps {
    fn create() -> io::Result<Self> {
        let hash = |key, value, max, name| {
            bpf_sys::map_create(MAP_TYPE_HASH, key, value, max, F_NO_PREALLOC, name)
        };
        Ok(Self {
            config: bpf_sys::map_create(MAP_TYPE_ARRAY, 4, 8, 4, 0, MAP_NAMES[0])?,
            modes: bpf_sys::map_create(MAP_TYPE_ARRAY, 4, 4, PORTS * PROTOCOLS, 0, MAP_NAMES[1])?,
            pods: hash(8, 4, MAX_PODS, MAP_NAMES[2])?,
            owners: hash(4, 8, MAX_OWNED, MAP_NAMES[3])?,
            claims: hash(4, 8, MAX_CLAIMS, MAP_NAMES[4])?,
            verdicts: hash(VerdictKey::SIZE as u32, 8, MAX_VERDICTS, MAP_NAMES[5])?,
        })
    }

    /// The maps of a program an earlier agent attached, by their names.
    fn of_program(prog: BorrowedFd<'_>) -> io::Result<Option<Self>> {
        let mut found: BTreeMap<String, OwnedFd> = BTreeMap::new();
        for id in bpf_sys::prog_info(prog)?.map_ids {
            let fd = bpf_sys::map_by_id(id)?;
            found.insert(bpf_sys::map_name(fd.as_fd())?, fd);
        }
        let mut take = |name: &str| found.remove(name);
        let maps = (|| {
            Some(Self {
                config: take(MAP_NAMES[0])?,
                modes: take(MAP_NAMES[1])?,
                pods: take(MAP_NAMES[2])?,
                owners: take(MAP_NAMES[3])?,
                claims: take(MAP_NAMES[4])?,
                verdicts: take(MAP_NAMES[5])?,
            })
        })();
        Ok(maps)
    }

    fn fds(&self) -> MapFds {
        MapFds {
            config: self.config.as_raw_fd(),
            modes: self.modes.as_raw_fd(),
            pods: self.pods.as_raw_fd(),
            owners: self.owners.as_raw_fd(),
            claims: self.claims.as_raw_fd(),
            verdicts: self.verdicts.as_raw_fd(),
        }
    }
}

/// The guard attached to one `kubepods` cgroup.
pub struct BindGuard {
    maps: Maps,
    /// The modes as last written, so a change writes only what differs without reading the
    /// whole array back; `None` until the first write, which reads it (an earlier agent's).
    modes_written: std::sync::Mutex<Option<BTreeMap<u32, u32>>>,
    /// Whether this agent attached the programs, or took over an earlier agent's.
    pub took_over: bool,
}

impl BindGuard {
    /// Attach the guard to `kubepods` (whose children sit at cgroup level `pod_level`), for the
    /// network namespace whose cookie is `netns_cookie`; or take over the guard already there.
    pub fn attach(kubepods: &Path, pod_level: u32, netns_cookie: u64) -> Result<Self, GuardError> {
        let cgroup = File::open(kubepods).map_err(|source| GuardError::Cgroup {
            path: kubepods.to_path_buf(),
            source,
        })?;
        let attach_error = |source| GuardError::Attach {
            path: kubepods.to_path_buf(),
            source,
        };
        let earlier = find_attached(cgroup.as_fd()).map_err(attach_error)?;
        if let Some((maps, programs)) = earlier
            && programs.len() == PROGRAM_NAMES.len()
        {
            let guard = Self {
                maps,
                modes_written: Default::default(),
                took_over: true,
            };
            guard.configure(pod_level, netns_cookie)?;
            return Ok(guard);
        }
        let maps = Maps::create().map_err(GuardError::Maps)?;
        let guard = Self {
            maps,
            modes_written: Default::default(),
            took_over: false,
        };
        guard.configure(pod_level, netns_cookie)?;
        let program = bind_program(&guard.maps.fds());
        for (name, attach_type) in PROGRAM_NAMES {
            let prog = bpf_sys::prog_load(
                bpf_sys::PROG_TYPE_CGROUP_SOCK_ADDR,
                attach_type,
                &program,
                "Apache-2.0",
                name,
            )
            .map_err(|e| GuardError::Load {
                error: e.error,
                log: e.log,
            })?;
            bpf_sys::prog_attach(cgroup.as_fd(), prog.as_fd(), attach_type, F_ALLOW_MULTI)
                .map_err(attach_error)?;
        }
        Ok(guard)
    }

    /// Detach every guard program from `kubepods` (when the guard is turned off).
    pub fn detach(kubepods: &Path) -> io::Result<usize> {
        let cgroup = File::open(kubepods)?;
        let mut detached = 0;
        for (name, attach_type) in PROGRAM_NAMES {
            for id in bpf_sys::prog_query(cgroup.as_fd(), attach_type)? {
                let prog = bpf_sys::prog_by_id(id)?;
                if bpf_sys::prog_info(prog.as_fd())?.name == name {
                    bpf_sys::prog_detach(cgroup.as_fd(), prog.as_fd(), attach_type)?;
                    detached += 1;
                }
            }
        }
        Ok(detached)
    }

    /// How many guard programs are attached to `kubepods` (2 when whole: IPv4 and IPv6), found
    /// by name as [`BindGuard::attach`] finds them.
    pub fn attached(kubepods: &Path) -> io::Result<usize> {
        let cgroup = File::open(kubepods)?;
        let mut attached = 0;
        for (name, attach_type) in PROGRAM_NAMES {
            for id in bpf_sys::prog_query(cgroup.as_fd(), attach_type)? {
                let prog = bpf_sys::prog_by_id(id)?;
                if bpf_sys::prog_info(prog.as_fd())?.name == name {
                    attached += 1;
                }
            }
        }
        Ok(attached)
    }

    fn configure(&self, pod_level: u32, netns_cookie: u64) -> Result<(), GuardError> {
        let config = self.maps.config.as_fd();
        let put = |key: u32, value: u64| {
            bpf_sys::map_update(config, &key.to_ne_bytes(), &value.to_ne_bytes(), ANY)
        };
        put(CONFIG_NETNS_COOKIE, netns_cookie).map_err(GuardError::Map)?;
        put(CONFIG_POD_LEVEL, u64::from(pod_level)).map_err(GuardError::Map)
    }

    /// Make `modes` hold exactly `modes` (slot → mode), writing only what differs: the first
    /// time against the map as found (196,608 reads), then against what was last written.
    pub fn set_modes(&self, modes: &BTreeMap<u32, u32>) -> io::Result<usize> {
        let map = self.maps.modes.as_fd();
        let mut written = self.modes_written.lock().unwrap_or_else(|e| e.into_inner());
        let current = match written.take() {
            Some(current) => current,
            None => {
                let mut current = BTreeMap::new();
                let mut value = [0u8; 4];
                for slot in 0..PORTS * PROTOCOLS {
                    bpf_sys::map_lookup(map, &slot.to_ne_bytes(), &mut value)?;
                    let mode = u32::from_ne_bytes(value);
                    if mode != 0 {
                        current.insert(slot, mode);
                    }
                }
                current
            }
        };
        let mut changed = 0;
        let stale = current.keys().filter(|slot| !modes.contains_key(slot));
        let updates = stale.map(|&slot| (slot, 0)).chain(
            modes
                .iter()
                .filter(|(slot, mode)| current.get(slot) != Some(mode))
                .map(|(&slot, &mode)| (slot, mode)),
        );
        for (slot, mode) in updates.collect::<Vec<_>>() {
            // On an error `written` stays `None`: the map is read again next time.
            bpf_sys::map_update(map, &slot.to_ne_bytes(), &mode.to_ne_bytes(), ANY)?;
            changed += 1;
        }
        *written = Some(
            modes
                .iter()
                .filter(|(_, m)| **m != 0)
                .map(|(&s, &m)| (s, m))
                .collect(),
        );
        Ok(changed)
    }

    /// The agent's heartbeat, after a round that brought `pods` and `owners` up to date: other
    /// pods' holder entries count for `lease` from now. Past that, with no agent keeping them
    /// (stopped, crashing, being rolled out), an entry may name a pod deleted since, so it no
    /// longer refuses a pod new to the guard: that pod may claim the port instead.
    pub fn heartbeat(&self, lease: std::time::Duration) -> io::Result<()> {
        let until = monotonic_ns()?.saturating_add(lease.as_nanos().min(u64::MAX.into()) as u64);
        bpf_sys::map_update(
            self.maps.config.as_fd(),
            &CONFIG_OWNERS_UNTIL.to_ne_bytes(),
            &until.to_ne_bytes(),
            ANY,
        )
    }

    /// Mark the QoS directories `ids` in `pods`, leaving the rest: done before any mode is
    /// written, or a Burstable or BestEffort pod's bind would claim a port for its whole class.
    pub fn set_qos_dirs(&self, ids: &[u64]) -> io::Result<()> {
        for id in ids {
            bpf_sys::map_update(
                self.maps.pods.as_fd(),
                &id.to_ne_bytes(),
                &QOS_DIR.to_ne_bytes(),
                ANY,
            )?;
        }
        Ok(())
    }

    /// Make `pods` hold exactly `pods` (cgroup id → POD_SEEN or QOS_DIR).
    pub fn set_pods(&self, pods: &BTreeMap<u64, u32>) -> io::Result<usize> {
        let wanted = pods
            .iter()
            .map(|(k, v)| (k.to_ne_bytes().to_vec(), v.to_ne_bytes().to_vec()))
            .collect();
        sync_hash(self.maps.pods.as_fd(), 8, 4, wanted)
    }

    /// Make `owners` hold exactly `owners` (slot → the holder's pod cgroup id).
    pub fn set_owners(&self, owners: &BTreeMap<u32, u64>) -> io::Result<usize> {
        let wanted = owners
            .iter()
            .map(|(k, v)| (k.to_ne_bytes().to_vec(), v.to_ne_bytes().to_vec()))
            .collect();
        sync_hash(self.maps.owners.as_fd(), 4, 8, wanted)
    }

    /// The ports claimed by pods not seen when they bound (slot → cgroup id).
    pub fn claims(&self) -> io::Result<BTreeMap<u32, u64>> {
        let map = self.maps.claims.as_fd();
        let mut claims = BTreeMap::new();
        let mut value = [0u8; 8];
        for key in bpf_sys::map_keys(map, 4)? {
            if bpf_sys::map_lookup(map, &key, &mut value)? {
                let slot = u32::from_ne_bytes(key[..4].try_into().expect("4 bytes"));
                claims.insert(slot, u64::from_ne_bytes(value));
            }
        }
        Ok(claims)
    }

    /// Forget the claims of `slots` (their claimant is seen now, or gone).
    pub fn drop_claims(&self, slots: &BTreeSet<u32>) -> io::Result<()> {
        for slot in slots {
            bpf_sys::map_delete(self.maps.claims.as_fd(), &slot.to_ne_bytes())?;
        }
        Ok(())
    }

    /// The verdicts counted since the last call, each taken out of the map at once.
    pub fn take_verdicts(&self) -> io::Result<Vec<(VerdictKey, u64)>> {
        let map = self.maps.verdicts.as_fd();
        let mut verdicts = Vec::new();
        let mut value = [0u8; 8];
        for key in bpf_sys::map_keys(map, VerdictKey::SIZE)? {
            if bpf_sys::map_take(map, &key, &mut value)? {
                verdicts.push((VerdictKey::from_bytes(&key), u64::from_ne_bytes(value)));
            }
        }
        Ok(verdicts)
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of the program's `bpf_ktime_get_ns`.
fn monotonic_ns() -> io::Result<u64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64)
}

/// Our programs on `cgroup`, and their maps if they are whole.
fn find_attached(cgroup: BorrowedFd<'_>) -> io::Result<Option<(Maps, Vec<OwnedFd>)>> {
    let mut programs = Vec::new();
    let mut maps = None;
    for (name, attach_type) in PROGRAM_NAMES {
        for id in bpf_sys::prog_query(cgroup, attach_type)? {
            let prog = bpf_sys::prog_by_id(id)?;
            if bpf_sys::prog_info(prog.as_fd())?.name != name {
                continue;
            }
            if maps.is_none() {
                maps = Maps::of_program(prog.as_fd())?;
            }
            programs.push(prog);
            break;
        }
    }
    Ok(maps.map(|maps| (maps, programs)))
}

/// Make a hash map hold exactly `want` (keys and values as the map's bytes): delete the keys it
/// should not have, write the values that differ. Returns how many entries changed.
fn sync_hash(
    map: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    wanted: BTreeMap<Vec<u8>, Vec<u8>>,
) -> io::Result<usize> {
    let mut changed = 0;
    for key in bpf_sys::map_keys(map, key_size)? {
        if !wanted.contains_key(&key) && bpf_sys::map_delete(map, &key)? {
            changed += 1;
        }
    }
    let mut current = vec![0u8; value_size];
    for (key, value) in &wanted {
        let present = bpf_sys::map_lookup(map, key, &mut current)?;
        if !present || &current != value {
            bpf_sys::map_update(map, key, value, ANY)?;
            changed += 1;
        }
    }
    Ok(changed)
}

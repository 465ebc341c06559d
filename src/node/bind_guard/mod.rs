//! The bind guard on one node: the program of [`super::bind_program`] linked to the node's
//! `kubepods` cgroup for IPv4 and IPv6 binds, and its maps, which the agent keeps equal to what
//! it knows. The links and maps are pinned in bpffs ([`super::guard_pins`]), so they outlive the
//! agent: a restarted agent opens them by pin and takes the maps over (the guard holds while no
//! agent runs, and no bind is ever judged by an empty map); a new release's agent replaces the
//! program in place (a link update), keeping the maps when their layout is the same.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::bind_program::{
    CONFIG_NETNS_COOKIE, CONFIG_OWNERS_UNTIL, CONFIG_POD_LEVEL, MapFds, PORTS, PROTOCOLS, QOS_DIR,
    VerdictKey, bind_program,
};
use super::bpf_sys::{self, ANY, F_NO_PREALLOC, MAP_TYPE_ARRAY, MAP_TYPE_HASH};
use super::cgroups;
use super::guard_pins::{self, MOUNT_HINT};
use links::{clear, detach_unlinked, find_links, tidy};
use maps::Maps;

mod links;
mod maps;

/// The program's name (as `bpftool prog` shows it) and its pins' family, per attach type.
const PROGRAMS: [(&str, &str, u32); 2] = [
    ("portalloc_bind4", "4", bpf_sys::CGROUP_INET4_BIND),
    ("portalloc_bind6", "6", bpf_sys::CGROUP_INET6_BIND),
];
/// Pods (and QoS directories) one node may run: far above kubelet's 110 default and 1,000
/// asked for.
const MAX_PODS: u32 = 16_384;
const MAX_OWNED: u32 = 131_072;
const MAX_CLAIMS: u32 = 16_384;
const MAX_VERDICTS: u32 = 16_384;
/// The maps, in [`Maps`]' order: name (kernel and pin), then type, key and value sizes,
/// entries and flags, as the kernel reports them.
const MAP_SPECS: [(&str, [u32; 5]); 6] = [
    ("pa_config", [MAP_TYPE_ARRAY, 4, 8, 4, 0]),
    ("pa_modes", [MAP_TYPE_ARRAY, 4, 4, PORTS * PROTOCOLS, 0]),
    ("pa_pods", [MAP_TYPE_HASH, 8, 4, MAX_PODS, F_NO_PREALLOC]),
    ("pa_owners", [MAP_TYPE_HASH, 4, 8, MAX_OWNED, F_NO_PREALLOC]),
    (
        "pa_claims",
        [MAP_TYPE_HASH, 4, 8, MAX_CLAIMS, F_NO_PREALLOC],
    ),
    (
        "pa_verdicts",
        [
            MAP_TYPE_HASH,
            VerdictKey::SIZE as u32,
            8,
            MAX_VERDICTS,
            F_NO_PREALLOC,
        ],
    ),
];

/// Why the guard cannot run on this node.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("cannot open the pod cgroup {path}: {source}")]
    Cgroup { path: PathBuf, source: io::Error },
    #[error(
        "{dir} is not on a bpffs, where the guard pins its links so they outlive the agent \
         (on the node: {MOUNT_HINT}; the chart mounts the host's /sys/fs/bpf)"
    )]
    NotBpffs { dir: PathBuf },
    #[error("the guard's pins in {dir}: {source}")]
    Pins { dir: PathBuf, source: io::Error },
    #[error(
        "the kernel refused to create the guard's BPF maps ({0}); it needs CAP_BPF and a \
         kernel with BPF"
    )]
    Maps(io::Error),
    #[error("the kernel refused the guard's program ({error}); verifier log:\n{log}")]
    Load { error: io::Error, log: String },
    #[error(
        "cannot link the guard to {path} ({source}); it needs cgroup v2 there, CAP_NET_ADMIN \
         and a kernel with cgroup BPF links (5.7+)"
    )]
    Attach { path: PathBuf, source: io::Error },
    #[error(
        "replacing the guard's program in {dir} ({source}); another writer changed the link \
         meanwhile, so the agent reads its pins again"
    )]
    Replace { dir: PathBuf, source: io::Error },
    #[error("reading or writing the guard's maps: {0}")]
    Map(io::Error),
}

/// This build's program version (a hash of its instructions).
pub fn program_version() -> String {
    let placeholder = MapFds {
        config: 1,
        modes: 2,
        pods: 3,
        owners: 4,
        claims: 5,
        verdicts: 6,
    };
    guard_pins::program_version(&bind_program(&placeholder))
}

/// This build's map layout version (a hash of the maps' shapes).
pub fn layout() -> String {
    guard_pins::layout_version(MAP_SPECS)
}

/// A new program to swap into a link that runs `old`.
struct Swap {
    family: &'static str,
    link: OwnedFd,
    old: OwnedFd,
    new: OwnedFd,
}

/// The guard attached to one `kubepods` cgroup.
pub struct BindGuard {
    maps: Maps,
    pins: PathBuf,
    /// The modes as last written, so a change writes only what differs without reading the
    /// whole array back; `None` until the first write, which reads it (an earlier agent's).
    modes_written: std::sync::Mutex<Option<BTreeMap<u32, u32>>>,
    /// Whether this agent took over maps an earlier agent filled (or made them afresh).
    pub took_over: bool,
    /// An upgrade whose maps are new: the old program keeps guarding (with the old maps) until
    /// the agent has filled these, then [`BindGuard::finish_upgrade`] swaps the new one in.
    pending: Option<Vec<Swap>>,
}

impl BindGuard {
    /// Link the guard to `kubepods` (whose children sit at cgroup level `pod_level`), for the
    /// network namespace whose cookie is `netns_cookie`, pinning it in `pins` (see
    /// [`guard_pins::pin_dir`]); or take over the guard pinned there, replacing its program
    /// if it is another version's.
    pub fn attach(
        kubepods: &Path,
        pins: &Path,
        pod_level: u32,
        netns_cookie: u64,
    ) -> Result<Self, GuardError> {
        let cgroup = File::open(kubepods).map_err(|source| GuardError::Cgroup {
            path: kubepods.to_path_buf(),
            source,
        })?;
        let cgroup_id = cgroups::cgroup_id(kubepods).map_err(|source| GuardError::Cgroup {
            path: kubepods.to_path_buf(),
            source,
        })?;
        let pins_error = |source| GuardError::Pins {
            dir: pins.to_path_buf(),
            source,
        };
        if !guard_pins::prepare(pins).map_err(pins_error)? {
            return Err(GuardError::NotBpffs {
                dir: pins.to_path_buf(),
            });
        }
        let found = find_links(pins).map_err(pins_error)?;
        let whole = found.iter().all(|f| {
            f.as_ref()
                .is_some_and(|f| f.cgroup_id == cgroup_id && f.running.is_some())
        });
        if !whole {
            // Nothing, half a guard, links on a cgroup since removed, or a program this agent
            // did not pin: start afresh.
            clear(pins).map_err(pins_error)?;
            return Self::attach_afresh(&cgroup, kubepods, pins, pod_level, netns_cookie);
        }
        let kept = Maps::pinned(pins).map_err(pins_error)?;
        let took_over = kept.is_some();
        let maps = match kept {
            Some(maps) => maps,
            None => Maps::create().map_err(GuardError::Maps)?,
        };
        let mut guard = Self::new(maps, pins, took_over);
        guard.configure(pod_level, netns_cookie)?;
        let version = program_version();
        let links = found.map(|f| f.expect("whole"));
        let current = links
            .iter()
            .all(|f| f.running.as_ref().is_some_and(|(v, _)| *v == version));
        if !current || !took_over {
            let mut swaps = Vec::new();
            for ((name, family, attach_type), found) in PROGRAMS.iter().zip(links) {
                let prog = load(&guard.maps, name, *attach_type)?;
                let (_, old) = found.running.expect("whole");
                swaps.push(Swap {
                    family,
                    link: found.link,
                    old,
                    new: prog,
                });
            }
            guard.pending = Some(swaps);
            // The same maps: nothing to fill first.
            if took_over {
                guard.finish_upgrade()?;
            }
        } else {
            tidy(pins, &version).map_err(pins_error)?;
        }
        Ok(guard)
    }

    fn new(maps: Maps, pins: &Path, took_over: bool) -> Self {
        Self {
            maps,
            pins: pins.to_path_buf(),
            modes_written: Default::default(),
            took_over,
            pending: None,
        }
    }

    fn attach_afresh(
        cgroup: &File,
        kubepods: &Path,
        pins: &Path,
        pod_level: u32,
        netns_cookie: u64,
    ) -> Result<Self, GuardError> {
        let pins_error = |source| GuardError::Pins {
            dir: pins.to_path_buf(),
            source,
        };
        let attach_error = |source| GuardError::Attach {
            path: kubepods.to_path_buf(),
            source,
        };
        // An earlier release's programs (attached without a link), where this agent may
        // remove them: left beside the links, they would judge binds by maps nobody keeps.
        let _ = detach_unlinked(cgroup.as_fd());
        let guard = Self::new(Maps::create().map_err(GuardError::Maps)?, pins, false);
        guard.configure(pod_level, netns_cookie)?;
        guard.maps.pin(pins).map_err(pins_error)?;
        let version = program_version();
        for (name, family, attach_type) in PROGRAMS {
            let prog = load(&guard.maps, name, attach_type)?;
            guard_pins::pin(&prog, pins, &guard_pins::prog_name(family, &version))
                .map_err(pins_error)?;
            let link = bpf_sys::link_create(cgroup.as_fd(), prog.as_fd(), attach_type)
                .map_err(attach_error)?;
            guard_pins::pin(&link, pins, &guard_pins::link_name(family, &version))
                .map_err(pins_error)?;
        }
        Ok(guard)
    }

    /// Whether an upgrade waits for the agent to fill the new maps.
    pub fn upgrading(&self) -> bool {
        self.pending.is_some()
    }

    /// Swap this version's program into the links (each only if it still runs the program
    /// found, so a racing writer is noticed), then pin it all under this version's names and
    /// remove the old pins. Called once the maps are filled; `false`: nothing was pending.
    pub fn finish_upgrade(&mut self) -> Result<bool, GuardError> {
        let Some(swaps) = self.pending.take() else {
            return Ok(false);
        };
        let pins = self.pins.clone();
        let pins_error = |source| GuardError::Pins {
            dir: pins.clone(),
            source,
        };
        // Every swap before any pin changes: a racing writer fails it with the pins intact.
        // (Cut short between the two, the next agent finds a link running a program not
        // pinned, and attaches afresh.)
        for swap in &swaps {
            bpf_sys::link_update(swap.link.as_fd(), swap.new.as_fd(), swap.old.as_fd()).map_err(
                |source| GuardError::Replace {
                    dir: pins.clone(),
                    source,
                },
            )?;
        }
        let version = program_version();
        if !self.took_over {
            self.maps.pin(&pins).map_err(pins_error)?;
        }
        for swap in &swaps {
            guard_pins::pin(
                &swap.new,
                &pins,
                &guard_pins::prog_name(swap.family, &version),
            )
            .map_err(pins_error)?;
            guard_pins::pin(
                &swap.link,
                &pins,
                &guard_pins::link_name(swap.family, &version),
            )
            .map_err(pins_error)?;
        }
        self.took_over = true;
        tidy(&pins, &version).map_err(pins_error)?;
        Ok(true)
    }

    /// Detach the guard from `kubepods` and remove its pins in `pins` (when the agent is
    /// removed); also an earlier release's programs attached without a link, where this
    /// process may (that needs CAP_SYS_ADMIN). Returns how many programs were detached.
    pub fn detach(kubepods: &Path, pins: &Path) -> io::Result<usize> {
        let mut detached = 0;
        let cgroup_id = cgroups::cgroup_id(kubepods).ok();
        for found in find_links(pins)?.into_iter().flatten() {
            if found.cgroup_id != 0 {
                bpf_sys::link_detach(found.link.as_fd())?;
                if Some(found.cgroup_id) == cgroup_id {
                    detached += 1;
                }
            }
        }
        clear(pins)?;
        match std::fs::remove_dir(pins) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        if let Ok(cgroup) = File::open(kubepods) {
            match detach_unlinked(cgroup.as_fd()) {
                Ok(n) => detached += n,
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(detached)
    }

    /// How many of the guard's links pinned in `pins` are attached to `kubepods` (2 when
    /// whole: IPv4 and IPv6).
    pub fn attached(kubepods: &Path, pins: &Path) -> io::Result<usize> {
        let cgroup_id = cgroups::cgroup_id(kubepods)?;
        let found = find_links(pins)?;
        Ok(found
            .iter()
            .flatten()
            .filter(|f| f.cgroup_id == cgroup_id)
            .count())
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

/// Load the program for `attach_type` over `maps`.
fn load(maps: &Maps, name: &str, attach_type: u32) -> Result<OwnedFd, GuardError> {
    bpf_sys::prog_load(
        bpf_sys::PROG_TYPE_CGROUP_SOCK_ADDR,
        attach_type,
        &bind_program(&maps.fds()),
        "Apache-2.0",
        name,
    )
    .map_err(|e| GuardError::Load {
        error: e.error,
        log: e.log,
    })
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

//! A simulated node's cgroup tree, and processes started inside one of its cgroups.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use portalloc::node::cgroups::CgroupDriver;

/// The cgroup2 hierarchy's mount point (`mount -t cgroup2`).
pub fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("read /proc/self/mounts");
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, kind) = (f.next()?, f.next()?, f.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(at))
        })
        .next()
        .expect(
            "no cgroup2 hierarchy is mounted: the node tests need one (mount -t cgroup2 none DIR)",
        )
}

/// Moves the calling test's thread, and so every process it starts, into a network namespace
/// of its own with `lo` up: the ports a test binds are then free whatever the machine's other
/// sockets hold (in CI one was taken, most likely by an earlier test's connection in TIME_WAIT,
/// the ephemeral range covering them). The guard is attached for this namespace's cookie, as
/// the agent's is for the node's.
///
/// Only for tests whose thread does nothing else: an e2e test's thread must still reach the API
/// server, so its nodes take `unshare --net` processes instead (tests/common/agent_node.rs).
pub fn own_network_namespace() {
    // SAFETY: unshare and ioctl on a socket of our own; `ifreq` is zeroed but for the name "lo" and its flags.
    unsafe {
        assert_eq!(
            libc::unshare(libc::CLONE_NEWNET),
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let mut request: libc::ifreq = std::mem::zeroed();
        for (to, from) in request.ifr_name.iter_mut().zip(b"lo") {
            *to = *from as libc::c_char;
        }
        request.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        let up = libc::ioctl(fd, libc::SIOCSIFFLAGS, &request);
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        assert_eq!(up, 0, "bring lo up: {error}");
    }
}

/// A bpffs instance of the test's own, mounted on a temporary directory and unmounted on drop
/// (its pins, and the links only they hold, go with it): tests never touch /sys/fs/bpf.
pub struct BpfFs {
    dir: tempfile::TempDir,
}

impl BpfFs {
    pub fn mount() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mount(2) with NUL-terminated strings we own and no data.
        let mounted = unsafe {
            libc::mount(
                c"bpf".as_ptr(),
                path.as_ptr(),
                c"bpf".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(
            mounted,
            0,
            "mount -t bpf bpf {}: {}",
            dir.path().display(),
            std::io::Error::last_os_error()
        );
        // Shared, as systemd mounts /sys/fs/bpf: a container mounting it with
        // HostToContainer propagation (the chart's agent) needs a shared or slave mount.
        // SAFETY: mount(2) changing only the propagation of the mount made above.
        let shared = unsafe {
            libc::mount(
                std::ptr::null(),
                path.as_ptr(),
                std::ptr::null(),
                libc::MS_SHARED,
                std::ptr::null(),
            )
        };
        assert_eq!(
            shared,
            0,
            "mount --make-shared {}: {}",
            dir.path().display(),
            std::io::Error::last_os_error()
        );
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        let path = std::ffi::CString::new(self.dir.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: umount2 with a NUL-terminated path we own.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A node's cgroup root (a directory of its own under the cgroup2 mount), removed on drop, and
/// the bpffs its guard is pinned in.
pub struct NodeCgroups {
    pub root: PathBuf,
    pub driver: CgroupDriver,
    pub bpf: BpfFs,
}

impl NodeCgroups {
    pub fn new(name: &str, driver: CgroupDriver) -> Self {
        assert!(
            unsafe { libc::geteuid() } == 0,
            "the node tests attach cgroup BPF programs: run them as root"
        );
        let root = cgroup2_mount().join(format!("portalloc-test-{}-{name}", std::process::id()));
        let node = Self {
            root,
            driver,
            bpf: BpfFs::mount(),
        };
        // kubelet makes the QoS classes' directories when it starts, before any pod.
        for qos in ["burstable", "besteffort"] {
            node.mkdir(&node.kubepods().join(driver.qos_dir(qos)));
        }
        node
    }

    pub fn kubepods(&self) -> PathBuf {
        self.root.join(self.driver.kubepods())
    }

    /// The agent's `--bpf-dir` on this node.
    pub fn bpf_dir(&self) -> PathBuf {
        self.bpf.path().join("kubectl-portalloc")
    }

    /// Where the guard of this node's kubepods is pinned.
    pub fn pins(&self) -> PathBuf {
        portalloc::node::guard_pins::pin_dir(&self.bpf_dir(), &self.kubepods())
    }

    fn mkdir(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    }

    /// The cgroup of pod `uid` in QoS class `qos` (None: Guaranteed), with one container
    /// cgroup below it, as kubelet and the runtime make them; returns the container's.
    pub fn pod(&self, qos: Option<&str>, uid: &str) -> PathBuf {
        let mut dir = self.kubepods();
        if let Some(qos) = qos {
            dir = dir.join(self.driver.qos_dir(qos));
        }
        let pod = dir.join(self.driver.pod_dir(qos, uid));
        let container = pod.join("container");
        self.mkdir(&container);
        container
    }
}

impl Drop for NodeCgroups {
    fn drop(&mut self) {
        // Leaves first; a cgroup with processes cannot go, and ours have exited by now.
        let mut dirs: Vec<PathBuf> = walk(&self.root);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![dir.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.extend(walk(&entry.path()));
            }
        }
    }
    dirs
}

/// Bind `port` from a process started in `cgroup` (None: the test's own cgroup, outside every
/// pod); what the kernel answered: "ok", "EPERM", "EADDRINUSE".
pub fn bind_in(cgroup: Option<&Path>, port: u16, proto: &str, family: &str) -> String {
    let binder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node/binder.py");
    let enter = cgroup.map_or(String::new(), |cg| {
        format!("echo $$ > '{}/cgroup.procs' && ", cg.display())
    });
    let script = format!("{enter}exec python3 '{binder}' {port} {proto} {family}");
    let out = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("start sh");
    assert!(
        out.status.success(),
        "binder failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

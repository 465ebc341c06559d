//! A real node: kubelet (built from the pinned Kubernetes module by `scripts/local-cluster.sh
//! build-node`) and containerd with runc (Debian's packages), both in a network namespace of
//! their own, so hostNetwork pods get the node's network and never the machine's. kubelet
//! reaches the API server through the relay of tests/common/agent_node.rs (a UNIX socket to the
//! host's loopback); its pods' cgroups live below a cgroup root of the node's own
//! (`--cgroup-root`), in every hierarchy the machine mounts.
//!
//! Two things this machine needs that a cluster node does not:
//! - A runc wrapper (tests/image/runc-oom-clamp.sh) raising a negative `oomScoreAdj` to 0:
//!   this sandbox has no CAP_SYS_RESOURCE, so runc's `write /proc/self/oom_score_adj: -998`
//!   fails with EPERM and no pod starts ("can't get final child's PID from pipe: EOF").
//! - `failCgroupV1: false`: the machine mounts cgroup v1 controllers with v2 beside them
//!   (hybrid); runc then puts each container in the v2 tree as well, where the agent's guard
//!   judges it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::agent_node::AgentNode;
use super::{repo, run_ok};

/// The node's address: on its loopback, so it needs no link (this kernel has no `dummy`).
pub const NODE_IP: &str = "10.77.0.2";
/// The pause image kubelet's sandboxes run (containerd's `sandbox_image`).
pub const PAUSE_IMAGE: &str = "portalloc.test/pause:1";

pub struct KubeletNode {
    pub name: String,
    /// The network namespace, its relay to the API server, and the cgroup v2 root.
    pub netns: AgentNode,
    pub dir: tempfile::TempDir,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    /// The node's cgroup root made in each cgroup v1 hierarchy.
    v1_roots: Vec<PathBuf>,
}

/// kubelet, built (or found in the cache) by the script.
fn kubelet_binary() -> PathBuf {
    let out = run_ok(
        "scripts/local-cluster.sh build-node",
        Command::new(repo().join("scripts/local-cluster.sh"))
            .arg("build-node")
            .stderr(Stdio::inherit()),
    );
    PathBuf::from(out.lines().last().expect("a directory").trim()).join("kubelet")
}

/// Where each cgroup v1 hierarchy is mounted (none on a cgroup v2 machine).
fn cgroup_v1_mounts() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup")).then(|| PathBuf::from(f[1]))
        })
        .collect()
}

impl KubeletNode {
    /// Start containerd and kubelet as node `name` of the cluster of `kubeconfig`, with the
    /// images of `archives` (docker-archive tarballs) imported.
    pub fn start(kubeconfig: &Path, name: &str, archives: &[PathBuf]) -> KubeletNode {
        let kubelet = kubelet_binary();
        let netns = AgentNode::start(kubeconfig, name);
        netns.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
        let dir = tempfile::Builder::new()
            .prefix("real-node-")
            .tempdir()
            .unwrap();
        let cgroup_root = netns.cgroups.root.file_name().unwrap().to_owned();
        let v1_roots: Vec<PathBuf> = cgroup_v1_mounts()
            .into_iter()
            .map(|m| m.join(&cgroup_root))
            .collect();
        for root in &v1_roots {
            std::fs::create_dir_all(root).unwrap();
        }
        let mut node = KubeletNode {
            name: name.to_string(),
            netns,
            dir,
            containerd: None,
            kubelet: None,
            v1_roots,
        };
        node.start_containerd();
        for archive in archives {
            node.ctr(&["images", "import", archive.to_str().unwrap()]);
        }
        let cgroup_root = format!("/{}", cgroup_root.to_string_lossy());
        node.start_kubelet(&kubelet, kubeconfig, &cgroup_root);
        node
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn socket(&self) -> PathBuf {
        self.path("containerd/containerd.sock")
    }

    /// `ctr` against this node's containerd, in the namespace kubelet's pods use.
    pub fn ctr(&self, args: &[&str]) -> String {
        run_ok(
            "ctr",
            Command::new("ctr")
                .arg("--address")
                .arg(self.socket())
                .args(["--namespace", "k8s.io"])
                .args(args),
        )
    }

    fn start_containerd(&mut self) {
        let wrapper = repo().join("tests/image/runc-oom-clamp.sh");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}/bin"
    conf_dir = "{cni}/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      BinaryName = "{wrapper}"
      SystemdCgroup = false
"#,
            root = self.path("containerd/root").display(),
            state = self.path("containerd/state").display(),
            socket = self.socket().display(),
            cni = self.path("cni").display(),
            wrapper = wrapper.display(),
        );
        std::fs::create_dir_all(self.path("containerd")).unwrap();
        std::fs::write(self.path("containerd/config.toml"), config).unwrap();
        let log = std::fs::File::create(self.path("containerd.log")).unwrap();
        let child = self
            .netns
            .nsenter()
            .arg("containerd")
            .arg("--config")
            .arg(self.path("containerd/config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        self.containerd = Some(child);
        let started = Instant::now();
        while !Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "containerd did not answer within 30 s:\n{}",
                self.log("containerd.log")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn start_kubelet(&mut self, kubelet: &Path, kubeconfig: &Path, cgroup_root: &str) {
        // No eviction (a shared machine's disk is what it is) and no image garbage collection:
        // the images were imported, and nothing could pull them again.
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
podLogsDir: {logs}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
readOnlyPort: 0
healthzPort: 0
resolvConf: ""
evictionHard: {{memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%"}}
localStorageCapacityIsolation: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
"#,
            socket = self.socket().display(),
            logs = self.path("pod-logs").display(),
        );
        std::fs::write(self.path("kubelet.yaml"), config).unwrap();
        let log = std::fs::File::create(self.path("kubelet.log")).unwrap();
        let child = self
            .netns
            .nsenter()
            .arg(kubelet)
            .arg("--config")
            .arg(self.path("kubelet.yaml"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--root-dir")
            .arg(self.path("kubelet"))
            .arg("--cert-dir")
            .arg(self.path("kubelet-pki"))
            .args(["--hostname-override", &self.name, "--node-ip", NODE_IP])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kubelet");
        self.kubelet = Some(child);
    }

    pub fn log(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.path(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Everything the containers of pod `namespace/pod` wrote, every restart, in order.
    pub fn container_log(&self, namespace: &str, pod: &str) -> String {
        let prefix = format!("{namespace}_{pod}_");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(self.path("pod-logs"))
            .into_iter()
            .flatten()
        {
            let entry = entry.unwrap();
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            for container in std::fs::read_dir(entry.path()).unwrap() {
                for file in std::fs::read_dir(container.unwrap().path()).unwrap() {
                    files.push(file.unwrap().path());
                }
            }
        }
        files.sort_by_key(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok());
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap_or_default())
            .collect()
    }

    /// Whether something listens on TCP `port` in the node's network namespace.
    pub fn listening(&self, port: u16) -> bool {
        let table = self.netns.sh("cat /proc/net/tcp /proc/net/tcp6");
        let hex = format!(":{port:04X} ");
        table.lines().any(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|a| format!("{a} ").ends_with(&hex))
                && l.split_whitespace().nth(3) == Some("0A")
        })
    }
}

impl Drop for KubeletNode {
    fn drop(&mut self) {
        for child in [self.kubelet.take(), self.containerd.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        // Whatever containerd's shims and the pods left: every process in the node's cgroups,
        // and the shims, whose command line names the node's socket.
        let socket = self.socket().display().to_string();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let pid = entry.file_name().to_string_lossy().to_string();
            if !pid.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cgroups = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
            let root = self
                .netns
                .cgroups
                .root
                .file_name()
                .unwrap()
                .to_string_lossy();
            let ours = String::from_utf8_lossy(&cmdline).contains(&socket)
                || cgroups.lines().any(|l| l.contains(&format!(":/{root}/")));
            if ours {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        // kubelet's volume mounts and containerd's root filesystems, innermost first.
        let dir = self.dir.path().display().to_string();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mounts: Vec<&str> = mountinfo
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .filter(|m| m.starts_with(&dir))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in mounts {
            let _ = Command::new("umount").args(["-l", mount]).status();
        }
        for root in &self.v1_roots {
            remove_tree(root);
        }
        // The v2 tree goes with `netns` (NodeCgroups' drop).
    }
}

/// Remove a cgroup directory and every one below it, leaves first.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Fail with what kubelet and containerd said, after `what` did not happen.
pub fn node_failure(node: &KubeletNode, what: &str) -> String {
    format!(
        "{what}\n--- kubelet\n{}\n--- containerd\n{}",
        node.log("kubelet.log"),
        node.log("containerd.log")
    )
}

//! kube-proxy, built from the pinned Kubernetes module with kube-scheduler and
//! kube-controller-manager (`scripts/local-cluster.sh build-controllers`), run as root inside a
//! simulated node's network namespace, never the machine's own: the rules it writes (iptables
//! mode) live and die with that namespace. It is that node (`--hostname-override`) and reaches
//! the API server through an [`ApiRelay`] in the same namespace, so the test cluster's
//! kubeconfig serves as it is. Killed on drop, and by a watcher if the test process dies first.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::agent_node::ApiRelay;
use super::controllers::{controllers_bin_dir, kill_when_gone};

/// How long kube-proxy may take to sync its rules once and say so on /healthz.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Its health endpoint, on loopback inside the node's own namespace (so a fixed port is free).
const HEALTHZ: &str = "127.0.0.1:10256";

pub struct KubeProxy {
    process: Option<Child>,
    watcher: Option<Child>,
    netns: PathBuf,
    dir: tempfile::TempDir,
    // Dropped after kube-proxy: it keeps talking to the API server until killed.
    _relay: ApiRelay,
}

impl KubeProxy {
    /// Start kube-proxy as Node `node` in the network namespace `netns` (`/proc/PID/ns/net`)
    /// against the cluster of `kubeconfig`, and wait until it has synced its rules once.
    pub fn start(kubeconfig: &Path, netns: &Path, node: &str) -> anyhow::Result<KubeProxy> {
        let binary = controllers_bin_dir()?.join("kube-proxy");
        let relay = ApiRelay::start(kubeconfig, Some(netns));
        let dir = tempfile::tempdir()?;
        let log = std::fs::File::create(dir.path().join("kube-proxy.log"))?;
        let process = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .arg("--")
            .arg(&binary)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--hostname-override={node}"))
            .arg("--proxy-mode=iptables")
            .arg(format!("--healthz-bind-address={HEALTHZ}"))
            .arg("--metrics-bind-address=127.0.0.1:10249")
            // NodePorts on the Node's own address only, not on every local one.
            .arg("--nodeport-addresses=primary")
            // The conntrack table's size is the machine's, which only its own namespace sets.
            .arg("--conntrack-max-per-core=0")
            .arg("--oom-score-adj=0")
            .arg("--v=2")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {} in {}", binary.display(), netns.display()))?;
        let watcher =
            kill_when_gone(&[process.id()]).context("cannot start kube-proxy's watcher")?;
        let mut proxy = KubeProxy {
            process: Some(process),
            watcher: Some(watcher),
            netns: netns.to_path_buf(),
            dir,
            _relay: relay,
        };
        proxy.wait_healthy()?;
        Ok(proxy)
    }

    /// A command run inside kube-proxy's namespace.
    pub fn nsenter(&self) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.netns.display()))
            .arg("--");
        command
    }

    /// Its namespace's nat table as `iptables-save` prints it.
    pub fn nat_rules(&self) -> String {
        let out = self
            .nsenter()
            .args(["iptables-save", "-t", "nat"])
            .output()
            .expect("run iptables-save in kube-proxy's namespace");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("kube-proxy.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// /healthz answers 200 once the rules were synced (with the Services and EndpointSlices
    /// it had listed by then); fails early, with the log's end, if kube-proxy exits.
    fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let url = format!("http://{HEALTHZ}/healthz");
        loop {
            let exited = self
                .process
                .as_mut()
                .and_then(|p| p.try_wait().ok().flatten());
            if let Some(status) = exited {
                bail!(
                    "kube-proxy exited during start-up ({status}); its log:\n{}",
                    self.log_tail(30)
                );
            }
            let ok = self
                .nsenter()
                .args(["curl", "-fsS", "--max-time", "2", &url])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "kube-proxy did not answer {url} within {}s; its log:\n{}",
                    START_TIMEOUT.as_secs(),
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        for child in [self.process.take(), self.watcher.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

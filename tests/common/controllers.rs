//! kube-scheduler and kube-controller-manager, built from the pinned Kubernetes module
//! (`scripts/local-cluster.sh build-controllers`, cached by the pin, with kube-proxy) and run as they are against
//! a control plane's kubeconfig, with `--leader-elect=false`. Together with Node objects whose
//! status a test writes as a kubelet would (`nodes.rs`), pods come from real controllers and are
//! bound by the real scheduler; no kubelet runs, so bound pods stay Pending.
//!
//! Which controllers run: those that make pods (StatefulSet, Deployment, ReplicaSet) and the
//! node lifecycle controller, which removes the `node.kubernetes.io/not-ready` taint the API
//! server puts on every new Node once its status says Ready (and would taint it again if its
//! heartbeat stopped: `nodes.rs` renews the Node's Lease as a kubelet does). Not run: the taint
//! eviction controller and the pod garbage collector, which delete pods of nodes that look
//! gone, and the garbage collector (deleting a workload leaves its pods).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::ports::free_port;

/// The controllers kube-controller-manager runs unless told otherwise (see the file's comment).
pub const DEFAULT_CONTROLLERS: &[&str] = &[
    "statefulset-controller",
    "deployment-controller",
    "replicaset-controller",
    "node-lifecycle-controller",
    // EndpointSlices of Services in front of pods whose ports differ (scheduling::service).
    "endpointslice-controller",
];

/// How long a component may take to answer /healthz after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How much of a component's log an error repeats.
const LOG_TAIL: usize = 30;

/// What to start.
#[derive(Clone, Debug)]
pub struct ControllersOptions {
    /// kube-controller-manager's `--controllers`.
    pub controllers: Vec<String>,
    /// More flags for kube-scheduler (e.g. `--config FILE` with a KubeSchedulerConfiguration).
    pub scheduler_args: Vec<String>,
    /// More flags for kube-controller-manager.
    pub controller_manager_args: Vec<String>,
}

impl Default for ControllersOptions {
    fn default() -> Self {
        ControllersOptions {
            controllers: DEFAULT_CONTROLLERS.iter().map(|c| c.to_string()).collect(),
            scheduler_args: Vec::new(),
            controller_manager_args: Vec::new(),
        }
    }
}

/// kube-scheduler and kube-controller-manager running against one cluster; both are killed
/// when this is dropped (and by a watcher process if the test process dies first).
pub struct Controllers {
    scheduler: Option<Child>,
    controller_manager: Option<Child>,
    watcher: Option<Child>,
    /// Their logs; removed on drop unless a test is failing.
    pub dir: PathBuf,
}

/// The directory holding both binaries and kube-proxy, built on first use (several minutes on 2 cores; the
/// script serialises concurrent builds and caches the result by the Kubernetes pin).
pub fn controllers_bin_dir() -> anyhow::Result<PathBuf> {
    let script = repo_root().join("scripts/local-cluster.sh");
    let output = Command::new(&script)
        .arg("build-controllers")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "`scripts/local-cluster.sh build-controllers` failed ({}): kube-scheduler, \
             kube-controller-manager and kube-proxy could not be built (its output is above)",
            output.status
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout.lines().map(str::trim).rfind(|l| !l.is_empty());
    Ok(PathBuf::from(dir.context(
        "`scripts/local-cluster.sh build-controllers` printed no directory",
    )?))
}

impl Controllers {
    /// Start both with the default controllers.
    pub fn start(kubeconfig: &Path) -> anyhow::Result<Controllers> {
        Controllers::start_with(kubeconfig, &ControllersOptions::default())
    }

    /// Build (or find) both, start them against `kubeconfig` (its current context, which needs
    /// the rights of a cluster admin) and wait until both answer /healthz.
    pub fn start_with(
        kubeconfig: &Path,
        options: &ControllersOptions,
    ) -> anyhow::Result<Controllers> {
        let bin = controllers_bin_dir()?;
        let dir = repo_root().join("target").join(format!(
            "controllers-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let mut controllers = Controllers {
            scheduler: None,
            controller_manager: None,
            watcher: None,
            dir,
        };
        let kubeconfig = kubeconfig
            .to_str()
            .context("kubeconfig path is not UTF-8")?;
        let common = |port: u16| {
            vec![
                format!("--kubeconfig={kubeconfig}"),
                // Also for the delegated authentication and authorization of their own
                // endpoints, so neither looks for an in-cluster configuration.
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--leader-elect=false".to_string(),
                "--bind-address=127.0.0.1".to_string(),
                // Not the default ports: other test runs on this machine may have theirs.
                format!("--secure-port={port}"),
                "--v=2".to_string(),
            ]
        };
        let scheduler_port = free_port();
        let mut args = common(scheduler_port);
        args.extend(options.scheduler_args.iter().cloned());
        let scheduler = controllers.spawn(&bin.join("kube-scheduler"), &args, "kube-scheduler")?;
        controllers.scheduler = Some(scheduler);

        let manager_port = free_port();
        let mut args = common(manager_port);
        args.push(format!("--controllers={}", options.controllers.join(",")));
        args.extend(options.controller_manager_args.iter().cloned());
        let manager = controllers.spawn(
            &bin.join("kube-controller-manager"),
            &args,
            "kube-controller-manager",
        )?;
        controllers.controller_manager = Some(manager);
        controllers.watch_owner()?;

        controllers.wait_healthy("kube-scheduler", scheduler_port)?;
        controllers.wait_healthy("kube-controller-manager", manager_port)?;
        Ok(controllers)
    }

    fn spawn(&self, binary: &Path, args: &[String], name: &str) -> anyhow::Result<Child> {
        let log = std::fs::File::create(self.log_path(name))?;
        Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))
    }

    /// A process that kills both if this test process goes away without dropping us.
    fn watch_owner(&mut self) -> anyhow::Result<()> {
        let pids: Vec<u32> = [&self.scheduler, &self.controller_manager]
            .into_iter()
            .flatten()
            .map(Child::id)
            .collect();
        let watcher = kill_when_gone(&pids)
            .context("cannot start the watcher of kube-scheduler and kube-controller-manager")?;
        self.watcher = Some(watcher);
        Ok(())
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// The last lines of a component's log (`kube-scheduler`, `kube-controller-manager`).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(name)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The whole log of a component.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    fn child(&mut self, name: &str) -> Option<&mut Child> {
        match name {
            "kube-scheduler" => self.scheduler.as_mut(),
            _ => self.controller_manager.as_mut(),
        }
    }

    /// Poll `https://127.0.0.1:port/healthz` (curl, as local-cluster.sh does) until it says ok,
    /// failing early, with the log's end, if the process exits.
    fn wait_healthy(&mut self, name: &str, port: u16) -> anyhow::Result<()> {
        let started = Instant::now();
        let url = format!("https://127.0.0.1:{port}/healthz");
        loop {
            if let Some(status) = self.child(name).and_then(|c| c.try_wait().ok().flatten()) {
                bail!(
                    "{name} exited during start-up ({status}); log {}:\n{}",
                    self.log_path(name).display(),
                    self.log_tail(name, LOG_TAIL)
                );
            }
            let ok = Command::new("curl")
                .args(["-fsSk", "--max-time", "2", &url])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "{name} did not answer {url} within {}s; log {}:\n{}",
                    START_TIMEOUT.as_secs(),
                    self.log_path(name).display(),
                    self.log_tail(name, LOG_TAIL)
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Kill both (and the watcher). Drop does it too.
    pub fn stop(&mut self) {
        for child in [
            self.scheduler.take(),
            self.controller_manager.take(),
            self.watcher.take(),
        ]
        .into_iter()
        .flatten()
        {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "kube-scheduler and kube-controller-manager logs kept in {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A process that SIGKILLs `pids` once this test process is gone, however it ended; kill it
/// once they are stopped.
pub fn kill_when_gone(pids: &[u32]) -> std::io::Result<Child> {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let script = format!(
        "while kill -0 {} 2>/dev/null; do sleep 1; done; kill -9 {} 2>/dev/null",
        std::process::id(),
        pids.join(" ")
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// The scheduler's reason for a node where another pod declares one of the pod's host ports
/// (its NodePorts filter): `0/3 nodes are available: 3 node(s) didn't have free ports for the
/// requested pod ports. ...`
pub const NO_FREE_PORTS: &str = "didn't have free ports for the requested pod ports";

/// The scheduler's message for a pod it could not place (its PodScheduled condition), if
/// that is where the pod stands. A benchmark counts the pods Pending for their ports by
/// whether this contains [`NO_FREE_PORTS`].
pub fn unschedulable(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.message.clone())
}

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

//! `sync --watch` as a process, as a Deployment's pod runs it: probes on a free loopback port,
//! its log in a file, ready before `start` returns, killed when dropped.
//!
//! A watcher of every namespace (`-A`) syncs every object it sees, other tests' too: start one
//! only on a control plane of the test's own, never on the shared e2e cluster.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{ports, probe_http};

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");
/// How long a start may take, generous: the machine is shared with other builds.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long a stop may take after SIGTERM: the current round ends, the Lease is released.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

pub struct WatcherProcess {
    /// Its name in messages and its log file's; its pod name where it runs as one.
    pub name: String,
    child: Child,
    probes: u16,
    log: PathBuf,
}

impl WatcherProcess {
    /// `sync --watch ARGS` with the credentials of `kubeconfig`, its log in `dir/NAME.log`.
    pub fn start(kubeconfig: &Path, name: &str, args: &[&str], dir: &Path) -> WatcherProcess {
        Self::spawn(kubeconfig, name, args, dir, &[])
    }

    /// As [`start`](Self::start), as pod `name` of `namespace` (`POD_NAME`, `POD_NAMESPACE`):
    /// its identity in the Lease and in the Events it writes.
    pub fn start_as_pod(
        kubeconfig: &Path,
        namespace: &str,
        name: &str,
        args: &[&str],
        dir: &Path,
    ) -> WatcherProcess {
        let pod = [("POD_NAMESPACE", namespace), ("POD_NAME", name)];
        Self::spawn(kubeconfig, name, args, dir, &pod)
    }

    fn spawn(
        kubeconfig: &Path,
        name: &str,
        args: &[&str],
        dir: &Path,
        env: &[(&str, &str)],
    ) -> WatcherProcess {
        let probes = ports::free_port();
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(BIN)
            .args(["sync", "--watch"])
            .args(args)
            .args(["--probe-address", &format!("127.0.0.1:{probes}")])
            .env("KUBECONFIG", kubeconfig)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("spawn a watcher");
        let watcher = WatcherProcess {
            name: name.to_string(),
            child,
            probes,
            log,
        };
        watcher.wait_ready();
        watcher
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        while probe_http::status(self.probes, "/readyz") != Some(200) {
            assert!(
                started.elapsed() < READY_WITHIN,
                "{} never got ready:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        assert_eq!(probe_http::status(self.probes, "/healthz"), Some(200));
    }

    /// The whole HTTP answer to `GET path` on its probe port, if it answers.
    pub fn get(&self, path: &str) -> Option<String> {
        probe_http::get(self.probes, path)
    }

    /// The sum of every sample of a metric family (`None` when it has no sample).
    pub fn metric(&self, family: &str) -> Option<f64> {
        probe_http::metric_sum(&self.get("/metrics")?, family)
    }

    pub fn leading(&self) -> bool {
        self.metric("portalloc_leader") == Some(1.0)
    }

    /// Syncs it made, whatever their result.
    pub fn syncs(&self) -> f64 {
        self.metric("portalloc_syncs_total").unwrap_or(0.0)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM; returns at once.
    pub fn signal_term(&self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// Until it exits (after [`signal_term`](Self::signal_term)): its exit code.
    pub fn wait(mut self) -> Option<i32> {
        self.wait_exit()
    }

    /// SIGTERM, then its exit code and what it logged.
    pub fn terminate(mut self) -> (Option<i32>, String) {
        self.signal_term();
        let code = self.wait_exit();
        (code, self.log())
    }

    fn wait_exit(&mut self) -> Option<i32> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                started.elapsed() < EXIT_WITHIN,
                "{} still running {EXIT_WITHIN:?} after SIGTERM",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill_9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for WatcherProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

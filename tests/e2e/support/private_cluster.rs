//! A control plane of a test's own, for tests that must not share the common one: restarting the
//! API server, a cluster without the CRDs, or `repair` and `sync -A` over every object.
//!
//! Started with `scripts/local-cluster.sh up` in its own directory and stopped with `down` when the
//! handle drops; the script's owner watcher also stops it if the test process dies.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::cli::{self, Run};

pub struct PrivateCluster {
    dir: PathBuf,
    pub kubeconfig: PathBuf,
}

impl PrivateCluster {
    /// A fresh control plane named after the test, or `None` when the tests run against a
    /// cluster given by the user (`PORTALLOC_TEST_REUSE_CLUSTER=1`): then there may be no local
    /// binaries to start another one with.
    pub fn start(name: &str, install_crds: bool) -> Option<PrivateCluster> {
        // The shared cluster first: its `up` builds (or finds) the binaries this one reuses.
        if !super::cluster().local {
            eprintln!(
                "{name}: skipped, it needs a control plane of its own (not with a reused cluster)"
            );
            return None;
        }
        let dir = super::repo_root()
            .join("target")
            .join(format!("e2e-{name}-{}", std::process::id()));
        let output = script(&dir, &["up"]);
        let kubeconfig = PathBuf::from(output.lines().last().expect("kubeconfig path").trim());
        let cluster = PrivateCluster { dir, kubeconfig };
        if install_crds {
            let run = cluster.run(&["install", "--timeout", "60s"]);
            assert!(run.ok(), "install on {name}: {run}");
        }
        Some(cluster)
    }

    /// Stop kube-apiserver and etcd, keeping their data, certs and ports.
    pub fn stop(&self, kill: bool) {
        script(
            &self.dir,
            if kill { &["stop", "--kill"] } else { &["stop"] },
        );
    }

    /// Start them again where `stop` left them.
    pub fn resume(&self) {
        script(&self.dir, &["start"]);
    }

    pub fn run(&self, args: &[&str]) -> Run {
        cli::run_with(&self.kubeconfig, args)
    }

    pub async fn client(&self) -> Client {
        client_from(&self.kubeconfig, None).await
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new(super::repo_root().join("scripts/local-cluster.sh"))
            .arg("down")
            .env("PORTALLOC_CLUSTER_DIR", &self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Run `scripts/local-cluster.sh` on `dir`; its stdout. Panics with the log on failure.
fn script(dir: &Path, args: &[&str]) -> String {
    let output = Command::new(super::repo_root().join("scripts/local-cluster.sh"))
        .args(args)
        .env("PORTALLOC_CLUSTER_DIR", dir)
        .env(
            "PORTALLOC_CLUSTER_OWNER_PID",
            std::process::id().to_string(),
        )
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/local-cluster.sh");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "local-cluster.sh {args:?} failed ({}): {stdout}",
        output.status
    );
    stdout
}

/// A client for a kubeconfig file and context.
pub async fn client_from(kubeconfig: &Path, context: Option<&str>) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig reads");
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .expect("kubeconfig is valid");
    Client::try_from(config).expect("client builds")
}

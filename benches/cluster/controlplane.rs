//! A real control plane for the benchmark, started through `scripts/local-cluster.sh` exactly as
//! the end-to-end tests do: its own state directory, and this process's PID as the owner, so the
//! servers stop by themselves if the benchmark dies. `stop` (also run on drop) stops them at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli;

pub struct ControlPlane {
    dir: PathBuf,
    pub kubeconfig: PathBuf,
    stopped: bool,
}

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn script() -> PathBuf {
    repo_root().join("scripts/local-cluster.sh")
}

impl ControlPlane {
    /// `local-cluster.sh up` (building kube-apiserver and etcd on first use), then the CRDs.
    pub fn start() -> anyhow::Result<ControlPlane> {
        let dir = repo_root()
            .join("target")
            .join(format!("bench-cluster-{}", std::process::id()));
        let output = Command::new(script())
            .arg("up")
            .env("PORTALLOC_CLUSTER_DIR", &dir)
            .env(
                "PORTALLOC_CLUSTER_OWNER_PID",
                std::process::id().to_string(),
            )
            .stderr(Stdio::inherit())
            .output()
            .context("cannot run scripts/local-cluster.sh")?;
        let mut plane = ControlPlane {
            dir,
            kubeconfig: PathBuf::new(),
            stopped: false,
        };
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!(
                "scripts/local-cluster.sh up failed ({}): {stdout}",
                output.status
            );
        }
        plane.kubeconfig = PathBuf::from(
            stdout
                .lines()
                .last()
                .context("local-cluster.sh printed nothing")?
                .trim(),
        );
        let installed = cli::run(&plane.kubeconfig, &["install", "--timeout", "60s"]);
        if !installed.status.success() {
            bail!(
                "installing the CRDs failed: {}",
                String::from_utf8_lossy(&installed.stderr)
            );
        }
        Ok(plane)
    }

    /// `local-cluster.sh down` for this state directory: stops exactly what `start` started.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let _ = Command::new(script())
            .arg("down")
            .env("PORTALLOC_CLUSTER_DIR", &self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status();
    }

    /// A new admin client with its own connection pool: one per simulated client.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    pub async fn clients(&self, count: usize) -> anyhow::Result<Vec<Client>> {
        let mut clients = Vec::with_capacity(count);
        for _ in 0..count {
            clients.push(self.client().await?);
        }
        Ok(clients)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

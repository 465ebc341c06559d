//! A control plane of a test's own, for tests that must not share the common one: restarting the
//! API server, a cluster without the CRDs, or `repair` and `sync -A` over every object.
//!
//! Started and stopped by the shared helper (`control_plane.rs`): `down` when the handle drops,
//! and the script's owner watcher also stops it if the test process dies.

use std::path::{Path, PathBuf};

use kube::Client;

use super::cli::{self, Run};
use super::control_plane::{self, ControlPlane};

pub struct PrivateCluster {
    plane: ControlPlane,
    pub kubeconfig: PathBuf,
}

impl PrivateCluster {
    /// A fresh control plane named after the test, or `None` when the tests run against a
    /// cluster given by the user (`PORTALLOC_TEST_REUSE_CLUSTER=1`): then there may be no local
    /// binaries to start another one with.
    pub fn start(name: &str, install_crds: bool) -> Option<PrivateCluster> {
        Self::start_with(name, install_crds, &[])
    }

    /// As [`start`](Self::start), with extra kube-apiserver flags.
    pub fn start_with(
        name: &str,
        install_crds: bool,
        apiserver_flags: &[&str],
    ) -> Option<PrivateCluster> {
        // The shared cluster first: its `up` builds (or finds) the binaries this one reuses.
        if !super::cluster().local {
            eprintln!(
                "{name}: skipped, it needs a control plane of its own (not with a reused cluster)"
            );
            return None;
        }
        let plane = ControlPlane::up_with(&format!("e2e-{name}"), apiserver_flags)
            .unwrap_or_else(|e| panic!("control plane for {name}: {e:#}"));
        if install_crds {
            control_plane::install_crds(&plane.kubeconfig)
                .unwrap_or_else(|e| panic!("install on {name}: {e:#}"));
        }
        let kubeconfig = plane.kubeconfig.clone();
        Some(PrivateCluster { plane, kubeconfig })
    }

    /// Stop kube-apiserver and etcd, keeping their data, certs and ports.
    pub fn stop(&self, kill: bool) {
        self.plane.stop(kill).unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Start them again where `stop` left them.
    pub fn resume(&self) {
        self.plane.start().unwrap_or_else(|e| panic!("{e:#}"));
    }

    pub fn run(&self, args: &[&str]) -> Run {
        cli::run_with(&self.kubeconfig, args)
    }

    pub async fn client(&self) -> Client {
        self.plane
            .client()
            .await
            .expect("client of a private cluster")
    }
}

/// A client for a kubeconfig file and context.
pub async fn client_from(kubeconfig: &Path, context: Option<&str>) -> Client {
    control_plane::client_from(kubeconfig, context)
        .await
        .expect("client for a kubeconfig")
}

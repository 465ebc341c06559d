//! The pod webhook as a process: `kubectl-portalloc sync --watch` of an empty namespace (so
//! only admissions sync), serving `--webhook-address` on a free loopback port and registered
//! by URL, returned once the API server's configuration points at it. One per cluster at a
//! time: the configuration (`portalloc`) is the cluster's only one. Include this file with
//! `#[path]`, as `control_plane.rs`.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};

// Its own copy of the one source, so every crate including this file builds as it is.
#[allow(clippy::duplicate_mod)]
#[path = "ports.rs"]
mod ports;
use ports::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");
/// How long the webhook may take to register itself.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Start the webhook on the cluster of `kubeconfig` (`client` is a client of it), keeping its
/// CA Secret in `namespace` (which must exist; `<namespace>-quiet` is created for its watch).
/// The caller kills and waits for the child.
// The child is returned to the caller, which kills and waits for it; on an error it is
// killed here.
#[allow(clippy::zombie_processes)]
pub async fn start_webhook(
    kubeconfig: &Path,
    client: &Client,
    namespace: &str,
) -> anyhow::Result<Child> {
    let port = free_port();
    let quiet = format!("{namespace}-quiet");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let object: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": quiet}}))?;
    if namespaces.get_opt(&quiet).await?.is_none() {
        namespaces
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("create namespace {quiet}"))?;
    }
    let mut child = Command::new(BIN)
        .args(["sync", "--watch", "-n", &quiet])
        .args(["--webhook-address", &format!("127.0.0.1:{port}")])
        .args(["--webhook-url", &format!("https://127.0.0.1:{port}")])
        .args(["--webhook-namespace", namespace])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start the pod webhook (kubectl-portalloc sync --watch --webhook-address)")?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let url = format!("https://127.0.0.1:{port}/mutate");
    let started = Instant::now();
    loop {
        let registered = match api.get_opt("portalloc").await {
            Ok(configuration) => {
                configuration.and_then(|c| c.webhooks?.into_iter().next()?.client_config.url)
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).context("read the MutatingWebhookConfiguration portalloc");
            }
        };
        if registered.as_deref() == Some(url.as_str()) {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!("the pod webhook exited before it registered ({status})");
        }
        if started.elapsed() > REGISTER_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the pod webhook never registered {url} within {}s",
                REGISTER_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

//! `sync --watch` as one process: the watcher ([`watch_as`]) with its probes and, when asked,
//! the pod webhook beside it, stopped by signals: the first stops it gracefully (syncs in
//! flight finish; the webhook drains), a second at once. Started in two steps
//! ([`WatcherProcess::prepare`], then [`WatcherProcess::serve_webhook`]) so that the command
//! line reads the webhook's flags between them.

use std::net::SocketAddr;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch::Receiver;

use super::{Metrics, Replica, WatchOptions, check_access, check_leader_access, watch_as};
use crate::k8s::KubeError;
use crate::k8s::allocate::Allocator;
use crate::k8s::leader::{LeaseRef, default_identity};
use crate::k8s::process::{Readiness, SignalError, listen_for_signals, serve_probes, signalled};
use crate::k8s::webhook::{StartError, WebhookOptions, WebhookServer, Withdrawn, start_webhook};

/// What `sync --watch` is asked to watch, and how it runs.
#[derive(Clone, Debug)]
pub struct WatcherSettings {
    /// `None`: every namespace.
    pub namespace: Option<String>,
    pub resync: Duration,
    pub concurrency: u16,
    /// Where to serve `/healthz`, `/readyz` and `/metrics`; `None`: nowhere.
    pub probe_address: Option<SocketAddr>,
    /// The Lease to hold while syncing (`--leader-elect`).
    pub lease: Option<LeaseRef>,
    /// The replica's name; `None`: [`default_identity`].
    pub identity: Option<String>,
}

/// Why `sync --watch` did not start.
#[derive(Debug, thiserror::Error)]
pub enum WatcherStartError {
    #[error(transparent)]
    Signals(#[from] SignalError),
    /// The rights the watcher needs, checked before it starts, or the API server unreachable.
    #[error(transparent)]
    Access(#[from] KubeError),
    #[error("cannot serve the probes on {address}: {error}")]
    Probes {
        address: SocketAddr,
        error: std::io::Error,
    },
}

/// The watcher and what runs beside it, started and not yet running.
pub struct WatcherProcess {
    client: Client,
    allocator: Allocator,
    replica: Replica,
    options: WatchOptions,
    readiness: Readiness,
    metrics: Metrics,
    signals: Receiver<u32>,
    webhook: Option<WebhookServer>,
}

impl WatcherProcess {
    /// Listen for signals, check the watcher's rights and serve its probes.
    pub async fn prepare(
        client: Client,
        allocator: Allocator,
        settings: WatcherSettings,
    ) -> Result<Self, WatcherStartError> {
        // Listening first: a SIGTERM during start-up must not kill the process half-registered.
        let signals = listen_for_signals()?;
        check_access(&client, settings.namespace.as_deref()).await?;
        if let Some(lease) = &settings.lease {
            check_leader_access(&client, lease).await?;
        }
        let replica = Replica {
            identity: settings.identity.unwrap_or_else(default_identity),
            lease: settings.lease,
        };
        let readiness = Readiness::default();
        let metrics = Metrics::default();
        if let Some(address) = settings.probe_address {
            let bound = serve_probes(address, readiness.clone(), metrics.clone())
                .await
                .map_err(|error| WatcherStartError::Probes { address, error })?;
            tracing::info!("serving /healthz, /readyz and /metrics on {bound}");
        }
        let options = WatchOptions {
            namespace: settings.namespace,
            resync: settings.resync,
            concurrency: settings.concurrency,
            pool_metrics: settings.probe_address.is_some(),
        };
        Ok(WatcherProcess {
            client,
            allocator,
            replica,
            options,
            readiness,
            metrics,
            signals,
            webhook: None,
        })
    }

    /// Start the pod webhook beside the watcher, sharing its allocator and metrics.
    pub async fn serve_webhook(&mut self, options: &WebhookOptions) -> Result<(), StartError> {
        let server = start_webhook(
            &self.client,
            options,
            self.allocator.clone(),
            self.metrics.clone(),
        )
        .await?;
        self.webhook = Some(server);
        Ok(())
    }

    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    pub fn options(&self) -> &WatchOptions {
        &self.options
    }

    /// Run until the signals stop it. `on_withdrawn` hears what became of the webhook's URL
    /// registration as soon as the webhook has drained.
    pub async fn run(self, on_withdrawn: impl FnOnce(Withdrawn)) {
        let (readiness, signals, webhook) = (self.readiness, self.signals, self.webhook);
        let watcher = watch_as(
            self.replica,
            self.client,
            self.allocator,
            self.options,
            readiness.clone(),
            self.metrics,
            signalled(signals.clone(), 1),
        );
        let first = signalled(signals.clone(), 1);
        let webhook = async {
            first.await;
            readiness.stop();
            if let Some(webhook) = webhook
                && let Some(withdrawn) = webhook.drain().await
            {
                on_withdrawn(withdrawn);
            }
        };
        tokio::select! {
            _ = async { tokio::join!(watcher, webhook) } => {}
            _ = signalled(signals, 2) => tracing::warn!("second signal: stopping now"),
        }
    }
}

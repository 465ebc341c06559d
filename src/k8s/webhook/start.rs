//! Starting the webhook from its options: its certificate, its endpoint, then its registration
//! (last, so the API server never calls an endpoint that is not listening yet), and behind a
//! Service the upkeep that keeps both current.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::PodWebhook;
use super::certificates::{CertSlot, CertSource, CertificateError};
use super::registration::{ClientConfig, register_webhook};
use super::serve::{ServeError, WebhookServer, serve};
use super::upkeep::keep_current;
use crate::k8s::allocate::Allocator;
use crate::k8s::error::KubeError;
use crate::k8s::process::Metrics;
use crate::k8s::record::{ShardVersions, keep_copies_current};

/// What the webhook is started with (`sync --watch`'s webhook flags, parsed).
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    /// Where it listens (HTTPS).
    pub address: SocketAddr,
    /// The namespace of its Service and of the CA Secret.
    pub namespace: String,
    /// The Service in front of it (port 443).
    pub service: String,
    /// Registered at this URL instead of the Service: a webhook running outside the cluster.
    pub url: Option<WebhookUrl>,
    /// Serve the certificate mounted here and leave the caBundle to cert-manager.
    pub cert_dir: Option<PathBuf>,
    /// After SIGTERM, how long it keeps answering while the Service drops this replica.
    pub shutdown_delay: Duration,
}

/// A base URL `https://HOST[:PORT][/...]` and its host (an IPv6 address without brackets),
/// which the serving certificate must name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookUrl {
    url: String,
    host: String,
}

impl WebhookUrl {
    /// `None` unless `url` is `https://` with a host.
    pub fn parse(url: &str) -> Option<WebhookUrl> {
        let rest = url.strip_prefix("https://")?;
        let authority = rest.split('/').next()?;
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next()?,
            None => authority.split(':').next()?,
        };
        (!host.is_empty()).then(|| WebhookUrl {
            url: url.to_string(),
            host: host.to_string(),
        })
    }
}

/// Why the webhook did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No certificate could be had from its source.
    #[error(transparent)]
    Certificate(CertificateError),
    /// The certificate or key cannot be served.
    #[error(transparent)]
    Unusable(CertificateError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Register(#[from] KubeError),
}

impl WebhookOptions {
    /// The certificate's source: the mounted directory, or the CA Secret signing for every
    /// name the API server may dial.
    fn cert_source(&self) -> CertSource {
        if let Some(dir) = &self.cert_dir {
            return CertSource::Dir(dir.clone());
        }
        let (ns, service) = (&self.namespace, &self.service);
        let mut hosts: Vec<String> = vec![
            format!("{service}.{ns}.svc"),
            format!("{service}.{ns}.svc.cluster.local"),
            format!("{service}.{ns}"),
            service.clone(),
        ];
        hosts.extend(self.url.as_ref().map(|url| url.host.clone()));
        CertSource::Secret {
            namespace: ns.clone(),
            hosts,
        }
    }

    fn client_config(&self) -> ClientConfig {
        match &self.url {
            Some(url) => ClientConfig::Url(url.url.clone()),
            None => ClientConfig::Service {
                namespace: self.namespace.clone(),
                name: self.service.clone(),
                port: 443,
            },
        }
    }
}

/// Start the webhook: its certificate, its endpoint, then its registration.
pub async fn start_webhook(
    client: &kube::Client,
    options: &WebhookOptions,
    allocator: Allocator,
    metrics: Metrics,
) -> Result<WebhookServer, StartError> {
    let source = options.cert_source();
    let pems = source.load(client).await.map_err(StartError::Certificate)?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let slot = CertSlot::new(provider.clone(), &pems).map_err(StartError::Unusable)?;
    let slot = Arc::new(slot);
    let versions = ShardVersions::default();
    let shard_watch = tokio::spawn(keep_copies_current(
        client.clone(),
        allocator.shard_copies().clone(),
        versions.clone(),
        metrics.clone(),
    ));
    let webhook = PodWebhook::new(client.clone(), allocator, metrics, versions);
    let (mut server, bound) = match serve(options.address, provider, slot.clone(), webhook).await {
        Ok(served) => served,
        Err(e) => {
            shard_watch.abort();
            return Err(e.into());
        }
    };
    server.shard_watch = Some(shard_watch);
    let config = options.client_config();
    register_webhook(client, pems.ca.as_deref(), &config).await?;
    if options.url.is_some() {
        // Out of the cluster nothing else answers for it: withdrawn when this process stops.
        server.registration = Some((client.clone(), config));
    } else {
        // Behind a Service, readiness decides who is called: give the endpoints time to drop
        // this replica at shutdown, and keep the registration right while it runs. Out of the
        // cluster (a URL) this process is the only one called: it does neither, so it never
        // takes the configuration back from a replica in the cluster (and at shutdown it
        // removes the registration only while it still calls this URL).
        server.delay = options.shutdown_delay;
        server.keeper = Some(tokio::spawn(keep_current(
            client.clone(),
            source,
            slot,
            config,
        )));
    }
    tracing::info!("serving the pod webhook on {bound} (POST /mutate)");
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::WebhookUrl;

    #[test]
    fn a_url_gives_its_host_without_port_path_or_brackets() {
        let host = |url: &str| WebhookUrl::parse(url).map(|u| u.host);
        assert_eq!(
            host("https://example.com:9443/x").as_deref(),
            Some("example.com")
        );
        assert_eq!(host("https://10.0.0.1").as_deref(), Some("10.0.0.1"));
        assert_eq!(host("https://[::1]:9443").as_deref(), Some("::1"));
        assert_eq!(host("http://example.com"), None);
        assert_eq!(host("https://:9443"), None);
    }
}

//! The pod webhook's HTTPS endpoint for `sync --watch --webhook-address`: `POST /mutate` takes
//! an AdmissionReview and answers with [`k8s::PodWebhook`]'s decision. HTTP/1.1 over rustls
//! (ring), the stack kube's client already links.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::k8s::{self, Allocator, ClientConfig, Metrics, PodWebhook};

use super::{CliError, Exit};

/// `sync --watch` flags of the pod webhook.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct WebhookArgs {
    /// With --watch: serve the pod webhook (HTTPS) on this address, e.g. 0.0.0.0:9443. Pods
    /// labelled portalloc.dev/allocation=NAME get their ports as env vars at creation.
    #[arg(long, value_name = "HOST:PORT", requires = "watch")]
    pub webhook_address: Option<SocketAddr>,
    /// Register the webhook at this base URL (https://HOST:PORT) instead of the Service, for a
    /// webhook running outside the cluster.
    #[arg(long, value_name = "URL", requires = "webhook_address")]
    pub webhook_url: Option<String>,
    /// The namespace of the webhook's Service and CA Secret (in a pod: its own namespace).
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "POD_NAMESPACE",
        default_value = "portalloc-system"
    )]
    pub webhook_namespace: String,
    /// The Service in front of the webhook (port 443).
    #[arg(long, value_name = "NAME", default_value = "portalloc-webhook")]
    pub webhook_service: String,
    /// Serve the certificate in this directory (tls.crt, tls.key; e.g. cert-manager's Secret
    /// mounted) and leave the caBundle to cert-manager's CA injector, instead of the CA Secret.
    #[arg(long, value_name = "DIR", requires = "webhook_address")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,
}

/// Start the webhook if asked: its certificate, its endpoint, then its registration (last, so
/// the API server never calls an endpoint that is not listening yet).
pub async fn start(
    client: &kube::Client,
    args: &WebhookArgs,
    allocator: Allocator,
    metrics: Metrics,
) -> anyhow::Result<()> {
    let Some(address) = args.webhook_address else {
        return Ok(());
    };
    let url_host = match &args.webhook_url {
        Some(url) => Some(host_of(url).ok_or_else(|| {
            CliError::new(
                Exit::Usage,
                format!("--webhook-url {url}: expected https://HOST[:PORT]"),
            )
        })?),
        None => None,
    };
    let (ns, service) = (&args.webhook_namespace, &args.webhook_service);
    let (cert_pem, key_pem, ca_pem) = match &args.webhook_cert_dir {
        Some(dir) => {
            let read = |file: &str| {
                std::fs::read_to_string(dir.join(file)).map_err(|e| {
                    CliError::new(
                        Exit::Usage,
                        format!("--webhook-cert-dir: {}: {e}", dir.join(file).display()),
                    )
                })
            };
            (read("tls.crt")?, read("tls.key")?, None)
        }
        None => {
            let mut hosts: Vec<String> = vec![
                format!("{service}.{ns}.svc"),
                format!("{service}.{ns}.svc.cluster.local"),
                format!("{service}.{ns}"),
                service.clone(),
            ];
            hosts.extend(url_host);
            let cert = k8s::serving_cert(client, ns, &hosts).await?;
            (cert.cert_pem, cert.key_pem, Some(cert.ca_pem))
        }
    };
    let webhook = PodWebhook::new(client.clone(), allocator, metrics);
    let bound = serve(address, &cert_pem, &key_pem, webhook)
        .await
        .map_err(|e| CliError::new(Exit::Usage, format!("--webhook-address {address}: {e}")))?;
    let config = match &args.webhook_url {
        Some(url) => ClientConfig::Url(url.clone()),
        None => ClientConfig::Service {
            namespace: ns.clone(),
            name: service.clone(),
            port: 443,
        },
    };
    k8s::register_webhook(client, ca_pem.as_deref(), &config).await?;
    tracing::info!("serving the pod webhook on {bound} (POST /mutate)");
    Ok(())
}

/// The host of `https://HOST[:PORT][/...]` (an IPv6 address without its brackets).
fn host_of(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.split(':').next()?,
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// Bind `address` now (a taken port is an error at start), then serve reviews until the
/// process ends.
pub async fn serve(
    address: SocketAddr,
    cert_pem: &str,
    key_pem: &str,
    webhook: PodWebhook,
) -> anyhow::Result<SocketAddr> {
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("the webhook's certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("the webhook's key: {e}"))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, webhook) = (acceptor.clone(), webhook.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |request| {
                    let webhook = webhook.clone();
                    async move { Ok::<_, hyper::Error>(answer(&webhook, request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
}

async fn answer(webhook: &PodWebhook, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            "content-type",
            "application/json".parse().expect("a header value"),
        );
        response
    };
    if request.method() != Method::POST || request.uri().path() != "/mutate" {
        return reply(StatusCode::NOT_FOUND, b"{}".to_vec());
    }
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return reply(StatusCode::BAD_REQUEST, b"{}".to_vec()),
    };
    let review = webhook.review(&body).await;
    match serde_json::to_vec(&review) {
        Ok(json) => reply(StatusCode::OK, json),
        Err(_) => reply(StatusCode::INTERNAL_SERVER_ERROR, b"{}".to_vec()),
    }
}

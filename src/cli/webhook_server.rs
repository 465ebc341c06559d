//! The pod webhook's HTTPS endpoint for `sync --watch --webhook-address`: `POST /mutate` takes
//! an AdmissionReview and answers with [`k8s::PodWebhook`]'s decision. HTTP/1.1 over rustls
//! (ring), the stack kube's client already links.
//!
//! Stopping without refusing anyone ([`WebhookServer::drain`]), behind a Service:
//! 1. SIGTERM: `/readyz` fails (the probes' side), so the endpoints drop this replica; until
//!    they do, the API server still opens connections here, and every one is answered. Each
//!    answer from now on says `Connection: close`: the API server keeps idle connections and
//!    reuses them whatever the endpoints say (it resolves the Service only when it dials), so
//!    closing each after its answer is what moves its traffic to the other replicas.
//! 2. After `--webhook-shutdown-delay`: no new connections; open ones finish the review they
//!    carry (at most [`WEBHOOK_TIMEOUT`], after which the API server has given up anyway) and
//!    idle ones close.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

use super::webhook_cert::{self, CertSlot, CertSource};
use crate::k8s::{self, Allocator, ClientConfig, Metrics, PodWebhook, WEBHOOK_TIMEOUT};

use super::{CliError, Exit};

/// The default `--webhook-shutdown-delay`. After SIGTERM the endpoints must drop this replica
/// before it stops listening: kubelet marks a deleted pod's endpoint not ready at once, and the
/// EndpointSlice controller and the API server's informer pass that on in about a second on a
/// healthy cluster, a few on a loaded one; a failed readiness probe (SIGTERM without a pod
/// deletion) takes the probe's period (2 s, as docs/webhook.md asks). 5 s covers both, and with
/// the wait for answers in flight ([`WEBHOOK_TIMEOUT`]) stays well inside the default
/// terminationGracePeriodSeconds of 30.
const SHUTDOWN_DELAY: &str = "5s";

/// A TLS handshake that has not finished by then is dropped (the API server's takes
/// milliseconds; this only bounds a client that connects and says nothing).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// mounted, re-read when renewed) and leave the caBundle to cert-manager's CA injector,
    /// instead of the CA Secret.
    #[arg(long, value_name = "DIR", requires = "webhook_address")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,
    /// After SIGTERM, how long the webhook keeps answering while /readyz fails, so the
    /// Service's endpoints drop this replica before it stops listening. Behind a Service only
    /// (with --webhook-url nothing routes by readiness, and it stops at once).
    #[arg(long, value_name = "DURATION", default_value = SHUTDOWN_DELAY,
          value_parser = super::duration::parse_duration, conflicts_with = "webhook_url")]
    pub webhook_shutdown_delay: Duration,
}

/// A running webhook endpoint, to be drained at shutdown.
pub struct WebhookServer {
    phase: watch::Sender<Phase>,
    /// Closed (`recv` gives `None`) once the accept loop and every connection have ended.
    ended: mpsc::Receiver<()>,
    in_flight: Arc<AtomicUsize>,
    /// Keeps the certificate and the configuration current (Service mode only).
    keeper: Option<JoinHandle<()>>,
    delay: Duration,
}

/// Where the endpoint is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Serving,
    /// Shutting down: still accepting and answering, each connection closed after its answer.
    Draining,
    /// Not accepting; connections end after the review they carry.
    Closed,
}

/// Start the webhook if asked: its certificate, its endpoint, then its registration (last, so
/// the API server never calls an endpoint that is not listening yet).
pub async fn start(
    client: &kube::Client,
    args: &WebhookArgs,
    allocator: Allocator,
    metrics: Metrics,
) -> anyhow::Result<Option<WebhookServer>> {
    let Some(address) = args.webhook_address else {
        return Ok(None);
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
    let source = match &args.webhook_cert_dir {
        Some(dir) => CertSource::Dir(dir.clone()),
        None => {
            let mut hosts: Vec<String> = vec![
                format!("{service}.{ns}.svc"),
                format!("{service}.{ns}.svc.cluster.local"),
                format!("{service}.{ns}"),
                service.clone(),
            ];
            hosts.extend(url_host);
            CertSource::Secret {
                namespace: ns.clone(),
                hosts,
            }
        }
    };
    let pems =
        source
            .load(client)
            .await
            .map_err(|e| match e.downcast_ref::<k8s::WebhookTlsError>() {
                Some(k8s::WebhookTlsError::NamespaceMissing { .. }) => CliError::new(
                    Exit::NotFound,
                    format!(
                        "{e}, or pass --webhook-namespace NAMESPACE to keep it in a namespace that \
                     exists"
                    ),
                )
                .into(),
                _ => e,
            })?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let slot =
        Arc::new(CertSlot::new(provider.clone(), &pems).map_err(|e| {
            CliError::new(Exit::Usage, format!("--webhook-address {address}: {e:#}"))
        })?);
    let webhook = PodWebhook::new(client.clone(), allocator, metrics);
    let (mut server, bound) = serve(address, provider, slot.clone(), webhook)
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
    k8s::register_webhook(client, pems.ca.as_deref(), &config).await?;
    if args.webhook_url.is_none() {
        // Behind a Service, readiness decides who is called: give the endpoints time to drop
        // this replica at shutdown, and keep the registration right while it runs. Out of the
        // cluster (--webhook-url) this process is the only one called: it does neither, so it
        // never takes the configuration back from a replica in the cluster.
        server.delay = args.webhook_shutdown_delay;
        server.keeper = Some(tokio::spawn(webhook_cert::keep_current(
            client.clone(),
            source,
            slot,
            config,
        )));
    }
    tracing::info!("serving the pod webhook on {bound} (POST /mutate)");
    Ok(Some(server))
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

/// Bind `address` now (a taken port is an error at start), then serve reviews until drained.
async fn serve(
    address: SocketAddr,
    provider: Arc<tokio_rustls::rustls::crypto::CryptoProvider>,
    slot: Arc<CertSlot>,
    webhook: PodWebhook,
) -> anyhow::Result<(WebhookServer, SocketAddr)> {
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(slot);
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let (phase, phase_rx) = watch::channel(Phase::Serving);
    let (alive, ended) = mpsc::channel(1);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let connection = Connection {
        acceptor,
        webhook,
        phase: phase_rx,
        in_flight: in_flight.clone(),
        _alive: alive,
    };
    tokio::spawn(accept(listener, connection));
    let server = WebhookServer {
        phase,
        ended,
        in_flight,
        keeper: None,
        delay: Duration::ZERO,
    };
    Ok((server, bound))
}

/// What each connection's task holds. The last one dropped (the accept loop's included) tells
/// [`WebhookServer::drain`] that everything has ended.
#[derive(Clone)]
struct Connection {
    acceptor: TlsAcceptor,
    webhook: PodWebhook,
    phase: watch::Receiver<Phase>,
    in_flight: Arc<AtomicUsize>,
    _alive: mpsc::Sender<()>,
}

async fn accept(listener: TcpListener, connection: Connection) {
    let mut phase = connection.phase.clone();
    loop {
        let accepted = tokio::select! {
            _ = phase.wait_for(|p| *p == Phase::Closed) => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                tokio::spawn(connection.clone().serve(stream));
            }
            // Out of file descriptors, most likely: let some connections end first.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

impl Connection {
    async fn serve(self, stream: TcpStream) {
        let Ok(Ok(stream)) =
            tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(stream)).await
        else {
            return;
        };
        let mut phase = self.phase.clone();
        let service = hyper::service::service_fn(move |request| {
            let (webhook, phase, in_flight) = (
                self.webhook.clone(),
                self.phase.clone(),
                self.in_flight.clone(),
            );
            async move {
                in_flight.fetch_add(1, Ordering::Relaxed);
                let mut response = answer(&webhook, request).await;
                in_flight.fetch_sub(1, Ordering::Relaxed);
                if *phase.borrow() != Phase::Serving {
                    // hyper closes the connection once this answer is written.
                    response.headers_mut().insert(
                        hyper::header::CONNECTION,
                        hyper::header::HeaderValue::from_static("close"),
                    );
                }
                Ok::<_, hyper::Error>(response)
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = phase.wait_for(|p| *p == Phase::Closed) => {}
        }
        // Idle: closed now. Reading or answering a review: closed once it is answered.
        conn.as_mut().graceful_shutdown();
        let _ = conn.await;
    }
}

impl WebhookServer {
    /// Stop as the module's comment says: answer everything that still comes for the shutdown
    /// delay, then finish what is in flight. The caller has made `/readyz` fail already.
    pub async fn drain(mut self) {
        if let Some(keeper) = self.keeper.take() {
            keeper.abort();
        }
        let _ = self.phase.send(Phase::Draining);
        if !self.delay.is_zero() {
            tracing::info!(
                "webhook: answering for {:?} more while the Service drops this replica",
                self.delay
            );
            tokio::time::sleep(self.delay).await;
        }
        let _ = self.phase.send(Phase::Closed);
        let busy = self.in_flight.load(Ordering::Relaxed);
        match tokio::time::timeout(WEBHOOK_TIMEOUT, self.ended.recv()).await {
            Ok(_) => {
                tracing::info!("webhook stopped ({busy} admissions were in flight, all answered)")
            }
            Err(_) => tracing::warn!(
                "webhook stopped with {} admissions unanswered after {WEBHOOK_TIMEOUT:?} (the \
                 API server has given up on them)",
                self.in_flight.load(Ordering::Relaxed)
            ),
        }
    }
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

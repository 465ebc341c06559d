//! The pod webhook's HTTPS endpoint: `POST /mutate` takes an AdmissionReview and answers with
//! [`PodWebhook`]'s decision. HTTP/1.1 over rustls (ring), the stack kube's client already
//! links.
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
use tokio_rustls::rustls::crypto::CryptoProvider;

use super::certificates::CertSlot;
use super::registration::{ClientConfig, Withdrawal, withdraw_registration};
use super::{PodWebhook, WEBHOOK_TIMEOUT};
use crate::k8s::error::KubeError;

/// A TLS handshake that has not finished by then is dropped (the API server's takes
/// milliseconds; this only bounds a client that connects and says nothing).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A running webhook endpoint, to be drained at shutdown.
pub struct WebhookServer {
    phase: watch::Sender<Phase>,
    /// Closed (`recv` gives `None`) once the accept loop and every connection have ended.
    ended: mpsc::Receiver<()>,
    in_flight: Arc<AtomicUsize>,
    /// Keeps the certificate and the configuration current (Service mode only).
    pub(super) keeper: Option<JoinHandle<()>>,
    /// Keeps the remembered shard copies current for the record check.
    pub(super) shard_watch: Option<JoinHandle<()>>,
    pub(super) delay: Duration,
    /// Registered by URL: the registration to withdraw at shutdown (behind a Service it stays,
    /// for the other replicas).
    pub(super) registration: Option<(kube::Client, ClientConfig)>,
}

/// What became of a URL registration when the webhook stopped.
pub type Withdrawn = Result<Withdrawal, KubeError>;

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Tls(#[from] tokio_rustls::rustls::Error),
    #[error(transparent)]
    Bind(#[from] std::io::Error),
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

/// Bind `address` now (a taken port is an error at start), then serve reviews until drained.
pub(super) async fn serve(
    address: SocketAddr,
    provider: Arc<CryptoProvider>,
    slot: Arc<CertSlot>,
    webhook: PodWebhook,
) -> Result<(WebhookServer, SocketAddr), ServeError> {
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
        shard_watch: None,
        delay: Duration::ZERO,
        registration: None,
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

/// A server dropped without draining (its start failed after it was bound) stops its tasks.
impl Drop for WebhookServer {
    fn drop(&mut self) {
        for task in [self.keeper.take(), self.shard_watch.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
    }
}

impl WebhookServer {
    /// Stop as the module's comment says: answer everything that still comes for the shutdown
    /// delay, then finish what is in flight. The caller has made `/readyz` fail already.
    /// Registered by URL, it first withdraws its registration (so the API server stops calling
    /// it before it stops answering) and returns what became of it.
    pub async fn drain(mut self) -> Option<Withdrawn> {
        for task in [self.keeper.take(), self.shard_watch.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
        let withdrawn = match self.registration.take() {
            Some((client, config)) => Some(withdraw_registration(&client, &config).await),
            None => None,
        };
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
        withdrawn
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

//! Liveness and readiness endpoints of the long-running processes (`sync --watch`,
//! `node-agent`): `GET /healthz` answers 200 while the process runs, `GET /readyz` 200 once it
//! is ready (the watcher: it has read every PortAllocation; 503 before, and again from SIGTERM
//! on, so the Service in front of the webhook drops this replica), and `GET /metrics` the
//! Prometheus text format. Plain HTTP/1.1 over hyper, one answer per connection, which is all
//! kubelet's probes and a Prometheus scrape need.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use super::{Metrics, Readiness};

/// The Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// A request whose head has not arrived by then is dropped (a probe sends its head at once).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Bind `address` now (so a taken port is an error at start), then answer probes until the
/// process ends.
pub async fn serve_probes(
    address: SocketAddr,
    readiness: Readiness,
    metrics: Metrics,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(answer_connection(
                stream,
                readiness.clone(),
                metrics.clone(),
            ));
        }
    });
    Ok(bound)
}

async fn answer_connection(stream: TcpStream, readiness: Readiness, metrics: Metrics) {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let response = answer(request.uri().path(), &readiness, &metrics);
        async move { Ok::<_, Infallible>(response) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(false)
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// The answer to a request for `path`, whatever its method.
fn answer(path: &str, readiness: &Readiness, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, body, content_type) = match path {
        "/healthz" | "/livez" => (StatusCode::OK, "ok\n".to_string(), TEXT),
        "/readyz" if readiness.is_ready() => (StatusCode::OK, "ok\n".to_string(), TEXT),
        "/readyz" if readiness.is_stopping() => (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down\n".to_string(),
            TEXT,
        ),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "initial list not complete\n".to_string(),
            TEXT,
        ),
        "/metrics" => (StatusCode::OK, metrics.render(), METRICS_CONTENT_TYPE),
        _ => (StatusCode::NOT_FOUND, "not found\n".to_string(), TEXT),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    // One answer per connection: a probe or scrape that reads to the end is not kept waiting.
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn each_path_answers_its_status_and_body() {
        let (readiness, metrics) = (Readiness::default(), Metrics::default());
        let status = |path: &str| answer(path, &readiness, &metrics).status().as_u16();
        assert_eq!(status("/healthz"), 200);
        assert_eq!(status("/livez"), 200);
        assert_eq!(status("/readyz"), 503);
        assert_eq!(status("/metrics"), 200);
        assert_eq!(status("/other"), 404);
        readiness.mark_ready();
        assert_eq!(status("/readyz"), 200);
        readiness.stop();
        assert_eq!(status("/readyz"), 503);
    }

    /// The whole answer on the wire, read until the server closes the connection.
    async fn get(bound: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(bound).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn an_answer_says_its_type_and_length_and_closes_the_connection() {
        let address = SocketAddr::from(([127, 0, 0, 1], 0));
        let bound = serve_probes(address, Readiness::default(), Metrics::default())
            .await
            .unwrap();
        let answer = get(bound, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.contains("\r\nContent-Type: text/plain; charset=utf-8\r\n"));
        assert!(answer.contains("\r\nContent-Length: 3\r\n"));
        assert!(answer.contains("\r\nConnection: close\r\n"));
        assert!(answer.ends_with("\r\n\r\nok\n"), "{answer}");
        // The head in pieces, as a slow client sends it.
        let mut stream = TcpStream::connect(bound).await.unwrap();
        stream.write_all(b"GET /readyz HT").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        stream
            .write_all(b"TP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{answer}"
        );
        assert!(answer.ends_with("initial list not complete\n"), "{answer}");
    }
}

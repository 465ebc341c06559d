//! Liveness and readiness endpoints for `sync --watch` in a pod: `GET /healthz` answers 200
//! while the process runs, `GET /readyz` 200 once the watcher has read every PortAllocation
//! (503 before, and again from SIGTERM on, so the Service in front of the webhook drops this
//! replica), and `GET /metrics` the Prometheus text format. Plain HTTP/1.1 on one port, which
//! is all kubelet's probes and a Prometheus scrape need.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::k8s::{Metrics, Readiness};

/// The Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bind `address` now (so a taken port is an error at start), then answer probes until the
/// process ends.
pub async fn serve(
    address: SocketAddr,
    readiness: Readiness,
    metrics: Metrics,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let readiness = readiness.clone();
            let metrics = metrics.clone();
            tokio::spawn(async move {
                // Read the whole request head: it may arrive in several segments, and closing
                // with unread bytes would reset the connection under the client's feet.
                let mut request = Vec::with_capacity(512);
                let mut chunk = [0u8; 512];
                let head = tokio::time::timeout(Duration::from_secs(5), async {
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => request.extend_from_slice(&chunk[..n]),
                        }
                    }
                })
                .await;
                if head.is_err() {
                    return;
                }
                let line = String::from_utf8_lossy(&request);
                let path = line.split_whitespace().nth(1).unwrap_or_default();
                let text = "text/plain; charset=utf-8";
                let (status, body, content_type) = match path {
                    "/healthz" | "/livez" => ("200 OK", "ok\n".to_string(), text),
                    "/readyz" if readiness.is_ready() => ("200 OK", "ok\n".to_string(), text),
                    "/readyz" if readiness.is_stopping() => (
                        "503 Service Unavailable",
                        "shutting down\n".to_string(),
                        text,
                    ),
                    "/readyz" => (
                        "503 Service Unavailable",
                        "initial list not complete\n".to_string(),
                        text,
                    ),
                    "/metrics" => ("200 OK", metrics.render(), METRICS_CONTENT_TYPE),
                    _ => ("404 Not Found", "not found\n".to_string(), text),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    Ok(bound)
}

//! The watcher's and the webhook's probe port (`/readyz`, `/healthz`, `/metrics`), read over
//! plain HTTP/1.1 on loopback, and the Prometheus text it serves.

use std::io::{Read, Write};
use std::net::TcpStream;

/// The whole HTTP answer to `GET path` on `127.0.0.1:port`, if it answers.
pub fn get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// The status code of `GET path`, if it answers.
pub fn status(port: u16, path: &str) -> Option<u16> {
    get(port, path)?.split_whitespace().nth(1)?.parse().ok()
}

/// The sum of every sample of a metric family in Prometheus text (`None` when it has none).
pub fn metric_sum(text: &str, family: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

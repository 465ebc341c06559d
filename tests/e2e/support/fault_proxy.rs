//! A fault-injecting TCP proxy between the plugin and the real API server, on loopback.
//!
//! It passes the TLS bytes through untouched (the API server's certificate has the SAN
//! 127.0.0.1, so a kubeconfig pointing at the proxy's 127.0.0.1 port still verifies), and per
//! connection it can add latency, refuse, hang, or cut the server's answer short. It runs on a
//! runtime of its own in a thread of its own, so a test that blocks on a child process does not
//! stall it, and it stops when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What happens to new connections.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Pass everything through.
    Pass,
    /// Delay every chunk, in both directions.
    Latency(Duration),
    /// Accept, then close at once: the client sees the connection dropped.
    Refuse,
    /// Accept and read, never answer: only a timeout ends the wait.
    Blackhole,
    /// Forward at most this many bytes from the server, then close: a truncated response (or
    /// TLS handshake, for small numbers).
    Truncate(usize),
    /// Per connection at random: refuse with `refuse`, truncate after a random number of bytes
    /// below `max_bytes` with `truncate`, else pass.
    Flaky {
        refuse: f64,
        truncate: f64,
        max_bytes: usize,
    },
}

/// Counts of what the proxy did.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicUsize,
    pub refused: AtomicUsize,
    pub truncated: AtomicUsize,
    pub hung: AtomicUsize,
}

pub struct FaultProxy {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    fault: Arc<Mutex<Fault>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// A kubeconfig like the upstream one, with the server replaced by this proxy.
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl FaultProxy {
    /// A proxy to the server of `kubeconfig`'s current cluster.
    pub fn start(kubeconfig: &Path, fault: Fault) -> FaultProxy {
        let text = std::fs::read_to_string(kubeconfig).expect("read kubeconfig");
        let server = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: https://"))
            .expect("a server in the kubeconfig")
            .trim()
            .to_string();
        let upstream: SocketAddr = server.parse().expect("server is host:port");
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let proxied = dir.path().join("kubeconfig");
        std::fs::write(
            &proxied,
            text.replace(&format!("https://{server}"), &format!("https://{addr}")),
        )
        .unwrap();

        let fault = Arc::new(Mutex::new(fault));
        let stats = Arc::new(Stats::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = {
            let fault = fault.clone();
            let stats = stats.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(std_listener).unwrap();
                    let accept = async {
                        loop {
                            let Ok((client, _)) = listener.accept().await else {
                                continue;
                            };
                            stats.connections.fetch_add(1, Ordering::Relaxed);
                            let now = *fault.lock().unwrap();
                            tokio::spawn(serve(client, upstream, now, stats.clone()));
                        }
                    };
                    tokio::select! {
                        _ = accept => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime ends every connection task.
            })
        };
        FaultProxy {
            addr,
            stats,
            fault,
            stop: Some(stop),
            thread: Some(thread),
            kubeconfig: proxied,
            _dir: dir,
        }
    }

    /// Change what happens to connections opened from now on.
    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }

    pub fn count(&self, counter: fn(&Stats) -> &AtomicUsize) -> usize {
        counter(&self.stats).load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(client: TcpStream, upstream: SocketAddr, fault: Fault, stats: Arc<Stats>) {
    let fault = match fault {
        Fault::Flaky {
            refuse,
            truncate,
            max_bytes,
        } => {
            let mut rng = rand::rng();
            let roll: f64 = rng.random();
            if roll < refuse {
                Fault::Refuse
            } else if roll < refuse + truncate {
                Fault::Truncate(rng.random_range(0..max_bytes))
            } else {
                Fault::Pass
            }
        }
        other => other,
    };
    match fault {
        Fault::Refuse => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            drop(client);
        }
        Fault::Blackhole => {
            stats.hung.fetch_add(1, Ordering::Relaxed);
            let mut client = client;
            let mut sink = [0u8; 4096];
            while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
        }
        Fault::Pass | Fault::Latency(_) | Fault::Truncate(_) => {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let delay = match fault {
                Fault::Latency(d) => d,
                _ => Duration::ZERO,
            };
            let limit = match fault {
                Fault::Truncate(n) => Some(n),
                _ => None,
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let up = pump(client_read, server_write, delay, None);
            let down = pump(server_read, client_write, delay, limit);
            let (_, truncated) = tokio::join!(up, down);
            if truncated {
                stats.truncated.fetch_add(1, Ordering::Relaxed);
            }
        }
        Fault::Flaky { .. } => unreachable!("resolved above"),
    }
}

/// Copy until EOF or error, sleeping `delay` before each chunk; with a `limit`, stop after that
/// many bytes and close both ways. Returns whether the limit cut the stream.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    limit: Option<usize>,
) -> bool {
    let mut buf = vec![0u8; 16 * 1024];
    let mut sent = 0usize;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let n = match limit {
            Some(limit) => n.min(limit - sent),
            None => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        sent += n;
        if limit.is_some_and(|limit| sent >= limit) {
            // The other direction ends when the client sees this one close.
            let _ = to.shutdown().await;
            return true;
        }
    }
    let _ = to.shutdown().await;
    false
}

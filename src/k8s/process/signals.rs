//! SIGTERM (how kubelet stops a pod) and Ctrl-C, counted: the first asks a long-running
//! process to stop gracefully, a second to stop at once.

/// A signal this process could not listen for.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for {signal}: {error}")]
pub struct SignalError {
    signal: &'static str,
    // Said in the message, not as a source: the message is the whole of it.
    error: std::io::Error,
}

/// Count SIGTERM (how kubelet stops a pod) and Ctrl-C from now on.
pub fn listen_for_signals() -> Result<tokio::sync::watch::Receiver<u32>, SignalError> {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind, signal_name| {
        signal(kind).map_err(|error| SignalError {
            signal: signal_name,
            error,
        })
    };
    let mut terminate = listen(SignalKind::terminate(), "SIGTERM")?;
    let mut interrupt = listen(SignalKind::interrupt(), "SIGINT")?;
    let (count, counted) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            count.send_modify(|n| *n += 1);
            if *count.borrow() == 1 {
                tracing::info!("shutting down: finishing syncs and admissions in flight");
            }
        }
    });
    Ok(counted)
}

/// Once `n` signals have come.
pub async fn signalled(mut counted: tokio::sync::watch::Receiver<u32>, n: u32) {
    let _ = counted.wait_for(|count| *count >= n).await;
}

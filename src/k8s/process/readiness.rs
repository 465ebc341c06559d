//! What `/readyz` answers for a long-running process (the watcher, the webhook beside it, the
//! node agent).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the watcher has read every PortAllocation once, and is not shutting down: a
/// replica that got SIGTERM reports not ready at once, so the Service in front of its webhook
/// drops it while it still answers.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<ReadinessState>);

#[derive(Debug, Default)]
struct ReadinessState {
    listed: AtomicBool,
    stopping: AtomicBool,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.0.listed.load(Ordering::Relaxed) && !self.is_stopping()
    }

    pub fn is_stopping(&self) -> bool {
        self.0.stopping.load(Ordering::Relaxed)
    }

    /// Ready from now on (until [`stop`](Self::stop)): for processes whose readiness is not the
    /// watcher's, such as the node agent once it has read the pools and its pods.
    pub fn mark_ready(&self) {
        self.set();
    }

    /// Not ready from now on (shutting down).
    pub fn stop(&self) {
        self.0.stopping.store(true, Ordering::Relaxed);
    }

    fn set(&self) {
        self.0.listed.store(true, Ordering::Relaxed);
    }
}

//! What every long-running process (`sync --watch` with its webhook, `node-agent`) shares,
//! whatever it does: its readiness, its metrics, the probes that serve both, the signals that
//! stop it, and how CPU-bound work keeps the async runtime answering.

mod cpu_bound;
pub mod metrics;
mod probes;
mod readiness;
mod signals;

pub use cpu_bound::cpu_bound;
pub use metrics::{Metrics, SyncResult};
pub use probes::serve_probes;
pub use readiness::Readiness;
pub use signals::{SignalError, listen_for_signals, signalled};

//! The thin Kubernetes layer: clients, reads and compare-and-swap writes. Decisions about which
//! ports to hand out live in [`crate::core`]; this layer only moves state to and from the API.

mod client;
mod crds;
mod error;

pub use client::{ClientOptions, connect};
pub use crds::{crds_installed, install_crds};
pub use error::{ApiErrorKind, KubeError, Op, error_chain, explain};

/// The field manager name our writes are recorded under.
pub const FIELD_MANAGER: &str = "kubectl-portalloc";

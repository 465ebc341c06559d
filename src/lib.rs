//! kubectl-portalloc: collision-free port allocation for Kubernetes workloads.
//!
//! - [`api`]: the CustomResourceDefinitions (`PortPool`, `PortAllocation`).
//! - [`core`]: the pure allocation core: ranges, bands, bitmaps, planning. No I/O.

pub mod api;
pub mod cli;
pub mod core;
pub mod k8s;

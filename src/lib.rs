//! kubectl-portalloc: collision-free port allocation for Kubernetes workloads.
//!
//! Layers, each using only those above it (the modules below in the same order):
//! - [`core`]: the pure allocation core: ranges, bands, bitmaps, planning. No I/O.
//! - [`api`]: the CustomResourceDefinitions (`PortPool`, `PortAllocation`).
//! - [`ledger`]: decisions over the API types: the pool record, allocation status, sync and
//!   release decisions with their refusals, the repair plan. No I/O.
//! - [`node`]: the node agent's kernel side: reserved ports, the cgroup BPF bind guard. Its only
//!   I/O is the kernel's.
//! - [`k8s`]: reads, calls the ledger, writes (compare-and-swap), with one retry driver; the
//!   long-running processes (watcher, webhook, node agent) over the API server and [`node`].
//!
//! The command line (`src/cli`, part of the binary) parses, calls this library and renders.

pub mod core;

pub mod api;

pub mod ledger;

pub mod node;

pub mod k8s;

//! Test code shared by the test binaries and the benchmarks that start real processes: the local
//! control plane, kube-scheduler and kube-controller-manager, Node objects, the watcher and the
//! webhook as processes, a simulated node for the node agent. It is test code, so the library
//! does not export it: each binary that needs it declares this one module once, by `#[path]`
//! (docs/development.md, "Test layout"), and the helpers reach each other through `super::`.
//! Each binary uses a part of it, hence `dead_code` is allowed.

#![allow(dead_code)]

pub mod agent_node;
pub mod control_plane;
pub mod controllers;
pub mod events;
pub mod node_cgroups;
pub mod nodes;
pub mod poll;
pub mod ports;
pub mod probe_http;
pub mod service_account;
pub mod watcher_process;
pub mod webhook;

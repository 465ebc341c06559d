//! The watcher's decisions: which replica works (the leader Lease) and what it says on the
//! objects it acts on (Kubernetes Events).

pub mod event_notice;
pub mod leader_lease;

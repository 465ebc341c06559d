//! The node agent's decisions: what it makes the kernel hold, and what it reports (its Lease)
//! and `pool describe` makes of the reports.

pub mod node_guard;
pub mod node_report;

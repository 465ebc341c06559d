//! Why an allocation could not be made. The Kubernetes layer wraps these
//! with who holds a port; the messages here already say what to change.

use thiserror::Error;

use super::holding::SlotKey;
use super::range::PortSet;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AllocError {
    #[error(
        "port {port} is not in the pool's ranges {}: request a port inside them, or leave it unset to get one automatically",
        describe_ranges(.ranges)
    )]
    NotInPool { port: u16, ranges: PortSet },

    #[error(
        "port {port} is already held: request a different port, or leave it unset to get a free one automatically"
    )]
    Held { port: u16 },

    #[error(
        "pool is full: it has {size} ports, {used} in use and {free} free, but this allocation needs {needed}; nothing was allocated. Add ranges to the pool, lower replicas, or delete PortAllocations no longer in use"
    )]
    PoolFull {
        size: u32,
        used: u32,
        needed: u32,
        free: u32,
    },

    #[error(
        "port {port} is requested by {} slots ({}): one port can be held only once, so request it for one slot, or leave it unset so each slot gets its own",
        .slots.len(),
        list_slots(.slots)
    )]
    DuplicateRequest { port: u16, slots: Vec<SlotKey> },
}

fn describe_ranges(ranges: &PortSet) -> String {
    if ranges.is_empty() {
        "(none: every port is excluded)".to_owned()
    } else {
        ranges.to_string()
    }
}

fn list_slots(slots: &[SlotKey]) -> String {
    slots
        .iter()
        .map(SlotKey::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

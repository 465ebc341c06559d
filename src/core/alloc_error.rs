//! Why an allocation could not be made. The Kubernetes layer wraps these
//! with who holds a port; the messages here already say what to change.

use thiserror::Error;

use super::block::PortBlock;
use super::fragmentation::RunSummary;
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
        "ports {block} are not all in the pool's ranges {}: port {port} is not; request a block whose ports are all inside (none excluded), or leave the port unset to get a block automatically",
        describe_ranges(.ranges)
    )]
    BlockNotInPool {
        block: PortBlock,
        port: u16,
        ranges: PortSet,
    },

    #[error(
        "port {port} of the requested block {block} is already held: request a block of free ports, or leave the port unset to get a free block automatically"
    )]
    BlockHeld { block: PortBlock, port: u16 },

    #[error(
        "a block of {count} ports from port {first} would run past port 65535: request a lower first port"
    )]
    BlockPastEnd { first: u16, count: u32 },

    #[error(
        "pool is full: it has {size} ports, {used} in use and {free} free, but this allocation needs {needed}{}; nothing was allocated. Add ranges to the pool, lower replicas, or delete PortAllocations no longer in use",
        runs_note(.runs)
    )]
    PoolFull {
        size: u32,
        used: u32,
        needed: u32,
        free: u32,
        /// Set when the allocation asks for blocks: how the free ports lie.
        runs: Option<RunSummary>,
    },

    #[error(
        "no room for a block: {slot} needs a block of {count} contiguous ports; {runs}{}; nothing was allocated. {}",
        placed_note(*.placed),
        no_run_advice(*.count, *.longest_range)
    )]
    NoRun {
        slot: SlotKey,
        count: u32,
        runs: RunSummary,
        /// Ports this allocation had already placed automatically when the block did not fit.
        placed: u32,
        /// The pool's longest range of contiguous ports, held or not: a block longer than that
        /// never fits, whatever is deleted.
        longest_range: u32,
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

fn runs_note(runs: &Option<RunSummary>) -> String {
    runs.map(|r| {
        format!(
            " in blocks, and the largest free run is {} ports ({} runs)",
            r.largest, r.runs
        )
    })
    .unwrap_or_default()
}

/// What to do about a block that did not fit: free or grow, or, when even an empty pool has no
/// run that long, grow.
fn no_run_advice(count: u32, longest_range: u32) -> String {
    if count > longest_range {
        format!(
            "The pool must grow: its longest range of contiguous ports is {longest_range}, so deleting \
             PortAllocations cannot make room; add a range of at least {count} ports, or lower the port's count"
        )
    } else {
        "Lower the port's count, release blocks no longer in use, or add a range to the pool \
         (`kubectl portalloc pool describe` shows its free runs)"
            .to_string()
    }
}

fn placed_note(placed: u32) -> String {
    if placed == 0 {
        String::new()
    } else {
        format!(", after this allocation's other {placed} automatic ports were placed")
    }
}

fn list_slots(slots: &[SlotKey]) -> String {
    slots
        .iter()
        .map(SlotKey::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

//! `repair`: the plan that makes a pool's shards match the live PortAllocations again, per
//! shard and for the whole pool, what it says and how that reads.

pub(super) mod pool_repair;
pub(super) mod repair_outcome;
pub(super) mod repair_plan;
mod repair_restore;
mod repair_text;

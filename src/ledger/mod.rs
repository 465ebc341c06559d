//! The ledger: every decision about who holds which port, over the API types and with no I/O.
//!
//! - [`ShardedRecord`]: a pool as read — a copy of its spec ([`PoolCopy`]) and its
//!   PortPoolShards, one per 256-port window ([`ShardLayout`]) — and the per-shard writes that
//!   commit a decision; every pool, whatever its size, is recorded this way.
//! - [`PoolRecord`]: one shard (or several windows joined), decoded into the core's pool state
//!   plus its holders, and turned back into the shard status to write.
//! - [`decide`]: what one owner holds after a sync, a release or its removal; [`Refusal`] when
//!   that is impossible (pool full, port held, invalid spec, pool missing).
//! - [`place`] and [`decide_pool_batch`]: which shards an owner's decision is made on (its
//!   home shard, else the fewest that fit), for one owner and for many at once (group commit:
//!   one write per shard, a refusal staying with its own item).
//! - [`allocation_status`]: a PortAllocation's status as a function of its spec and its pool
//!   entry, so it can be recomputed at any time.
//! - [`plan_sharded_repair`]: the diff that makes a pool's shards match the live
//!   PortAllocations, one [`plan_repair`] per shard.
//! - [`preview`]: a dry run's decisions, against a copy of the record nothing writes back.
//! - [`overlapping_pool`]: whether a new pool would share ports with an existing one.
//! - [`shard_warnings`]: what readers (`pool describe`) say about the shards.
//!
//! The Kubernetes layer ([`crate::k8s`]) reads, calls these, and writes what they return.

mod allocation_status;
mod decision;
#[cfg(test)]
pub(crate) mod fixtures;
mod placement;
mod pool_copy;
mod pool_record;
mod pools;
mod preview;
mod refusal;
mod repair_plan;
mod repair_text;
mod shard_layout;
mod shard_placement;
mod shard_repair;
mod shard_view;
mod sharded_record;

pub use allocation_status::{
    CONDITION_ALLOCATED, CONDITION_READY, CONDITION_RECONCILING, CONDITION_STALLED, Outcome,
    allocation_status, recorded_holdings,
};
pub use decision::{Decision, Operation, decide, precheck};
pub use placement::{BatchItem, ItemOutcome, Pass, Placed, PoolBatch, decide_pool_batch, place};
pub use pool_copy::PoolCopy;
pub use pool_record::{Anomaly, HolderEntry, PoolRecord, counted_status};
pub use pools::{PoolOverlap, overlapping_pool};
pub use preview::{PortChanges, Previewed, preview};
pub use refusal::{Reason, Refusal};
pub use repair_plan::{Change, Finding, FreeReason, RepairPlan, Restored, plan_repair};
pub use shard_layout::{
    SHARD_WINDOW, ShardLayout, ShardSpan, fnv1a, shard_index_of, shard_name, window,
};
pub use shard_placement::{home_shard, known_shards, listed_shards, single_shard};
pub use shard_repair::{ShardRepairPlan, StaleShard, plan_sharded_repair};
pub use shard_view::shard_warnings;
pub use sharded_record::{
    ShardAnomaly, ShardRecord, ShardWrite, ShardedRecord, load_shard, new_shard, split_by_shard,
};

use kube::ResourceExt;

use crate::api::PortAllocation;

/// `namespace/name`: how a PortAllocation is named in pool entries and messages.
pub fn owner_of(pa: &PortAllocation) -> String {
    format!("{}/{}", pa.namespace().unwrap_or_default(), pa.name_any())
}

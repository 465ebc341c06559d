//! The ledger: every decision about who holds which port, over the API types and with no I/O.
//!
//! - [`PoolRecord`]: a PortPool as read, decoded into the core's pool state plus its holders, and
//!   turned back into the status to write.
//! - [`decide`]: what one owner holds after a sync, a release or its removal; [`Refusal`] when
//!   that is impossible (pool full, port held, invalid spec, pool missing).
//! - [`decide_batch`]: the same for many owners of one pool at once (group commit), so one
//!   write commits all of them and a refusal stays with its own item.
//! - [`allocation_status`]: a PortAllocation's status as a function of its spec and its pool
//!   entry, so it can be recomputed at any time.
//! - [`plan_repair`]: the diff that makes a pool's record match the live PortAllocations.
//! - [`overlapping_pool`]: whether a new pool would share ports with an existing one.
//! - Sharded record (groundwork, not used by the Kubernetes layer yet): [`ShardLayout`] (which
//!   `PortPoolShard` records which port), [`ShardedRecord`] (a pool's shards as one record),
//!   [`upgrade_plan`] (today's one-object record cut into shards), [`plan_sharded_repair`]
//!   (repair per shard), [`is_sharded`] and [`shard_warnings`] (for readers).
//!
//! The Kubernetes layer ([`crate::k8s`]) reads, calls these, and writes what they return.

mod allocation_status;
mod batch;
mod decision;
mod pool_record;
mod pools;
mod refusal;
mod repair_plan;
mod repair_text;
mod shard_layout;
mod shard_placement;
mod shard_repair;
mod shard_upgrade;
mod shard_view;
mod sharded_record;

pub use allocation_status::{
    CONDITION_ALLOCATED, CONDITION_READY, CONDITION_RECONCILING, CONDITION_STALLED, Outcome,
    allocation_status, recorded_holdings,
};
pub use batch::{BatchDecision, BatchItem, ItemOutcome, decide_batch};
pub use decision::{Decision, Operation, decide, precheck};
pub use pool_record::{Anomaly, HolderEntry, PoolRecord};
pub use pools::{PoolOverlap, overlapping_pool};
pub use refusal::{Reason, Refusal};
pub use repair_plan::{Change, Finding, FreeReason, RepairPlan, Restored, plan_repair};
pub use shard_layout::{
    SHARD_WINDOW, ShardLayout, ShardSpan, fnv1a, shard_index_of, shard_name, window,
};
pub use shard_placement::{home_shard, known_shards, single_shard};
pub use shard_repair::{ShardRepairPlan, StaleShard, plan_sharded_repair};
pub use shard_upgrade::{UpgradedShard, upgrade_plan};
pub use shard_view::{is_sharded, shard_warnings};
pub use sharded_record::{
    ShardAnomaly, ShardRecord, ShardWrite, ShardedRecord, load_shard, new_shard, split_by_shard,
};

use kube::ResourceExt;

use crate::api::PortAllocation;

/// `namespace/name`: how a PortAllocation is named in pool entries and messages.
pub fn owner_of(pa: &PortAllocation) -> String {
    format!("{}/{}", pa.namespace().unwrap_or_default(), pa.name_any())
}

//! The ledger: every decision about who holds which port, over the API types and with no I/O.
//!
//! - [`PoolRecord`]: a pool as read — a snapshot of its spec ([`PoolSnapshot`]) and its
//!   PortPoolShards, one per 256-port window ([`WindowLayout`]) in each copy of its ports
//!   (`nodeReuse`, [`ShardKey`]) — and the per-shard writes that commit a decision; every pool,
//!   whatever its size, is recorded this way. [`CopyRecord`] is one copy's windows, and
//!   [`ShardRecord`] one shard of it with what the decisions since the read changed.
//! - [`WindowRecord`]: one shard (or several windows joined), decoded into the core's pool state
//!   plus its holders, and turned back into the shard status to write.
//! - [`decide`]: what one owner holds after a sync, a release or its removal; [`Refusal`] when
//!   that is impossible (pool full, port held, invalid spec, pool missing).
//! - [`place`] and [`decide_pool_batch`]: which shards an owner's decision is made on (its
//!   home shard, else the fewest that fit), for one owner and for many at once (group commit:
//!   one write per shard, a refusal staying with its own item); within a copy, which windows
//!   (`window_choice`); a workload bigger than one copy, its pods over the copies (`spread`).
//! - [`allocation_status`]: a PortAllocation's status as a function of its spec and its pool
//!   entry, so it can be recomputed at any time.
//! - [`plan_pool_repair`]: the diff that makes a pool's shards match the live
//!   PortAllocations, one [`plan_repair`] per shard.
//! - [`preview`]: a dry run's decisions, against a copy of the record nothing writes back.
//! - [`overlapping_pool`], [`all_overlaps`]: pools of one protocol that share ports.
//! - [`record_warnings`]: what readers (`pool describe`) say about the shards.
//! - [`unheld_ports`]: the ports the pod webhook would give a pod that the record does not give
//!   its PortAllocation (a status written by hand, or stale), and the [`RecordDenial`].
//! - [`node_guard`]: what the node agent makes the kernel hold: every pool's ports reserved,
//!   the guarded ports' modes, which pod on the node holds each.
//! - [`node_report`]: what a node agent reports (its Lease) and what `pool describe` makes of it.
//! - [`node_bound`]: which copies a pool lets a holder use: a fixed `nodeReuse`, or copies that
//!   follow the nodes, never where its pods could be kept off every node able to run them.
//! - [`leader_lease`]: one worker among the watcher's replicas, elected through a Lease.
//! - [`event_notice`]: what the watcher says on the objects it acts on (Kubernetes Events).
//!
//! Folders: `record/` (the record: windows, shards, copies, `node_bound`), `placement/` (which
//! window and copy new ports go to, and where in them), `repair/`, `node/` (the node agent's
//! guard and report) and `watcher/` (its Lease and Events). The
//! ledger re-exports what callers use (`ledger::PoolRecord`, `ledger::node_guard`), so their
//! paths do not name the folders.
//!
//! The Kubernetes layer ([`crate::k8s`]) reads, calls these, and writes what they return.

mod allocation_status;
mod decision;
#[cfg(test)]
pub(crate) mod fixtures;
mod node;
mod placement;
mod pod_ports;
mod pools;
mod preview;
mod record;
mod refusal;
mod repair;
mod spec_change;
mod watcher;

pub(crate) use allocation_status::is_current;
pub use allocation_status::{
    CONDITION_ALLOCATED, CONDITION_READY, CONDITION_RECONCILING, CONDITION_STALLED, Outcome,
    allocation_status, recorded_copies, recorded_holdings, set_slot_copies,
};
pub use decision::{Decision, Operation, decide, precheck};
pub use placement::batch_steps::{BatchSteps, step_ends};
pub use placement::home_fit::loose_in_window;
pub use placement::shard_choice::{
    BatchItem, ItemOutcome, Pass, Placed, PoolBatch, decide_pool_batch, decide_pool_batch_telling,
    place,
};
pub use pod_ports::{
    Mismatch, PodPortInShard, PodPortsError, PortHolder, RecordDenial, pod_port_shards, pod_ports,
    unheld_ports,
};
pub use pools::{
    PoolOverlap, SharedPorts, all_overlaps, may_share, overlapping_pool, ranges_of, shared_ports,
};
pub use preview::{PortChanges, Previewed, preview};
pub use record::copy_record::{CopyRecord, newest_snapshot};
pub use record::elsewhere::{marking_writes, rebased, unmarking_write, with_marks};
pub use record::holdings_across_shards::{ShardAnomaly, split_by_shard};
pub use record::known_shards::{
    home_shard, known_shards, listed_shards, single_shard, status_copy, status_shards,
};
pub use record::node_bound::{CopyBound, CopyRefusal, InUse, NodeCount};
pub use record::pool_record::PoolRecord;
pub use record::pool_snapshot::PoolSnapshot;
pub use record::record_warnings::record_warnings;
pub use record::shard_record::{ShardRecord, ShardWrite, load_shard, new_shard};
pub use record::window_record::{Anomaly, HolderEntry, WindowRecord, counted_status};
pub use record::windows::{
    ShardKey, WINDOW_PORTS, WindowLayout, WindowSpan, fnv1a, shard_name, window, window_of,
};
pub use refusal::{Reason, Refusal};
pub use repair::pool_repair::{PoolRepairPlan, StaleShard, plan_pool_repair};
pub use repair::repair_outcome::{Change, Finding, FreeReason, RepairPlan, Restored};
pub use repair::repair_plan::plan_repair;
pub use spec_change::{spec_differences, stranded_holders};

pub use node::{node_guard, node_report};
pub use record::node_bound;
pub use watcher::{event_notice, leader_lease};

use kube::ResourceExt;

use crate::api::PortAllocation;

/// `namespace/name`: how a PortAllocation is named in pool entries and messages.
pub fn owner_of(pa: &PortAllocation) -> String {
    format!("{}/{}", pa.namespace().unwrap_or_default(), pa.name_any())
}

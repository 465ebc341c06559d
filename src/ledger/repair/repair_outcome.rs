//! What a repair plan says ([`super::repair_plan`]): the changes it would write, the findings it
//! only reports, and the part of a pool it covers.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::api::PortPoolShardStatus;
use crate::core::{PortBlock, PortRange};
use crate::ledger::record::window_record::WindowRecord;

/// Why an entry is freed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FreeReason {
    /// No PortAllocation with this UID exists any more.
    OwnerGone,
    /// The PortAllocation with this UID allocates from another pool (its `spec.pool` is
    /// immutable, so no client will ever free this entry).
    OtherPool { pool: String },
}

/// One change repair makes to a pool's record (its shards).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum Change {
    /// Remove an entry whose owner is gone.
    #[serde(rename_all = "camelCase")]
    Free {
        uid: String,
        owner: String,
        /// The entry's `ports` text as it was.
        ports: String,
        /// How many ports that frees (0 for an undecodable entry).
        count: usize,
        reason: FreeReason,
    },
    /// Put back holdings a live PortAllocation's status records.
    #[serde(rename_all = "camelCase")]
    Restore {
        uid: String,
        owner: String,
        ports: String,
        count: usize,
    },
    /// Stop naming a PortAllocation in the shard's `status.elsewhere`: it is gone, or its
    /// status names its shards, so no sync needs the mark any more.
    #[serde(rename_all = "camelCase")]
    Unmark {
        uid: String,
        owner: String,
        reason: UnmarkReason,
    },
    /// Delete a shard object left by an earlier pool object of the same name (it would block
    /// this pool's shard for its window; statuses restore what it held).
    #[serde(rename_all = "camelCase")]
    RemoveShard { shard: String, pool_uid: String },
    /// The shard carries an older spec of the pool: write this generation's (the shard's
    /// ports and counts follow it; no entry changes).
    #[serde(rename_all = "camelCase")]
    Respec { shard: String, generation: i64 },
    /// Only the counts (size, allocated, available, holderCount) were wrong.
    #[serde(rename_all = "camelCase")]
    Recount {
        size: i32,
        allocated: i32,
        available: i32,
        holder_count: i32,
    },
}

/// Why a mark in `status.elsewhere` is no longer needed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum UnmarkReason {
    /// No PortAllocation of this pool has the UID.
    OwnerGone,
    /// Its status names the shards its entries are in.
    StatusNamesShards,
}

/// Something repair reports and leaves as it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Finding {
    /// One port listed by two entries (or twice by one).
    #[serde(rename_all = "camelCase")]
    Duplicate {
        port: u16,
        first: String,
        second: String,
    },
    /// A held port outside the pool's ranges, or excluded.
    #[serde(rename_all = "camelCase")]
    OutsidePool {
        uid: String,
        owner: String,
        slot: String,
        port: u16,
    },
    /// An entry of a live PortAllocation whose text does not decode; kept verbatim.
    #[serde(rename_all = "camelCase")]
    Undecodable {
        uid: String,
        owner: String,
        error: String,
    },
    /// The status records ports of this pool but the pool has no entry for the object: an
    /// interrupted release or scale-down, or a status written by hand. `sync` corrects it.
    #[serde(rename_all = "camelCase")]
    StaleStatus {
        owner: String,
        recorded: String,
        why: String,
    },
    /// A recorded port that could not be restored because someone else holds it now.
    #[serde(rename_all = "camelCase")]
    RestoreConflict {
        owner: String,
        slot: String,
        port: u16,
        holder: String,
    },
    /// A recorded port that was not restored: outside the pool, or a slot the spec no longer
    /// asks for.
    #[serde(rename_all = "camelCase")]
    RestoreSkipped {
        owner: String,
        slot: String,
        port: u16,
        why: String,
    },
    /// A pool port listed in a shard whose window does not contain it.
    #[serde(rename_all = "camelCase")]
    WrongShard {
        shard: String,
        uid: String,
        owner: String,
        slot: String,
        port: u16,
    },
    /// One port listed in two shards.
    #[serde(rename_all = "camelCase")]
    HeldInTwoShards {
        port: u16,
        first: String,
        first_shard: String,
        second: String,
        second_shard: String,
    },
    /// An owner's slot listed in several shards in pieces that do not join.
    #[serde(rename_all = "camelCase")]
    SlotApart {
        uid: String,
        slot: String,
        shards: Vec<String>,
    },
    /// A shard object that is not part of the record (another pool's, an earlier pool object's,
    /// a malformed one, or a second one for a window).
    #[serde(rename_all = "camelCase")]
    NotLoaded { shard: String, reason: String },
    /// The pool's ranges meet those of another pool of its protocol without both allowing
    /// it (`spec.allowOverlap`): each may hand one of these ports to a workload of its own.
    /// Reported, never rewritten: which pool should give the ports up is the admin's choice.
    #[serde(rename_all = "camelCase")]
    SharesPorts {
        other: String,
        protocol: String,
        ports: String,
    },
}

/// A PortAllocation whose holdings a plan restores; it is synced after the write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// What repair would do to one pool (or one of its shards), computed from one list of its
/// shards and one later list of PortAllocations.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairPlan {
    pub pool: String,
    pub pool_uid: String,
    pub changes: Vec<Change>,
    pub findings: Vec<Finding>,
    /// Holders and held ports after the changes.
    pub holders: usize,
    pub held_ports: u32,
    /// The holders after the changes (several copies of a pool may name one twice).
    #[serde(skip)]
    pub holders_after: BTreeSet<String>,
    /// A plan of one shard: the shard's status to write, `None` when nothing changes. A plan
    /// of the whole pool leaves it `None`: each changed shard's status is in its write.
    #[serde(skip)]
    pub status: Option<PortPoolShardStatus>,
    #[serde(skip)]
    pub restored: Vec<Restored>,
}

impl RepairPlan {
    pub fn is_clean(&self) -> bool {
        self.changes.is_empty() && self.findings.is_empty()
    }
}

/// What part of a pool `record` is: a whole record (the default, as the unit tests build), or
/// one shard (`record` then carries the pool's name and UID, the shard's version).
#[derive(Clone, Debug, Default)]
pub(crate) struct RepairScope {
    /// The shard's window: only the pieces of recorded holdings inside it are this record's.
    pub window: Option<PortRange>,
    /// The shard was missing: restore what statuses naming this very pool object record (the
    /// shard's entries were lost, not released).
    pub restore_own: bool,
    /// Ports of the window that other shards list (owner): never restored over.
    pub held_elsewhere: BTreeMap<u16, String>,
    /// The copy of a pool with reuse this record is part of: only statuses that name it (see
    /// `status_copy`) are restored here or reported as stale.
    pub copy: Option<u16>,
}

impl RepairScope {
    /// The piece of `block` this record covers, if any.
    pub(super) fn piece(&self, block: PortBlock) -> Option<PortBlock> {
        let Some(window) = self.window else {
            return Some(block);
        };
        let first = block.first.max(window.first);
        let last = block.last().min(window.last);
        PortBlock::spanning(first, last).filter(|_| first <= last)
    }
}

/// The pool's ports, as a finding names them.
pub(super) fn describe_ports(record: &WindowRecord) -> String {
    if record.ports.is_empty() {
        "none (every port is excluded)".into()
    } else {
        record.ports.to_string()
    }
}

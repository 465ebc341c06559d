//! `repair`: make one record of a pool (one shard) match the live PortAllocations again;
//! `pool_repair` runs it once per shard.
//!
//! The shards' `status.holders` are the authoritative record of who holds which port. Two
//! things can make them disagree with the cluster: an entry whose PortAllocation is gone (a `delete`
//! interrupted between deleting the object and freeing its entry, or an object deleted with
//! `kubectl delete`), and holdings the pool lost (the pool was deleted and created again while
//! PortAllocations still held ports in it; their statuses still record them).
//!
//! # Why a single pass is safe (what Kubernetes solves with several)
//!
//! Kubernetes' repair controller frees a leaked port only after seeing it leaked on several
//! passes, because an allocation may be in flight. Here, the order of the reads settles it:
//!
//! 1. read the pool, at resourceVersion `R`;
//! 2. *then* list every PortAllocation (a consistent list, served at a revision after `R`).
//!
//! A client writes a pool entry only for a PortAllocation that exists: the entry is keyed by the
//! object's UID, which the API server assigns when the object is created. So every entry in the
//! pool at `R` belongs to an object created before `R`; if the list taken after `R` does not
//! contain that UID, the object has been deleted, and a UID never comes back. Such an entry is a
//! genuine leak, never an allocation in flight. Allocations that land after `R` are not in what
//! we read at all, and the write back is a compare-and-swap on `R`: if anything wrote the pool
//! after `R`, the write fails with 409 and repair starts again from step 1. A concurrent
//! allocation can therefore never lose its ports to repair.
//!
//! # What repair changes, and what it only reports
//!
//! - **Frees** entries whose UID is not a live PortAllocation of this pool (also undecodable
//!   ones).
//! - **Restores** the holdings a live PortAllocation's status records when the pool lost them:
//!   `status.poolUID` names another pool object (the pool was recreated) and the pool has no
//!   entry for the UID. Only slots its spec still asks for, only ports inside the pool, and only
//!   ports nobody else holds; a conflict is reported, never forced.
//! - **Reports** what it must not decide alone: a port held by two entries, a held port outside
//!   the pool's ranges or excluded, an unreadable entry of a live object, and statuses that are
//!   merely stale (`status.poolUID` is this pool but the pool has no entry: a release or
//!   scale-down was interrupted after its pool write; `sync` corrects the status). Repair never
//!   moves a live workload's port: a duplicate or an excluded port may be in use by a running
//!   pod, and which side should move is a decision for a person (`release`, then `sync`).
//!
//! The diff is computed by [`plan_repair`], a pure function of one pool read and one list; the
//! Kubernetes layer (`k8s::repair`) does the reads and the compare-and-swap write.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use serde::Serialize;

use super::repair_restore::restore_lost;
use super::window_record::{Anomaly, HolderEntry, WindowRecord};
use crate::api::{PoolHolder, PortAllocation, PortPoolShardStatus};
use crate::core::{PortBlock, PortRange};

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

/// One change repair makes to a pool's status.
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
    /// Sharded pool: delete a shard object left by an earlier pool object of the same name (it
    /// would block this pool's shard for its window; statuses restore what it held).
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
    /// Sharded pool: a pool port listed in a shard whose window does not contain it.
    #[serde(rename_all = "camelCase")]
    WrongShard {
        shard: String,
        uid: String,
        owner: String,
        slot: String,
        port: u16,
    },
    /// Sharded pool: one port listed in two shards.
    #[serde(rename_all = "camelCase")]
    HeldInTwoShards {
        port: u16,
        first: String,
        first_shard: String,
        second: String,
        second_shard: String,
    },
    /// Sharded pool: an owner's slot listed in several shards in pieces that do not join.
    #[serde(rename_all = "camelCase")]
    SlotApart {
        uid: String,
        slot: String,
        shards: Vec<String>,
    },
    /// Sharded pool: a shard object that is not part of the record (another pool's, an earlier
    /// pool object's, a malformed one, or a second one for a window).
    #[serde(rename_all = "camelCase")]
    NotLoaded { shard: String, reason: String },
}

/// A PortAllocation whose holdings a plan restores; it is synced after the write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// What repair would do to one pool, computed from one read of the pool and one later list.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairPlan {
    pub pool: String,
    pub pool_uid: String,
    /// The resourceVersion read: the write is a compare-and-swap on it.
    pub resource_version: String,
    pub changes: Vec<Change>,
    pub findings: Vec<Finding>,
    /// Holders and held ports after the changes.
    pub holders: usize,
    pub held_ports: u32,
    /// The holders after the changes (several copies of a pool may name one twice).
    #[serde(skip)]
    pub holders_after: BTreeSet<String>,
    /// The status to write; `None` when nothing changes.
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

/// The diff for one pool. `allocations` is every PortAllocation in the cluster, listed *after*
/// the pool was read (see the module docs for why that order matters). Pure.
pub fn plan_repair(record: &WindowRecord, allocations: &[PortAllocation]) -> RepairPlan {
    plan_repair_scoped(record, allocations, &RepairScope::default())
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

/// [`plan_repair`] over one part of a pool (see [`RepairScope`]): free the dead entries,
/// report what the kept ones say that should not be so, restore what the pool lost, and
/// recount.
pub(crate) fn plan_repair_scoped(
    record: &WindowRecord,
    allocations: &[PortAllocation],
    scope: &RepairScope,
) -> RepairPlan {
    let by_uid: BTreeMap<String, &PortAllocation> = allocations
        .iter()
        .filter_map(|pa| pa.uid().map(|uid| (uid, pa)))
        .collect();
    let (freed, mut changes) = free_dead_entries(record, &by_uid);
    let mut findings = kept_anomalies(record, &freed);
    let (mut held, duplicates) = kept_ports(record, &freed, &by_uid);
    findings.extend(duplicates);
    // Ports other shards list are taken as far as restoring goes (their anomaly is reported).
    for (port, owner) in &scope.held_elsewhere {
        held.entry(*port).or_insert_with(|| owner.clone());
    }
    let restoring = restore_lost(record, allocations, scope, &mut held);
    changes.extend(restoring.changes);
    findings.extend(restoring.findings);
    let raw = record.entries();
    let holders: Vec<PoolHolder> = raw
        .iter()
        .filter(|h| !freed.contains(&h.uid))
        .cloned()
        .chain(restoring.added)
        .collect();
    finish(record, holders, changes, findings, restoring.restored)
}

/// 1. Entries whose owner is gone, or is an object of another pool: their UIDs, and the frees.
fn free_dead_entries(
    record: &WindowRecord,
    by_uid: &BTreeMap<String, &PortAllocation>,
) -> (BTreeSet<String>, Vec<Change>) {
    let mut freed = BTreeSet::new();
    let mut changes = Vec::new();
    for entry in record.entries() {
        let reason = match by_uid.get(&entry.uid) {
            None => FreeReason::OwnerGone,
            Some(pa) if pa.spec.pool != record.pool_name() => FreeReason::OtherPool {
                pool: pa.spec.pool.clone(),
            },
            Some(_) => continue,
        };
        let count = record
            .holders
            .get(&entry.uid)
            .map_or(0, |h| h.holdings.port_count() as usize);
        freed.insert(entry.uid.clone());
        changes.push(Change::Free {
            uid: entry.uid.clone(),
            owner: entry.owner.clone(),
            ports: entry.ports.clone(),
            count,
            reason,
        });
    }
    (freed, changes)
}

/// 2. What the kept entries say that should not be so: reported, never changed.
fn kept_anomalies(record: &WindowRecord, freed: &BTreeSet<String>) -> Vec<Finding> {
    let mut findings = Vec::new();
    for anomaly in &record.anomalies {
        match anomaly {
            Anomaly::Undecodable { uid, owner, error } if !freed.contains(uid) => {
                findings.push(Finding::Undecodable {
                    uid: uid.clone(),
                    owner: owner.clone(),
                    error: error.clone(),
                });
            }
            Anomaly::OutsidePool {
                uid,
                owner,
                slot,
                port,
            } if !freed.contains(uid) => findings.push(Finding::OutsidePool {
                uid: uid.clone(),
                owner: owner.clone(),
                slot: slot.to_string(),
                port: *port,
            }),
            _ => {}
        }
    }
    findings
}

/// Who holds each port among the kept entries, and the ports two of them hold. Duplicates
/// among the kept entries only: freeing a dead entry resolves its duplicates. Kept entries are
/// visited oldest PortAllocation first, so `second` (the one a person would move) is the
/// younger holder.
fn kept_ports(
    record: &WindowRecord,
    freed: &BTreeSet<String>,
    by_uid: &BTreeMap<String, &PortAllocation>,
) -> (BTreeMap<u16, String>, Vec<Finding>) {
    let age = |uid: &str| by_uid.get(uid).map(|pa| creation_order(pa));
    let mut kept: Vec<(&String, &HolderEntry)> = record
        .holders
        .iter()
        .filter(|(uid, _)| !freed.contains(*uid))
        .collect();
    kept.sort_by_key(|(uid, _)| (age(uid), (*uid).clone()));
    let mut held: BTreeMap<u16, String> = BTreeMap::new();
    let mut duplicates = Vec::new();
    for (_, entry) in kept {
        for port in entry.holdings.ports() {
            if let Some(first) = held.get(&port) {
                duplicates.push(Finding::Duplicate {
                    port,
                    first: first.clone(),
                    second: entry.owner.clone(),
                });
            } else {
                held.insert(port, entry.owner.clone());
            }
        }
    }
    (held, duplicates)
}

/// Oldest first, then by namespace and name: a deterministic order of PortAllocations.
pub(super) fn creation_order(pa: &PortAllocation) -> impl Ord + use<> {
    (
        pa.metadata.creation_timestamp.clone(),
        pa.namespace(),
        pa.name_any(),
    )
}

/// 4. The plan: the status after the changes, counts recomputed from the resulting holders.
fn finish(
    record: &WindowRecord,
    mut holders: Vec<PoolHolder>,
    mut changes: Vec<Change>,
    findings: Vec<Finding>,
    restored: Vec<Restored>,
) -> RepairPlan {
    holders.sort_by(|a, b| a.uid.cmp(&b.uid));
    // Counted over the record's own ports (a shard's are its window's).
    let recounted = record
        .after(PortPoolShardStatus {
            holders,
            ..Default::default()
        })
        .current_status();
    let stored = record.shard.status.clone().unwrap_or_default();
    let behind = stored.pool_spec.is_none() || stored.pool_generation < record.pool.generation;
    if changes.is_empty() && behind && record.resource_version().is_some() {
        changes.push(Change::Respec {
            shard: record.name().to_string(),
            generation: record.pool.generation,
        });
    } else if changes.is_empty() && counts(&recounted) != counts(&stored) {
        changes.push(Change::Recount {
            size: recounted.size,
            allocated: recounted.allocated,
            available: recounted.available,
            holder_count: recounted.holder_count,
        });
    }
    RepairPlan {
        pool: record.pool_name().to_string(),
        pool_uid: record.pool_uid().to_string(),
        resource_version: record.resource_version().unwrap_or_default(),
        holders: recounted.holders.len(),
        holders_after: recounted.holders.iter().map(|h| h.uid.clone()).collect(),
        held_ports: recounted.allocated.max(0) as u32,
        status: (!changes.is_empty()).then_some(recounted),
        changes,
        findings,
        restored,
    }
}

fn counts(status: &PortPoolShardStatus) -> (i32, i32, i32, i32) {
    (
        status.size,
        status.allocated,
        status.available,
        status.holder_count,
    )
}

pub(super) fn describe_ports(record: &WindowRecord) -> String {
    if record.ports.is_empty() {
        "none (every port is excluded)".into()
    } else {
        record.ports.to_string()
    }
}

#[cfg(test)]
#[path = "repair_plan_tests.rs"]
mod tests;

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
//! 1. list the pool's shards, at revision `R`;
//! 2. *then* list every PortAllocation (a consistent list, served at a revision after `R`).
//!
//! A client writes a shard entry only for a PortAllocation that exists: the entry is keyed by
//! the object's UID, which the API server assigns when the object is created. So every entry in
//! a shard at `R` belongs to an object created before `R`; if the list taken after `R` does not
//! contain that UID, the object has been deleted, and a UID never comes back. Such an entry is a
//! genuine leak, never an allocation in flight. Allocations that land after `R` are not in what
//! we read at all, and each shard's write is a compare-and-swap on the version listed: if
//! anything wrote that shard since, the write fails with 409 and repair starts again from step
//! 1. A concurrent allocation can therefore never lose its ports to repair.
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
//!   scale-down was interrupted after its shard write; `sync` corrects the status). Repair never
//!   moves a live workload's port: a duplicate or an excluded port may be in use by a running
//!   pod, and which side should move is a decision for a person (`release`, then `sync`).
//!
//! The diff is computed by [`plan_repair`], a pure function of one shard as listed and one list
//! of PortAllocations; the Kubernetes layer (`k8s::repair`) does the reads and the
//! compare-and-swap writes.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;

use super::repair_outcome::{
    Change, Finding, FreeReason, RepairPlan, RepairScope, Restored, UnmarkReason,
};
use super::repair_restore::{creation_order, restore_lost};
use crate::api::{PlacedElsewhere, PoolHolder, PortAllocation, PortPoolShardStatus};
use crate::ledger::record::known_shards::listed_shards;
use crate::ledger::record::window_record::{Anomaly, HolderEntry, WindowRecord};

/// The diff for one shard. `allocations` is every PortAllocation in the cluster, listed *after*
/// the shard was (see the module docs for why that order matters). Pure.
pub fn plan_repair(record: &WindowRecord, allocations: &[PortAllocation]) -> RepairPlan {
    plan_repair_scoped(record, allocations, &RepairScope::default())
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
    let (elsewhere, unmarks) = still_elsewhere(record, &by_uid);
    changes.extend(unmarks);
    finish(
        record,
        (holders, elsewhere),
        changes,
        findings,
        restoring.restored,
    )
}

/// The marks of `status.elsewhere` still needed (a live PortAllocation of this pool whose
/// status names no shards: a group commit may have placed it anywhere), and the others' unmarks.
/// As with entries, a UID the later list lacks is gone for good.
fn still_elsewhere(
    record: &WindowRecord,
    by_uid: &BTreeMap<String, &PortAllocation>,
) -> (Vec<PlacedElsewhere>, Vec<Change>) {
    let mut kept = Vec::new();
    let mut unmarks = Vec::new();
    for mark in record.elsewhere() {
        let reason = match by_uid.get(&mark.uid) {
            Some(pa) if pa.spec.pool == record.pool_name() => {
                if listed_shards(pa.status.as_ref()).is_empty() {
                    kept.push(mark.clone());
                    continue;
                }
                UnmarkReason::StatusNamesShards
            }
            _ => UnmarkReason::OwnerGone,
        };
        unmarks.push(Change::Unmark {
            uid: mark.uid.clone(),
            owner: mark.owner.clone(),
            reason,
        });
    }
    (kept, unmarks)
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

/// 4. The plan: the status after the changes, counts recomputed from the resulting holders.
fn finish(
    record: &WindowRecord,
    (mut holders, elsewhere): (Vec<PoolHolder>, Vec<PlacedElsewhere>),
    mut changes: Vec<Change>,
    findings: Vec<Finding>,
    restored: Vec<Restored>,
) -> RepairPlan {
    holders.sort_by(|a, b| a.uid.cmp(&b.uid));
    // Counted over the record's own ports (a shard's are its window's).
    let recounted = record
        .after(PortPoolShardStatus {
            holders,
            elsewhere,
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

#[cfg(test)]
#[path = "repair_plan_tests.rs"]
mod tests;

//! `repair` of a pool (docs/record-at-scale.md, section 5): [`plan_repair`] run once per
//! shard, each shard being one record of its window's ports.
//!
//! The one-pass argument holds per shard: the shards are listed (one LIST, at revision `R`),
//! then the PortAllocations (served after `R`). Every entry in a shard at `R` was written for an
//! object that existed before `R`, so a UID missing from the later list is a leak. A spanning
//! owner is live or gone as a whole, so its parts are freed together or kept together. Each
//! changed shard is written with a compare-and-swap on the version listed; a shard that was
//! missing is created, which fails if anyone created it meanwhile.
//!
//! Each shard is given only the pieces of PortAllocation statuses that lie in its window, so an
//! owner holding ports in two shards is never "outside the pool" in the other one. Two restore
//! cases: "pool recreated" (statuses naming an earlier pool UID are restored into the current
//! shards), and a shard missing for a window where statuses naming this very pool object record
//! ports, which is recreated with those holdings. Cross-shard
//! anomalies are reported, never moved. Shards of an earlier pool object of the same name are
//! deleted (a garbage collector would have; none may run): they would block this pool's.
//!
//! A pool with reuse is repaired copy by copy: an owner's status names the copy its ports are
//! in (`recorded_copies`: one copy, or each pod's where its workload is spread), so its
//! holdings are restored there; whether an entry's owner is alive is
//! asked of every copy alike.
//!
//! [`plan_repair`]: crate::ledger::plan_repair

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;

use super::repair_outcome::{Change, Finding, RepairPlan, RepairScope, Restored};
use super::repair_plan::plan_repair_scoped;
use crate::api::{PortAllocation, PortPoolShard};
use crate::ledger::allocation_status::{recorded_copy_set, recorded_holdings_in};
use crate::ledger::record::copy_record::CopyRecord;
use crate::ledger::record::holdings_across_shards::ShardAnomaly;
use crate::ledger::record::pool_record::PoolRecord;
use crate::ledger::record::shard_record::{ShardWrite, load_shard, new_shard};
use crate::ledger::record::windows::{ShardKey, shard_name, window, window_of};

/// A shard object left by an earlier pool object of the same name: deleted before the writes
/// (with its UID as precondition). A garbage collector would have deleted it with its pool; the
/// local control plane runs none, and the shard would block this pool's shard of its window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleShard {
    pub name: String,
    pub uid: String,
    /// The earlier pool object's UID, as the shard names it.
    pub pool_uid: String,
}

/// What repair does to a pool: the plan over all its shards and the writes that carry it out.
#[derive(Clone, Debug)]
pub struct PoolRepairPlan {
    /// Every shard's changes and findings, plus the cross-shard findings; `status` is `None`
    /// (the PortPool's status is not written; the shards are).
    pub plan: RepairPlan,
    /// One write per changed shard, ascending by window.
    pub writes: Vec<ShardWrite>,
    /// Earlier pool objects' shards to delete before the writes (each also a `RemoveShard`).
    pub replace: Vec<StaleShard>,
}

/// The repair of a pool: `record` from one LIST of its shards (`listed`, the same objects,
/// loaded or not), `allocations` listed after it. Pure.
pub fn plan_pool_repair(
    record: &PoolRecord,
    listed: &[PortPoolShard],
    allocations: &[PortAllocation],
) -> PoolRepairPlan {
    let pool_name = record.name().to_string();
    // Shards of earlier pool objects of this name: a garbage collector would have deleted them
    // with their pool (none may run); they would block this pool's shards, so they go.
    let mut replace: Vec<StaleShard> = listed
        .iter()
        .filter(|s| s.spec.pool == pool_name && s.spec.pool_uid != record.pool.uid)
        .map(|s| StaleShard {
            name: s.name_any(),
            uid: s.uid().unwrap_or_default(),
            pool_uid: s.spec.pool_uid.clone(),
        })
        .collect();
    replace.sort_by(|a, b| a.name.cmp(&b.name));
    // Copies whose shards exist, and copies that statuses name (their shards may be lost).
    let mut copies: BTreeSet<u16> = record.copies.keys().copied().collect();
    copies.extend(
        allocations
            .iter()
            .filter(|pa| pa.spec.pool == pool_name)
            .filter_map(|pa| pa.status.as_ref())
            .filter(|status| !status.shards.is_empty())
            .flat_map(recorded_copy_set),
    );
    let mut whole: Option<PoolRepairPlan> = None;
    for copy in copies {
        let part = plan_copy_repair(&record.copy_or_empty(copy), listed, allocations, &replace);
        whole = Some(match whole {
            None => part,
            Some(mut whole) => {
                let plan = &mut whole.plan;
                plan.changes.extend(part.plan.changes);
                plan.findings.extend(part.plan.findings);
                plan.holders_after.extend(part.plan.holders_after);
                plan.held_ports += part.plan.held_ports;
                for r in part.plan.restored {
                    if !plan.restored.iter().any(|seen| seen.uid == r.uid) {
                        plan.restored.push(r);
                    }
                }
                whole.writes.extend(part.writes);
                whole
            }
        });
    }
    let mut whole = whole.expect("copy 0 is always repaired");
    whole.plan.holders = whole.plan.holders_after.len();
    whole
        .plan
        .findings
        .extend(record.anomalies.iter().filter_map(|anomaly| match anomaly {
            ShardAnomaly::NotLoaded { name, reason } => Some(Finding::NotLoaded {
                shard: name.clone(),
                reason: reason.clone(),
            }),
            _ => None,
        }));
    whole
}

/// The repair of one copy of a pool (all of it without reuse).
fn plan_copy_repair(
    sharded: &CopyRecord,
    listed: &[PortPoolShard],
    allocations: &[PortAllocation],
    replace: &[StaleShard],
) -> PoolRepairPlan {
    let missing = missing_windows(sharded, listed, allocations, replace);
    let mut tally = CopyTally {
        changes: stale_shard_removals(sharded, listed, replace),
        ..CopyTally::default()
    };
    let windows: BTreeSet<u16> = sharded.shards.keys().copied().chain(missing).collect();
    for k in windows {
        tally.repair_window(sharded, allocations, k);
    }
    let CopyTally {
        changes,
        mut findings,
        writes,
        restored,
        freed,
        freed_uids,
        holders_after,
        held_after,
    } = tally;
    findings.extend(cross_shard_findings(sharded, &freed, &freed_uids, replace));
    PoolRepairPlan {
        plan: RepairPlan {
            pool: sharded.name().to_string(),
            pool_uid: sharded.pool.uid.clone(),
            changes,
            findings,
            holders: holders_after.len(),
            holders_after,
            held_ports: held_after,
            status: None,
            restored,
        },
        writes,
        replace: replace.to_vec(),
    }
}

/// Windows without a loaded shard where a live PortAllocation of the pool records ports in
/// this copy: their shards were lost, and repair recreates them with those holdings.
fn missing_windows(
    sharded: &CopyRecord,
    listed: &[PortPoolShard],
    allocations: &[PortAllocation],
    replace: &[StaleShard],
) -> BTreeSet<u16> {
    let pool_name = sharded.name();
    let mut missing: BTreeSet<u16> = BTreeSet::new();
    for pa in allocations.iter().filter(|pa| pa.spec.pool == pool_name) {
        let Some(status) = pa.status.as_ref() else {
            continue;
        };
        missing.extend(
            recorded_holdings_in(status, sharded.copy)
                .ports()
                .map(window_of)
                .filter(|k| !sharded.shards.contains_key(k)),
        );
    }
    missing.retain(|&k| {
        let name = shard_name(pool_name, ShardKey::new(sharded.copy, k));
        // Something else holds the name (reported as not loaded): leave the window alone.
        !listed
            .iter()
            .any(|s| s.name_any() == name && !replace.iter().any(|r| r.name == name))
    });
    missing
}

/// The removal of each stale shard listed in this copy: a stale shard is removed once, by the
/// repair of the copy it was listed in.
fn stale_shard_removals(
    sharded: &CopyRecord,
    listed: &[PortPoolShard],
    replace: &[StaleShard],
) -> Vec<Change> {
    replace
        .iter()
        .filter(|r| {
            listed
                .iter()
                .any(|s| s.name_any() == r.name && s.spec.copy == i32::from(sharded.copy))
        })
        .map(|r| Change::RemoveShard {
            shard: r.name.clone(),
            pool_uid: r.pool_uid.clone(),
        })
        .collect()
}

/// What the windows of one copy add up to, gathered window by window.
#[derive(Default)]
struct CopyTally {
    changes: Vec<Change>,
    findings: Vec<Finding>,
    writes: Vec<ShardWrite>,
    restored: Vec<Restored>,
    /// The (window, owner) of every freed entry: the cross-shard anomalies they resolve are
    /// not reported.
    freed: BTreeSet<(u16, String)>,
    freed_uids: BTreeSet<String>,
    holders_after: BTreeSet<String>,
    held_after: u32,
}

impl CopyTally {
    /// Plans window `k` of this copy as one record and adds its changes, findings and write.
    fn repair_window(&mut self, sharded: &CopyRecord, allocations: &[PortAllocation], k: u16) {
        let key = ShardKey::new(sharded.copy, k);
        let loaded = sharded.shards.get(&k);
        let record = match loaded {
            Some(shard) => shard.record.clone(),
            None => load_shard(
                &sharded.pool,
                &sharded.layout,
                k,
                new_shard(&sharded.pool, key),
            ),
        };
        let name = record.name().to_string();
        let resource_version = loaded.and_then(|_| record.resource_version());
        let scope = RepairScope {
            window: Some(window(k)),
            restore_own: loaded.is_none(),
            held_elsewhere: held_elsewhere(sharded, k),
            copy: Some(sharded.copy),
        };
        let mut plan = plan_repair_scoped(&record, allocations, &scope);
        if loaded.is_none() {
            // An absent shard is an empty record: counts alone never create it.
            plan.changes
                .retain(|c| !matches!(c, Change::Recount { .. }));
        }
        for change in &plan.changes {
            if let Change::Free { uid, owner, .. } = change {
                self.freed.insert((k, owner.clone()));
                self.freed_uids.insert(uid.clone());
            }
        }
        self.findings.extend(
            plan.findings
                .into_iter()
                .map(|finding| in_wrong_shard(sharded, &name, finding)),
        );
        let after = match plan.status.take().filter(|_| !plan.changes.is_empty()) {
            Some(status) => {
                self.writes.push(ShardWrite {
                    key,
                    name,
                    resource_version,
                    status: status.clone(),
                });
                Some(status)
            }
            None => loaded.map(|_| record.current_status()),
        };
        if let Some(after) = after {
            self.holders_after
                .extend(after.holders.iter().map(|h| h.uid.clone()));
            self.held_after += after.allocated.max(0) as u32;
        }
        self.changes.append(&mut plan.changes);
        for r in plan.restored {
            if !self.restored.iter().any(|seen| seen.uid == r.uid) {
                self.restored.push(r);
            }
        }
    }
}

/// A port outside the shard's window but inside the pool is in the wrong shard, not outside
/// the pool: the shard alone cannot tell the two apart.
fn in_wrong_shard(sharded: &CopyRecord, shard: &str, finding: Finding) -> Finding {
    match finding {
        Finding::OutsidePool {
            uid,
            owner,
            slot,
            port,
        } if sharded.ports.contains(port) => Finding::WrongShard {
            shard: shard.to_string(),
            uid,
            owner,
            slot,
            port,
        },
        other => other,
    }
}

/// Ports of window `k` that other shards list, with their owners.
fn held_elsewhere(sharded: &CopyRecord, k: u16) -> BTreeMap<u16, String> {
    let mut held = BTreeMap::new();
    for shard in sharded.shards.values().filter(|s| s.index != k) {
        for entry in shard.record.holders.values() {
            for port in entry.holdings.ports().filter(|&p| window_of(p) == k) {
                held.entry(port).or_insert_with(|| entry.owner.clone());
            }
        }
    }
    held
}

/// The anomalies only the view of all shards sees, minus those that freeing dead entries
/// resolves. Per-shard ones (and `WrongShard`) come from each shard's own plan.
fn cross_shard_findings(
    sharded: &CopyRecord,
    freed: &BTreeSet<(u16, String)>,
    freed_uids: &BTreeSet<String>,
    replace: &[StaleShard],
) -> Vec<Finding> {
    let name_of = |k: u16| {
        sharded
            .shards
            .get(&k)
            .map(|s| s.record.name().to_string())
            .unwrap_or_else(|| shard_name(sharded.name(), ShardKey::new(sharded.copy, k)))
    };
    let mut findings = Vec::new();
    for anomaly in &sharded.anomalies {
        match anomaly {
            ShardAnomaly::HeldInTwoShards {
                port,
                first,
                second,
            } if !freed.contains(first) && !freed.contains(second) => {
                findings.push(Finding::HeldInTwoShards {
                    port: *port,
                    first: first.1.clone(),
                    first_shard: name_of(first.0),
                    second: second.1.clone(),
                    second_shard: name_of(second.0),
                });
            }
            ShardAnomaly::SlotApart { uid, slot, shards } if !freed_uids.contains(uid) => {
                findings.push(Finding::SlotApart {
                    uid: uid.clone(),
                    slot: slot.to_string(),
                    shards: shards.iter().map(|&k| name_of(k)).collect(),
                });
            }
            ShardAnomaly::NotLoaded { name, reason }
                if !replace.iter().any(|r| &r.name == name) =>
            {
                findings.push(Finding::NotLoaded {
                    shard: name.clone(),
                    reason: reason.clone(),
                })
            }
            _ => {}
        }
    }
    findings
}

#[cfg(test)]
#[path = "pool_repair_tests.rs"]
mod tests;

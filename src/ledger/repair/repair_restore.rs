//! Step 3 of a repair plan ([`super::repair_plan`]): the holdings the pool lost, restored from
//! what live PortAllocations' statuses record, oldest PortAllocation first so the outcome is
//! deterministic. Only slots the spec still asks for, only ports inside the pool and held by
//! nobody else; everything else is reported, never forced.

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::repair_outcome::{Change, Finding, RepairScope, Restored, describe_ports};
use crate::api::{PoolHolder, PortAllocation, PortAllocationStatus, SpecError};
use crate::core::{Holdings, PortBlock, SlotKey, desired_slots};
use crate::ledger::allocation_status::{recorded_holdings, recorded_holdings_in};
use crate::ledger::owner_of;
use crate::ledger::record::window_record::WindowRecord;

/// Oldest first, then by namespace and name: a deterministic order of PortAllocations.
pub(super) fn creation_order(pa: &PortAllocation) -> impl Ord + use<> {
    (
        pa.metadata.creation_timestamp.clone(),
        pa.namespace(),
        pa.name_any(),
    )
}

/// What restoring found and would write.
#[derive(Default)]
pub(super) struct Restoring {
    pub changes: Vec<Change>,
    pub findings: Vec<Finding>,
    /// The entries to add.
    pub added: Vec<PoolHolder>,
    pub restored: Vec<Restored>,
}

/// Restore every live PortAllocation of the pool that `record` has no entry for; `held` (who
/// holds each port) grows with what is restored.
pub(super) fn restore_lost(
    record: &WindowRecord,
    allocations: &[PortAllocation],
    scope: &RepairScope,
    held: &mut BTreeMap<u16, String>,
) -> Restoring {
    let mut live: Vec<&PortAllocation> = allocations
        .iter()
        .filter(|pa| pa.spec.pool == record.pool_name() && pa.uid().is_some())
        .collect();
    live.sort_by_key(|pa| creation_order(pa));
    let mut restoring = Restoring::default();
    for pa in live {
        let uid = pa.uid().unwrap_or_default();
        if record.holders.contains_key(&uid) || record.opaque.contains_key(&uid) {
            continue;
        }
        let Some(status) = pa.status.as_ref() else {
            continue;
        };
        let holdings = restorable(record, pa, status, scope, held, &mut restoring.findings);
        if holdings.is_empty() {
            continue;
        }
        let owner = owner_of(pa);
        for port in holdings.ports() {
            held.insert(port, owner.clone());
        }
        restoring.changes.push(Change::Restore {
            uid: uid.clone(),
            owner: owner.clone(),
            ports: holdings.encode(),
            count: holdings.port_count() as usize,
        });
        restoring.added.push(PoolHolder {
            uid: uid.clone(),
            owner,
            ports: holdings.encode(),
        });
        restoring.restored.push(Restored {
            uid,
            namespace: pa.namespace().unwrap_or_default(),
            name: pa.name_any(),
        });
    }
    restoring
}

/// The part of `pa`'s recorded holdings this record may take back; what it may not is reported
/// in `findings`.
fn restorable(
    record: &WindowRecord,
    pa: &PortAllocation,
    status: &PortAllocationStatus,
    scope: &RepairScope,
    held: &BTreeMap<u16, String>,
    findings: &mut Vec<Finding>,
) -> Holdings {
    // Of a pool with reuse, only what the status records in this copy.
    let recorded = match scope.copy {
        Some(copy) => recorded_holdings_in(status, copy),
        None => recorded_holdings(status),
    };
    // The part of the recorded holdings this record covers (all of it for a whole pool).
    let here: Holdings = recorded
        .iter()
        .filter_map(|(slot, block)| scope.piece(block).map(|piece| (slot.clone(), piece)))
        .collect();
    if here.is_empty() {
        return Holdings::new();
    }
    let owner = owner_of(pa);
    if let Some(why) = stale_status_reason(record, status, scope) {
        findings.push(Finding::StaleStatus {
            owner,
            recorded: here.encode(),
            why: why.to_string(),
        });
        return Holdings::new();
    }
    let desired = match pa.spec.demands() {
        Ok(demands) => desired_slots(&demands),
        Err(SpecError { field, message }) => {
            for (slot, block) in here.iter() {
                findings.push(Finding::RestoreSkipped {
                    owner: owner.clone(),
                    slot: slot.to_string(),
                    port: block.first,
                    why: format!("its spec is invalid ({field}: {message})"),
                });
            }
            return Holdings::new();
        }
    };
    let mut holdings = Holdings::new();
    for (slot, whole) in recorded.iter() {
        // The spec is checked against the whole block; only its piece here is restored.
        let Some(block) = scope.piece(whole) else {
            continue;
        };
        let skip = |why: String| Finding::RestoreSkipped {
            owner: owner.clone(),
            slot: slot.to_string(),
            port: block.first,
            why,
        };
        let want = desired.get(slot).map(|w| (w.count, w.requested));
        if let Some(why) = spec_mismatch(whole, want) {
            findings.push(skip(why));
            continue;
        }
        match taken(record, scope, held, &owner, slot, block) {
            Taken::Free => {}
            Taken::AlreadyOwners => continue,
            Taken::Skip(why) => {
                findings.push(skip(why));
                continue;
            }
            Taken::Conflict(finding) => {
                findings.push(finding);
                continue;
            }
        }
        if holdings.iter().any(|(_, other)| other.overlaps(&block)) {
            findings.push(skip("it records this port for another slot too".into()));
            continue;
        }
        holdings.insert_block(slot.clone(), block);
    }
    holdings
}

/// Why a status that records holdings the record lacks is only stale, not a loss to restore:
/// `None` when its holdings are to be restored.
fn stale_status_reason(
    record: &WindowRecord,
    status: &PortAllocationStatus,
    scope: &RepairScope,
) -> Option<&'static str> {
    match status.pool_uid.as_deref() {
        Some(recorded_uid) if recorded_uid == record.pool_uid() && scope.restore_own => None,
        Some(recorded_uid) if recorded_uid == record.pool_uid() => Some(
            "its status names this pool object, which has no entry for it: a release or \
             scale-down was interrupted after its shard write",
        ),
        None => Some("its status names no pool object (poolUID is unset)"),
        Some(_) => None,
    }
}

/// Why a recorded block no longer fits its spec's slot (`want`: its count and requested port).
fn spec_mismatch(whole: PortBlock, want: Option<(u32, Option<u16>)>) -> Option<String> {
    match want {
        None => Some("its spec no longer asks for this slot".into()),
        Some((count, _)) if u32::from(whole.count) != count => Some(format!(
            "it records {whole} ({} ports) but its spec now asks for {count}",
            whole.count
        )),
        Some((_, Some(requested))) if requested != whole.first => {
            Some(format!("its spec now requests port {requested}"))
        }
        Some(_) => None,
    }
}

/// Whether a block can be restored as far as the pool's ports and their holders go.
enum Taken {
    Free,
    /// Another shard's entry of this owner holds it already (reported as in the wrong shard).
    AlreadyOwners,
    Skip(String),
    Conflict(Finding),
}

fn taken(
    record: &WindowRecord,
    scope: &RepairScope,
    held: &BTreeMap<u16, String>,
    owner: &str,
    slot: &SlotKey,
    block: PortBlock,
) -> Taken {
    // Every port of a block must be restorable, or none of it is restored.
    if let Some(port) = block.ports().find(|&p| !record.ports.contains(p)) {
        let what = if block.is_single() {
            String::new()
        } else {
            format!("port {port} of {block} is outside: ")
        };
        return Taken::Skip(format!(
            "{what}the pool's ports are now {}",
            describe_ports(record)
        ));
    }
    let Some((port, holder)) = block
        .ports()
        .find_map(|p| held.get(&p).map(|holder| (p, holder)))
    else {
        return Taken::Free;
    };
    // Only another shard's entry can name this owner here.
    if scope.held_elsewhere.get(&port).map(String::as_str) == Some(owner) {
        return Taken::AlreadyOwners;
    }
    Taken::Conflict(Finding::RestoreConflict {
        owner: owner.to_string(),
        slot: slot.to_string(),
        port,
        holder: holder.clone(),
    })
}

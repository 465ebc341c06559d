//! `repair`: make a pool's record match the live PortAllocations again.
//!
//! The pool's `status.holders` is the authoritative record of who holds which port. Two things
//! can make it disagree with the cluster: an entry whose PortAllocation is gone (a `delete`
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
//! The diff is computed by [`plan_repair`], a pure function of one pool read and one list.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Instant;

use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use super::allocation_status::recorded_holdings;
use super::allocator::{AllocateError, Allocator, SyncReport, owner_of, retry_cause};
use super::pool_record::{Anomaly, PoolRecord};
use super::retry::{Attempts, Exhausted, RetryCause, RetryPolicy};
use super::{KubeError, Op, explain};
use crate::api::{PoolHolder, PortAllocation, PortPool, PortPoolStatus, SpecError};
use crate::core::{Holdings, desired_slots};

const POOLS: &str = "portpools.portalloc.dev";
const POOL_STATUS: &str = "portpools.portalloc.dev/status";
const ALLOCATIONS: &str = "portallocations.portalloc.dev";

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
    /// The status to write; `None` when nothing changes.
    #[serde(skip)]
    pub status: Option<PortPoolStatus>,
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
pub fn plan_repair(record: &PoolRecord, allocations: &[PortAllocation]) -> RepairPlan {
    let pool_name = record.name().to_string();
    let pool_uid = record.uid().unwrap_or_default().to_string();
    let by_uid: BTreeMap<String, &PortAllocation> = allocations
        .iter()
        .filter_map(|pa| pa.uid().map(|uid| (uid, pa)))
        .collect();
    let raw: Vec<PoolHolder> = record
        .pool
        .status
        .as_ref()
        .map(|s| s.holders.clone())
        .unwrap_or_default();

    let mut changes = Vec::new();
    let mut findings = Vec::new();

    // 1. Entries whose owner is gone, or is an object of another pool.
    let mut freed = BTreeSet::new();
    for entry in &raw {
        let reason = match by_uid.get(&entry.uid) {
            None => FreeReason::OwnerGone,
            Some(pa) if pa.spec.pool != pool_name => FreeReason::OtherPool {
                pool: pa.spec.pool.clone(),
            },
            Some(_) => continue,
        };
        let count = record
            .holders
            .get(&entry.uid)
            .map_or(0, |h| h.holdings.len());
        freed.insert(entry.uid.clone());
        changes.push(Change::Free {
            uid: entry.uid.clone(),
            owner: entry.owner.clone(),
            ports: entry.ports.clone(),
            count,
            reason,
        });
    }

    // 2. What the kept entries say that should not be so: reported, never changed.
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
    // Duplicates among the kept entries only: freeing a dead entry resolves its duplicates.
    // Kept entries are visited oldest PortAllocation first, so `second` (the one a person would
    // move) is the younger holder.
    let age = |uid: &str| {
        by_uid.get(uid).map(|pa| {
            (
                pa.metadata.creation_timestamp.clone(),
                pa.namespace(),
                pa.name_any(),
            )
        })
    };
    let mut kept: Vec<(&String, &super::HolderEntry)> = record
        .holders
        .iter()
        .filter(|(uid, _)| !freed.contains(*uid))
        .collect();
    kept.sort_by_key(|(uid, _)| (age(uid), (*uid).clone()));
    let mut held: BTreeMap<u16, String> = BTreeMap::new();
    for (_, entry) in kept {
        for port in entry.holdings.ports() {
            if let Some(first) = held.get(&port) {
                findings.push(Finding::Duplicate {
                    port,
                    first: first.clone(),
                    second: entry.owner.clone(),
                });
            } else {
                held.insert(port, entry.owner.clone());
            }
        }
    }

    // 3. Holdings the pool lost, oldest PortAllocation first so the outcome is deterministic.
    let mut live: Vec<&PortAllocation> = allocations
        .iter()
        .filter(|pa| pa.spec.pool == pool_name && pa.uid().is_some())
        .collect();
    live.sort_by_key(|pa| {
        (
            pa.metadata.creation_timestamp.clone(),
            pa.namespace(),
            pa.name_any(),
        )
    });
    let mut added = Vec::new();
    let mut restored = Vec::new();
    for pa in live {
        let uid = pa.uid().unwrap_or_default();
        if record.holders.contains_key(&uid) || record.opaque.contains_key(&uid) {
            continue;
        }
        let Some(status) = pa.status.as_ref() else {
            continue;
        };
        let recorded = recorded_holdings(status);
        if recorded.is_empty() {
            continue;
        }
        let owner = owner_of(pa);
        let why = match status.pool_uid.as_deref() {
            Some(recorded_uid) if recorded_uid == pool_uid => Some(
                "its status names this pool object, which has no entry for it: a release or \
                 scale-down was interrupted after its pool write",
            ),
            None => Some("its status names no pool object (poolUID is unset)"),
            Some(_) => None,
        };
        if let Some(why) = why {
            findings.push(Finding::StaleStatus {
                owner,
                recorded: recorded.encode(),
                why: why.to_string(),
            });
            continue;
        }
        let desired = match pa.spec.demands() {
            Ok(demands) => desired_slots(&demands),
            Err(SpecError { field, message }) => {
                for (slot, port) in recorded.iter() {
                    findings.push(Finding::RestoreSkipped {
                        owner: owner.clone(),
                        slot: slot.to_string(),
                        port,
                        why: format!("its spec is invalid ({field}: {message})"),
                    });
                }
                continue;
            }
        };
        let mut holdings = Holdings::new();
        for (slot, port) in recorded.iter() {
            let skip = |why: String| Finding::RestoreSkipped {
                owner: owner.clone(),
                slot: slot.to_string(),
                port,
                why,
            };
            match desired.get(slot) {
                None => {
                    findings.push(skip("its spec no longer asks for this slot".into()));
                    continue;
                }
                Some(Some(requested)) if *requested != port => {
                    findings.push(skip(format!("its spec now requests port {requested}")));
                    continue;
                }
                Some(_) => {}
            }
            if !record.ports.contains(port) {
                findings.push(skip(format!(
                    "the pool's ports are now {}",
                    describe_ports(record)
                )));
                continue;
            }
            if let Some(holder) = held.get(&port) {
                findings.push(Finding::RestoreConflict {
                    owner: owner.clone(),
                    slot: slot.to_string(),
                    port,
                    holder: holder.clone(),
                });
                continue;
            }
            if holdings.ports().any(|p| p == port) {
                findings.push(skip("it records this port for another slot too".into()));
                continue;
            }
            holdings.insert(slot.clone(), port);
        }
        if holdings.is_empty() {
            continue;
        }
        for port in holdings.ports() {
            held.insert(port, owner.clone());
        }
        changes.push(Change::Restore {
            uid: uid.clone(),
            owner: owner.clone(),
            ports: holdings.encode(),
            count: holdings.len(),
        });
        added.push(PoolHolder {
            uid: uid.clone(),
            owner,
            ports: holdings.encode(),
        });
        restored.push(Restored {
            uid,
            namespace: pa.namespace().unwrap_or_default(),
            name: pa.name_any(),
        });
    }

    // 4. The status after the changes, counts recomputed from the resulting holders.
    let mut holders: Vec<PoolHolder> = raw
        .iter()
        .filter(|h| !freed.contains(&h.uid))
        .cloned()
        .chain(added)
        .collect();
    holders.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut after = record.pool.clone();
    after.status = Some(PortPoolStatus {
        holders: holders.clone(),
        ..Default::default()
    });
    let recounted = PoolRecord::load(after)
        .map(|r| r.current_status())
        .unwrap_or_else(|_| record.current_status());
    let stored = record.pool.status.clone().unwrap_or_default();
    if changes.is_empty() && counts(&recounted) != counts(&stored) {
        changes.push(Change::Recount {
            size: recounted.size,
            allocated: recounted.allocated,
            available: recounted.available,
            holder_count: recounted.holder_count,
        });
    }
    RepairPlan {
        pool: pool_name,
        pool_uid,
        resource_version: record.pool.resource_version().unwrap_or_default(),
        holders: recounted.holders.len(),
        held_ports: recounted.allocated.max(0) as u32,
        status: (!changes.is_empty()).then_some(recounted),
        changes,
        findings,
        restored,
    }
}

fn counts(status: &PortPoolStatus) -> (i32, i32, i32, i32) {
    (
        status.size,
        status.allocated,
        status.available,
        status.holder_count,
    )
}

fn describe_ports(record: &PoolRecord) -> String {
    if record.ports.is_empty() {
        "none (every port is excluded)".into()
    } else {
        record.ports.to_string()
    }
}

fn count_ports(n: usize) -> String {
    if n == 1 {
        "1 port".into()
    } else {
        format!("{n} ports")
    }
}

/// `namespace/name` split for commands the messages suggest.
fn name_and_namespace(owner: &str) -> (&str, &str) {
    owner.split_once('/').map_or(("", owner), |(ns, n)| (n, ns))
}

fn role_of(slot: &str) -> &str {
    slot.split('.').next().unwrap_or(slot)
}

impl Change {
    /// The first word of the change's line: `free`, `restore` or `recount`.
    pub fn verb(&self) -> &'static str {
        match self {
            Change::Free { .. } => "free",
            Change::Restore { .. } => "restore",
            Change::Recount { .. } => "recount",
        }
    }
}

impl Finding {
    /// The first word of the finding's line: `warning`, `stale`, `conflict` or `skip`.
    pub fn verb(&self) -> &'static str {
        match self {
            Finding::Duplicate { .. }
            | Finding::OutsidePool { .. }
            | Finding::Undecodable { .. } => "warning",
            Finding::StaleStatus { .. } => "stale",
            Finding::RestoreConflict { .. } => "conflict",
            Finding::RestoreSkipped { .. } => "skip",
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Free {
                uid,
                owner,
                ports,
                count,
                reason,
            } => {
                let why = match reason {
                    FreeReason::OwnerGone => "its PortAllocation no longer exists".to_string(),
                    FreeReason::OtherPool { pool } => {
                        format!("its PortAllocation allocates from pool {pool:?}")
                    }
                };
                if *count == 0 {
                    write!(f, "{owner} (uid {uid})  unreadable entry {ports:?}: {why}")
                } else {
                    write!(
                        f,
                        "{owner} (uid {uid})  {}: {ports}  ({why})",
                        count_ports(*count)
                    )
                }
            }
            Change::Restore {
                uid,
                owner,
                ports,
                count,
            } => write!(
                f,
                "{owner} (uid {uid})  {}: {ports}  (recorded in its status; the pool lost them)",
                count_ports(*count)
            ),
            Change::Recount {
                size,
                allocated,
                available,
                holder_count,
            } => write!(
                f,
                "size {size}, allocated {allocated}, available {available}, holders {holder_count}"
            ),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Duplicate {
                port,
                first,
                second,
            } => {
                let (name, ns) = name_and_namespace(second);
                write!(
                    f,
                    "port {port} is held by both {first} and {second}: repair never moves a live \
                     workload's port; to move one, `kubectl portalloc release {name} -n {ns} --role ROLE` \
                     then `kubectl portalloc sync {name} -n {ns}`"
                )
            }
            Finding::OutsidePool {
                owner, slot, port, ..
            } => {
                let (name, ns) = name_and_namespace(owner);
                write!(
                    f,
                    "{owner} holds port {port} ({slot}), which is outside the pool's ranges or \
                     excluded; it stays held until moved: `kubectl portalloc release {name} -n {ns} \
                     --role {}` then `kubectl portalloc sync {name} -n {ns}`",
                    role_of(slot)
                )
            }
            Finding::Undecodable { uid, owner, error } => write!(
                f,
                "{owner} (uid {uid}) has an unreadable entry ({error}); it is kept because the \
                 PortAllocation exists: `kubectl portalloc release` and `sync` rewrite it"
            ),
            Finding::StaleStatus {
                owner,
                recorded,
                why,
            } => {
                let (name, ns) = name_and_namespace(owner);
                write!(
                    f,
                    "{owner}: its status records {recorded} but {why}; not restored. \
                     `kubectl portalloc sync {name} -n {ns}` corrects the status"
                )
            }
            Finding::RestoreConflict {
                owner,
                slot,
                port,
                holder,
            } => {
                let (name, ns) = name_and_namespace(owner);
                write!(
                    f,
                    "{owner}: cannot restore port {port} ({slot}), now held by {holder}; \
                     `kubectl portalloc sync {name} -n {ns}` gives that slot a free port"
                )
            }
            Finding::RestoreSkipped {
                owner,
                slot,
                port,
                why,
            } => write!(
                f,
                "{owner}: port {port} ({slot}) recorded in its status is not restored: {why}"
            ),
        }
    }
}

/// Why repairing a pool did not complete.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error(transparent)]
    Kube(#[from] KubeError),

    #[error(
        "PortPool {pool:?} has an unusable spec: {error}; fix it with kubectl edit portpool {pool}"
    )]
    PoolSpec { pool: String, error: SpecError },

    #[error(
        "repair of PortPool {pool:?} gave up after {attempts} attempts in {elapsed_ms} ms ({conflicts} \
         conflicts with other writers of the pool; last: {last}). Nothing was written: it is safe to \
         run the command again"
    )]
    Exhausted {
        pool: String,
        attempts: u32,
        elapsed_ms: u128,
        conflicts: u32,
        last: String,
    },
}

/// What happened after the write to a PortAllocation whose holdings were restored.
#[derive(Debug)]
pub enum FollowUp {
    /// Synced: its status now names the pool's new UID.
    Synced(Box<SyncReport>),
    /// It was deleted meanwhile; its restored entry was freed again.
    Gone {
        owner: String,
        freed: usize,
    },
    Failed {
        owner: String,
        error: AllocateError,
    },
}

/// The outcome of repairing one pool.
#[derive(Debug)]
pub struct PoolRepair {
    pub plan: RepairPlan,
    pub applied: bool,
    pub attempts: u32,
    pub conflicts: u32,
    pub follow_ups: Vec<FollowUp>,
}

/// Reads, plans and (with `apply`) writes, for one pool at a time.
pub struct Repairer {
    client: Client,
    allocator: Allocator,
    pub policy: RetryPolicy,
    pub verbosity: u8,
}

impl Repairer {
    pub fn new(client: Client, allocator: Allocator) -> Self {
        Self {
            client,
            policy: allocator.policy,
            verbosity: allocator.verbosity,
            allocator,
        }
    }

    /// Every pool's name, sorted.
    pub async fn pool_names(&self) -> Result<Vec<String>, KubeError> {
        let pools: Api<PortPool> = Api::all(self.client.clone());
        let mut names: Vec<String> = pools
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| explain(e, &op("list", POOLS, "PortPool", None, None)))?
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Plan one pool's repair and, with `apply`, carry it out with a compare-and-swap on the
    /// resourceVersion read; on 409 start again from the read.
    pub async fn repair_pool(&self, pool: &str, apply: bool) -> Result<PoolRepair, RepairError> {
        let pools: Api<PortPool> = Api::all(self.client.clone());
        let allocations: Api<PortAllocation> = Api::all(self.client.clone());
        let mut attempts = Attempts::new(self.policy);
        loop {
            // (1) The pool first ...
            let object = match pools.get(pool).await {
                Ok(object) => object,
                Err(e) => {
                    self.retry_or_fail(
                        e,
                        &mut attempts,
                        pool,
                        op("get", POOLS, "PortPool", Some(pool), None),
                    )
                    .await?;
                    continue;
                }
            };
            // (2) ... then every PortAllocation: a consistent list (no resourceVersion), so it is
            // served at a revision after the pool read.
            let listed = match allocations.list(&ListParams::default()).await {
                Ok(list) => list.items,
                Err(e) => {
                    self.retry_or_fail(
                        e,
                        &mut attempts,
                        pool,
                        op("list", ALLOCATIONS, "PortAllocation", None, None),
                    )
                    .await?;
                    continue;
                }
            };
            let record =
                PoolRecord::load(object.clone()).map_err(|error| RepairError::PoolSpec {
                    pool: pool.to_string(),
                    error,
                })?;
            let plan = plan_repair(&record, &listed);
            let Some(status) = plan.status.clone().filter(|_| apply) else {
                return Ok(PoolRepair {
                    plan,
                    applied: false,
                    attempts: attempts.attempts,
                    conflicts: attempts.conflicts,
                    follow_ups: Vec::new(),
                });
            };
            let mut updated = object;
            updated.status = Some(status);
            // `updated` carries the resourceVersion read in (1): the compare-and-swap.
            match pools
                .replace_status(pool, &PostParams::default(), &updated)
                .await
            {
                Ok(_) => {
                    let follow_ups = self.follow_up(pool, &plan.restored).await;
                    return Ok(PoolRepair {
                        plan,
                        applied: true,
                        attempts: attempts.attempts,
                        conflicts: attempts.conflicts,
                        follow_ups,
                    });
                }
                Err(e) => {
                    self.retry_or_fail(
                        e,
                        &mut attempts,
                        pool,
                        op("update", POOL_STATUS, "PortPool", Some(pool), None),
                    )
                    .await?
                }
            }
        }
    }

    /// Sync every PortAllocation whose holdings were restored, so its status names the pool's
    /// current UID. One deleted meanwhile gets its restored entry freed again.
    async fn follow_up(&self, pool: &str, restored: &[Restored]) -> Vec<FollowUp> {
        let mut out = Vec::new();
        for r in restored {
            let owner = format!("{}/{}", r.namespace, r.name);
            let api: Api<PortAllocation> = Api::namespaced(self.client.clone(), &r.namespace);
            let current = match api.get_opt(&r.name).await {
                Ok(current) => current,
                Err(e) => {
                    let error = explain(
                        e,
                        &op(
                            "get",
                            ALLOCATIONS,
                            "PortAllocation",
                            Some(&r.name),
                            Some(&r.namespace),
                        ),
                    );
                    out.push(FollowUp::Failed {
                        owner,
                        error: error.into(),
                    });
                    continue;
                }
            };
            match current {
                Some(pa) if pa.uid().as_deref() == Some(r.uid.as_str()) => {
                    match self.allocator.sync(pa, None).await {
                        Ok(report) => out.push(FollowUp::Synced(Box::new(report))),
                        Err(error) => out.push(FollowUp::Failed { owner, error }),
                    }
                }
                _ => match self.allocator.release_holder(pool, &r.uid, &owner).await {
                    Ok(freed) => out.push(FollowUp::Gone { owner, freed }),
                    Err(error) => out.push(FollowUp::Failed { owner, error }),
                },
            }
        }
        out
    }

    /// Sleep before the next round if `err` is worth retrying, else say what failed.
    async fn retry_or_fail(
        &self,
        err: kube::Error,
        attempts: &mut Attempts,
        pool: &str,
        op: Op<'_>,
    ) -> Result<(), RepairError> {
        let Some(cause) = retry_cause(&err) else {
            return Err(explain(err, &op).into());
        };
        let started = Instant::now();
        let described = match &cause {
            RetryCause::Conflict => "409 Conflict (the pool changed since it was read)".to_string(),
            RetryCause::Transient(message) => message.clone(),
        };
        match attempts.retry_after(cause).await {
            Ok(_) => {
                if self.verbosity >= 1 {
                    eprintln!(
                        "repair {pool}: {described} on {} {}; attempt {} after {} ms",
                        op.verb,
                        op.resource,
                        attempts.attempts,
                        started.elapsed().as_millis()
                    );
                }
                Ok(())
            }
            Err(Exhausted {
                attempts,
                elapsed,
                conflicts,
                last,
            }) => Err(RepairError::Exhausted {
                pool: pool.to_string(),
                attempts,
                elapsed_ms: elapsed.as_millis(),
                conflicts,
                last: match last {
                    RetryCause::Conflict => "409 Conflict".to_string(),
                    RetryCause::Transient(message) => message,
                },
            }),
        }
    }
}

fn op<'a>(
    verb: &'a str,
    resource: &'a str,
    kind: &'a str,
    name: Option<&'a str>,
    namespace: Option<&'a str>,
) -> Op<'a> {
    Op {
        verb,
        resource,
        kind,
        name,
        namespace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        PortAllocationSpec, PortAllocationStatus, PortPoolSpec, PortRequest, Role, Scope,
        StaticBandSetting,
    };
    use crate::core::SlotKey;
    use crate::k8s::allocation_status;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const POOL_UID: &str = "pool-uid-2";

    fn pool(holders: &[(&str, &str, &str)]) -> PortPool {
        let mut pool = PortPool::new(
            "p",
            PortPoolSpec {
                ranges: vec!["100-119".into()],
                exclude: vec!["110".into()],
                protocol: Default::default(),
                static_band: StaticBandSetting::None,
            },
        );
        pool.metadata.uid = Some(POOL_UID.into());
        pool.metadata.resource_version = Some("42".into());
        let holders: Vec<PoolHolder> = holders
            .iter()
            .map(|(uid, owner, ports)| PoolHolder {
                uid: (*uid).into(),
                owner: (*owner).into(),
                ports: (*ports).into(),
            })
            .collect();
        let mut with_counts = pool.clone();
        with_counts.status = Some(PortPoolStatus {
            holders: holders.clone(),
            ..Default::default()
        });
        // Counts as the allocator would have written them.
        pool.status = Some(PoolRecord::load(with_counts).unwrap().current_status());
        pool
    }

    /// A PortAllocation `ns/name` with role web (`replicas` pods, PodScoped http) whose status
    /// records `ports` (pod-index order) against pool object `pool_uid`.
    fn pa(
        name: &str,
        uid: &str,
        replicas: i32,
        ports: &[i32],
        pool_uid: Option<&str>,
        age: i64,
    ) -> PortAllocation {
        let mut pa = PortAllocation::new(
            name,
            PortAllocationSpec {
                pool: "p".into(),
                roles: vec![Role {
                    name: "web".into(),
                    // The spec the status was written for; `replicas` is set below.
                    replicas: replicas.max(ports.len() as i32),
                    ports: vec![PortRequest {
                        name: "http".into(),
                        scope: Scope::PodScoped,
                        env: "HTTP".into(),
                        port: None,
                    }],
                    references: vec![],
                }],
            },
        );
        pa.metadata.namespace = Some("ns".into());
        pa.metadata.uid = Some(uid.into());
        pa.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + age).unwrap(),
        ));
        let holdings: Holdings = ports
            .iter()
            .enumerate()
            .map(|(i, p)| (SlotKey::new("web", "http", i as u32), *p as u16))
            .collect();
        if !ports.is_empty() {
            pa.status = Some(allocation_status(&pa, &holdings, pool_uid, None));
        }
        pa.spec.roles[0].replicas = replicas;
        pa
    }

    fn plan(pool: PortPool, pas: &[PortAllocation]) -> RepairPlan {
        plan_repair(&PoolRecord::load(pool).unwrap(), pas)
    }

    /// Apply a plan's status to the pool, as the write does.
    fn applied(mut pool: PortPool, plan: &RepairPlan) -> PortPool {
        if let Some(status) = &plan.status {
            pool.status = Some(status.clone());
        }
        pool
    }

    #[test]
    fn a_consistent_pool_has_nothing_to_do() {
        let p = pool(&[("a", "ns/a", "web.http=100,101")]);
        let plan = plan(p, &[pa("a", "a", 2, &[100, 101], Some(POOL_UID), 0)]);
        assert!(plan.is_clean(), "{plan:?}");
        assert!(plan.status.is_none());
        assert_eq!((plan.holders, plan.held_ports), (1, 2));
        assert_eq!(plan.resource_version, "42");
    }

    #[test]
    fn entries_of_deleted_objects_are_freed_and_live_ones_kept() {
        let p = pool(&[
            ("a", "ns/a", "web.http=100,101"),
            ("gone", "ns/gone", "web.http=102"),
            ("broken", "ns/broken", "??"),
        ]);
        let live = [pa("a", "a", 2, &[100, 101], Some(POOL_UID), 0)];
        let plan = plan(p.clone(), &live);
        assert_eq!(plan.changes.len(), 2, "{:?}", plan.changes);
        assert!(
            matches!(&plan.changes[0], Change::Free { uid, count: 1, reason: FreeReason::OwnerGone, .. } if uid == "gone")
        );
        assert!(matches!(&plan.changes[1], Change::Free { uid, count: 0, .. } if uid == "broken"));
        assert!(plan.findings.is_empty(), "{:?}", plan.findings);
        let status = plan.status.clone().unwrap();
        assert_eq!(status.holders.len(), 1);
        assert_eq!(
            (
                status.size,
                status.allocated,
                status.available,
                status.holder_count
            ),
            (19, 2, 17, 1)
        );
        // Idempotent: the repaired pool needs nothing more.
        let again = plan_repair(&PoolRecord::load(applied(p, &plan)).unwrap(), &live);
        assert!(again.is_clean(), "{again:?}");
    }

    #[test]
    fn an_entry_of_an_object_of_another_pool_is_freed() {
        let p = pool(&[("a", "ns/a", "web.http=100")]);
        let mut other = pa("a", "a", 1, &[100], Some("x"), 0);
        other.spec.pool = "q".into();
        let plan = plan(p, &[other]);
        assert!(matches!(
            &plan.changes[0],
            Change::Free { reason: FreeReason::OtherPool { pool }, .. } if pool == "q"
        ));
    }

    #[test]
    fn lost_holdings_are_restored_only_where_safe() {
        // The pool was recreated (new UID) and someone allocated 102 meanwhile.
        let p = pool(&[("c", "ns/c", "web.http=102")]);
        let live = [
            pa("c", "c", 1, &[102], Some(POOL_UID), 5),
            // Recorded against the old pool: 100 and 101 come back, 102 is taken.
            pa("a", "a", 3, &[100, 101, 102], Some("pool-uid-1"), 1),
            // Scaled down to 1 since: index 1 is not restored. 110 is excluded now.
            pa("b", "b", 1, &[103, 104], Some("pool-uid-1"), 2),
            pa("d", "d", 1, &[110], Some("pool-uid-1"), 3),
            // A younger object recording a port the older one gets back: a conflict.
            pa("e", "e", 1, &[100], Some("pool-uid-1"), 4),
        ];
        let plan = plan(p.clone(), &live);
        let restores: Vec<(&str, &str)> = plan
            .changes
            .iter()
            .filter_map(|c| match c {
                Change::Restore { uid, ports, .. } => Some((uid.as_str(), ports.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            restores,
            vec![("a", "web.http=100,101"), ("b", "web.http=103")]
        );
        let findings: Vec<String> = plan.findings.iter().map(|f| f.to_string()).collect();
        let has = |needle: &str| findings.iter().any(|f| f.contains(needle));
        assert!(
            has("ns/a: cannot restore port 102 (web.http[2]), now held by ns/c"),
            "{findings:#?}"
        );
        assert!(has("port 104 (web.http[1])"), "{findings:#?}");
        assert!(has("no longer asks for this slot"), "{findings:#?}");
        assert!(has("port 110 (web.http[0])"), "{findings:#?}");
        assert!(
            has("ns/e: cannot restore port 100 (web.http[0]), now held by ns/a"),
            "{findings:#?}"
        );
        assert_eq!(
            plan.restored
                .iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        let after = PoolRecord::load(applied(p, &plan)).unwrap();
        assert!(after.anomalies.is_empty());
        // c's 102, a's 100 and 101, b's 103.
        assert_eq!(after.state.held_count(), 4);
    }

    #[test]
    fn a_stale_status_of_this_pool_is_reported_not_restored() {
        let p = pool(&[]);
        let live = [
            pa("a", "a", 2, &[100, 101], Some(POOL_UID), 0),
            pa("b", "b", 1, &[105], None, 1),
        ];
        let plan = plan(p, &live);
        assert!(plan.changes.is_empty(), "{:?}", plan.changes);
        assert_eq!(plan.findings.len(), 2);
        assert!(
            plan.findings
                .iter()
                .all(|f| matches!(f, Finding::StaleStatus { .. }))
        );
        assert!(
            plan.findings[0]
                .to_string()
                .contains("`kubectl portalloc sync a -n ns`")
        );
    }

    #[test]
    fn duplicates_and_ports_outside_the_pool_are_reported_and_kept() {
        let p = pool(&[
            ("a", "ns/a", "web.http=100"),
            ("b", "ns/b", "web.http=100"),
            ("c", "ns/c", "web.http=110"),
            ("gone", "ns/gone", "web.http=101"),
            ("d", "ns/d", "web.http=101"),
        ]);
        let live = [
            pa("a", "a", 1, &[100], Some(POOL_UID), 0),
            pa("b", "b", 1, &[100], Some(POOL_UID), 1),
            pa("c", "c", 1, &[110], Some(POOL_UID), 2),
            pa("d", "d", 1, &[101], Some(POOL_UID), 3),
        ];
        let plan = plan(p.clone(), &live);
        // Only the dead entry goes; its duplicate with d goes with it.
        assert_eq!(plan.changes.len(), 1);
        assert!(matches!(&plan.changes[0], Change::Free { uid, .. } if uid == "gone"));
        assert_eq!(
            plan.findings,
            vec![
                Finding::OutsidePool {
                    uid: "c".into(),
                    owner: "ns/c".into(),
                    slot: "web.http[0]".into(),
                    port: 110
                },
                Finding::Duplicate {
                    port: 100,
                    first: "ns/a".into(),
                    second: "ns/b".into()
                },
            ]
        );
        let after = PoolRecord::load(applied(p, &plan)).unwrap();
        assert_eq!(after.holders.len(), 4, "live holders are all kept");
        assert_eq!(after.holdings_of("d").len(), 1);
    }

    #[test]
    fn wrong_counts_alone_are_recounted() {
        let mut p = pool(&[("a", "ns/a", "web.http=100")]);
        p.status.as_mut().unwrap().allocated = 0;
        let plan = plan(p, &[pa("a", "a", 1, &[100], Some(POOL_UID), 0)]);
        assert!(matches!(
            plan.changes[..],
            [Change::Recount {
                size: 19,
                allocated: 1,
                available: 18,
                holder_count: 1
            }]
        ));
    }

    #[test]
    fn lines_name_the_pool_entry_and_the_fix() {
        let p = pool(&[("gone", "ns/gone", "web.http=102,103")]);
        let plan = plan(p, &[]);
        assert_eq!(
            plan.changes[0].to_string(),
            "ns/gone (uid gone)  2 ports: web.http=102,103  (its PortAllocation no longer exists)"
        );
        let json = serde_json::to_value(&plan).unwrap();
        assert_eq!(json["changes"][0]["action"], "free");
        assert_eq!(json["changes"][0]["reason"], "ownerGone");
        assert_eq!(json["resourceVersion"], "42");
    }

    #[test]
    fn restoring_never_creates_a_duplicate() {
        // Property-style sweep: random pools and statuses, the repaired pool has no duplicate,
        // nothing outside, and a second pass finds nothing to change.
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..300 {
            let mut entries = Vec::new();
            let mut live = Vec::new();
            for i in 0..rng.random_range(0..6) {
                let uid = format!("u{i}");
                let ports: Vec<i32> = (0..rng.random_range(1..4))
                    .map(|_| rng.random_range(98..122))
                    .collect();
                let in_pool = rng.random_bool(0.5);
                let alive = rng.random_bool(0.7);
                if in_pool {
                    let text = Holdings::from_iter(
                        ports
                            .iter()
                            .enumerate()
                            .filter(|(_, p)| (1..=65535).contains(*p))
                            .map(|(i, p)| (SlotKey::new("web", "http", i as u32), *p as u16)),
                    )
                    .encode();
                    entries.push((uid.clone(), format!("ns/{uid}"), text));
                }
                if alive {
                    let pool_uid = if rng.random_bool(0.5) {
                        "pool-uid-1"
                    } else {
                        POOL_UID
                    };
                    live.push(pa(
                        &uid,
                        &uid,
                        rng.random_range(0..4),
                        &ports,
                        Some(pool_uid),
                        i,
                    ));
                }
            }
            let borrowed: Vec<(&str, &str, &str)> = entries
                .iter()
                .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
                .collect();
            let p = pool(&borrowed);
            let before = PoolRecord::load(p.clone()).unwrap();
            let plan = plan(p.clone(), &live);
            let after = PoolRecord::load(applied(p, &plan)).unwrap();
            let new_duplicates = after
                .anomalies
                .iter()
                .filter(|a| matches!(a, Anomaly::Duplicate { .. }))
                .count();
            let old_duplicates = before
                .anomalies
                .iter()
                .filter(|a| matches!(a, Anomaly::Duplicate { .. }))
                .count();
            assert!(new_duplicates <= old_duplicates, "{plan:?}");
            for uid in after.holders.keys() {
                assert!(live.iter().any(|pa| pa.uid().as_deref() == Some(uid)));
            }
            let again = plan_repair(&after, &live);
            assert!(
                again.changes.is_empty(),
                "second pass changed {:?}",
                again.changes
            );
        }
    }

    #[test]
    fn status_helper_matches_the_allocator() {
        let pa = pa("a", "a", 1, &[100], Some(POOL_UID), 0);
        let status: &PortAllocationStatus = pa.status.as_ref().unwrap();
        assert_eq!(status.pool_uid.as_deref(), Some(POOL_UID));
    }
}

//! Client-side allocation with optimistic concurrency.
//!
//! The pool object's `resourceVersion` is the lock: read the pool, plan with the pure core, write
//! the pool's status with the version read (one compare-and-swap carries every port one
//! PortAllocation needs), and on 409 Conflict re-read and plan again. The pool write is the commit
//! point. The PortAllocation's status is written after it and is derived from the committed pool
//! entry, so a client killed between the two writes leaves a state the next sync completes
//! without moving any port: the plan against the pool is then a no-op and only the status is
//! written.

use std::fmt;

use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use super::allocation_status::{Failure, allocation_status};
use super::pool_record::PoolRecord;
use super::retry::{Attempts, Exhausted, RetryCause, RetryPolicy};
use super::{KubeError, Op, explain};
use crate::api::{PortAllocation, PortPool, PortPoolStatus, SpecError};
use crate::core::{self, AllocError, Holdings, PortDemand, SlotKey};

const POOLS: &str = "portpools.portalloc.dev";
const POOL_STATUS: &str = "portpools.portalloc.dev/status";
const ALLOCATIONS: &str = "portallocations.portalloc.dev";
const ALLOCATION_STATUS: &str = "portallocations.portalloc.dev/status";

/// Why an allocation did not happen. Nothing is half-done in any of these cases: the pool write
/// is all-or-nothing.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    #[error("PortAllocation {owner}: {error}")]
    Spec { owner: String, error: SpecError },

    #[error("PortPool {pool:?} has an unusable spec: {error}")]
    PoolSpec { pool: String, error: SpecError },

    #[error(
        "PortPool {pool:?} not found (named in spec.pool of PortAllocation {owner}): create it with \
         `kubectl portalloc pool create {pool} --range A-B`, or list pools with `kubectl portalloc pool get`"
    )]
    PoolNotFound { pool: String, owner: String },

    #[error(
        "PortAllocation {owner}: port {port} of pool {pool:?} is already held by {holder} ({slot}): \
         request another port, or leave it unset to get a free one"
    )]
    PortHeld {
        owner: String,
        pool: String,
        port: u16,
        holder: String,
        /// `role decode, port metrics, pod index 0`
        slot: String,
    },

    #[error("PortAllocation {owner}: pool {pool:?}: {error}{holders}")]
    Refused {
        owner: String,
        pool: String,
        error: Box<AllocError>,
        /// For a full pool: who holds its ports.
        holders: String,
    },

    #[error(
        "PortAllocation {owner}: gave up after {attempts} attempts in {elapsed_ms} ms ({conflicts} conflicts on \
         PortPool {pool:?}; last: {last}). Nothing was half-allocated: it is safe to run the command again"
    )]
    Exhausted {
        owner: String,
        pool: String,
        attempts: u32,
        elapsed_ms: u128,
        conflicts: u32,
        last: String,
    },

    #[error(transparent)]
    Kube(#[from] KubeError),
}

impl AllocateError {
    /// The condition reason recorded on the PortAllocation for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Spec { .. } => "InvalidSpec",
            Self::PoolSpec { .. } => "InvalidPool",
            Self::PoolNotFound { .. } => "PoolNotFound",
            Self::PortHeld { .. } => "PortHeld",
            Self::Refused { error, .. } if matches!(**error, AllocError::PoolFull { .. }) => {
                "PoolFull"
            }
            Self::Refused { .. } => "Refused",
            Self::Exhausted { .. } => "RetriesExhausted",
            Self::Kube(_) => "APIError",
        }
    }

    /// Failures that say something about the spec or the pool, worth recording on the object.
    /// Transport trouble is not: the next run will simply try again.
    pub fn is_durable(&self) -> bool {
        !matches!(self, Self::Exhausted { .. } | Self::Kube(_))
    }
}

/// What one sync did.
#[derive(Clone, Debug)]
pub struct SyncReport {
    pub namespace: String,
    pub name: String,
    pub pool: String,
    pub holdings: Holdings,
    pub allocated: usize,
    pub released: usize,
    pub attempts: u32,
    pub conflicts: u32,
    pub pool_written: bool,
    pub status_written: bool,
    pub allocation: PortAllocation,
}

/// The result of one decision about the pool.
enum Decision {
    /// The pool already says what we want.
    Unchanged(Holdings),
    /// Write this status; `holdings` is our new entry.
    Write {
        status: PortPoolStatus,
        holdings: Holdings,
        allocated: usize,
        released: usize,
    },
}

struct Committed {
    holdings: Holdings,
    pool_uid: Option<String>,
    allocated: usize,
    released: usize,
    written: bool,
}

/// Allocates and releases ports for PortAllocations.
#[derive(Clone)]
pub struct Allocator {
    client: Client,
    pub policy: RetryPolicy,
    pub verbosity: u8,
}

impl Allocator {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            policy: RetryPolicy::default(),
            verbosity: 0,
        }
    }

    /// Make the pool and the PortAllocation's status match its spec. `pool` may be a copy of the
    /// pool read a moment ago, which saves one request; a stale copy costs one conflict.
    pub async fn sync(
        &self,
        pa: PortAllocation,
        pool: Option<PortPool>,
    ) -> Result<SyncReport, AllocateError> {
        let owner = owner_of(&pa);
        let demands = pa.spec.demands().map_err(|error| AllocateError::Spec {
            owner: owner.clone(),
            error,
        })?;
        self.converge(pa, pool, move |record, uid| {
            decide_sync(record, uid, &owner, &demands)
        })
        .await
    }

    /// Give back the ports of one role, or all of them, without touching the spec.
    pub async fn release(
        &self,
        pa: PortAllocation,
        role: Option<String>,
    ) -> Result<SyncReport, AllocateError> {
        let owner = owner_of(&pa);
        self.converge(pa, None, move |record, uid| {
            let current = record.holdings_of(uid);
            let keep: Holdings = current
                .iter()
                .filter(|(slot, _)| role.as_ref().is_some_and(|r| &slot.role != r))
                .map(|(slot, port)| (slot.clone(), port))
                .collect();
            let released = current.len() - keep.len();
            if released == 0 {
                return Ok(Decision::Unchanged(current));
            }
            let mut state = record.state.clone();
            for (slot, port) in current.iter() {
                if !keep.contains(slot) {
                    state.release(port);
                }
            }
            Ok(Decision::Write {
                status: record.status_with(&state, uid, &owner, &keep),
                holdings: keep,
                allocated: 0,
                released,
            })
        })
        .await
    }

    /// Remove a holder from a pool entirely, after its PortAllocation is gone.
    /// Returns how many ports were freed.
    pub async fn release_holder(
        &self,
        pool: &str,
        uid: &str,
        owner: &str,
    ) -> Result<usize, AllocateError> {
        let mut attempts = Attempts::new(self.policy);
        let (committed, _) = self
            .commit_to_pool(pool, owner, uid, None, &mut attempts, |record, uid| {
                let current = record.holdings_of(uid);
                if current.is_empty() && !record.opaque.contains_key(uid) {
                    return Ok(Decision::Unchanged(current));
                }
                let mut state = record.state.clone();
                for port in current.ports() {
                    state.release(port);
                }
                let mut record = record.clone();
                record.opaque.remove(uid);
                Ok(Decision::Write {
                    status: record.status_with(&state, uid, owner, &Holdings::new()),
                    holdings: Holdings::new(),
                    allocated: 0,
                    released: current.len(),
                })
            })
            .await?;
        Ok(committed.released)
    }

    /// Record a durable failure on the PortAllocation's status, so `kubectl get` and GitOps
    /// dashboards show it. Best effort: the caller reports the original error either way.
    pub async fn record_failure(&self, pa: &PortAllocation, error: &AllocateError) {
        if !error.is_durable() {
            return;
        }
        let mut holdings = pa
            .status
            .as_ref()
            .map(super::allocation_status::recorded_holdings)
            .unwrap_or_default();
        // The status must not go on claiming ports the pool no longer gives this object (a
        // release killed before its status write leaves such a status; another object may hold
        // those ports by now). When the status names this very pool object, its entry is the
        // truth. A status naming an earlier pool object of the same name is kept: it is what
        // `repair` restores from.
        let recorded_pool = pa.status.as_ref().and_then(|s| s.pool_uid.clone());
        let pools: Api<PortPool> = Api::all(self.client.clone());
        if let Ok(pool) = pools.get(&pa.spec.pool).await
            && let Ok(record) = PoolRecord::load(pool)
            && record.uid().is_some()
            && record.uid().map(str::to_string) == recorded_pool
        {
            holdings = record.holdings_of(&pa.uid().unwrap_or_default());
        }
        let failure = Failure {
            reason: error.reason().to_string(),
            message: error.to_string(),
        };
        let mut updated = pa.clone();
        updated.status = Some(allocation_status(pa, &holdings, None, Some(&failure)));
        if updated.status != pa.status {
            let api: Api<PortAllocation> =
                Api::namespaced(self.client.clone(), &pa.namespace().unwrap_or_default());
            let _ = api
                .replace_status(&pa.name_any(), &PostParams::default(), &updated)
                .await;
        }
    }

    /// Commit to the pool, then write the PortAllocation's status; on a status conflict re-read
    /// the PortAllocation and go round again (the pool step is then a no-op).
    async fn converge<F>(
        &self,
        mut pa: PortAllocation,
        mut pool: Option<PortPool>,
        mut decide: F,
    ) -> Result<SyncReport, AllocateError>
    where
        F: FnMut(&PoolRecord, &str) -> Result<Decision, AllocateError>,
    {
        let mut attempts = Attempts::new(self.policy);
        let namespace = pa.namespace().unwrap_or_default();
        let name = pa.name_any();
        let api: Api<PortAllocation> = Api::namespaced(self.client.clone(), &namespace);
        let mut allocated = 0;
        let mut released = 0;
        let mut pool_written = false;
        loop {
            let uid = pa.uid().unwrap_or_default();
            let owner = owner_of(&pa);
            let pool_name = pa.spec.pool.clone();
            let (committed, _) = self
                .commit_to_pool(
                    &pool_name,
                    &owner,
                    &uid,
                    pool.take(),
                    &mut attempts,
                    &mut decide,
                )
                .await?;
            allocated += committed.allocated;
            released += committed.released;
            pool_written |= committed.written;

            let failure = (committed.holdings.is_empty() && released > 0 && allocated == 0).then(|| Failure {
                reason: "Released".into(),
                message: "ports released with `kubectl portalloc release`; run `kubectl portalloc sync` to allocate again".into(),
            });
            let status = allocation_status(
                &pa,
                &committed.holdings,
                committed.pool_uid.as_deref(),
                failure.as_ref(),
            );
            let report = |pa: PortAllocation, attempts: &Attempts, status_written| SyncReport {
                namespace: namespace.clone(),
                name: name.clone(),
                pool: pool_name.clone(),
                holdings: committed.holdings.clone(),
                allocated,
                released,
                attempts: attempts.attempts,
                conflicts: attempts.conflicts,
                pool_written,
                status_written,
                allocation: pa,
            };
            if pa.status.as_ref() == Some(&status) {
                return Ok(report(pa, &attempts, false));
            }
            let mut updated = pa.clone();
            updated.status = Some(status);
            match api
                .replace_status(&name, &PostParams::default(), &updated)
                .await
            {
                Ok(written) => return Ok(report(written, &attempts, true)),
                Err(e) => {
                    let cause = retry_cause(&e).ok_or_else(|| {
                        explain(
                            e,
                            &op(
                                "update",
                                ALLOCATION_STATUS,
                                "PortAllocation",
                                &name,
                                Some(&namespace),
                            ),
                        )
                    })?;
                    self.wait(
                        &mut attempts,
                        cause,
                        &pool_name,
                        &owner,
                        "PortAllocation status",
                    )
                    .await?;
                    pa = api.get(&name).await.map_err(|e| {
                        explain(
                            e,
                            &op(
                                "get",
                                ALLOCATIONS,
                                "PortAllocation",
                                &name,
                                Some(&namespace),
                            ),
                        )
                    })?;
                    if pa.uid().unwrap_or_default() != uid {
                        // Deleted and recreated meanwhile: a new owner, which the next round serves;
                        // the old UID's entry is a leak that `repair` frees.
                        continue;
                    }
                }
            }
        }
    }

    /// The compare-and-swap loop on the pool object.
    async fn commit_to_pool<F>(
        &self,
        pool_name: &str,
        owner: &str,
        uid: &str,
        mut prefetched: Option<PortPool>,
        attempts: &mut Attempts,
        mut decide: F,
    ) -> Result<(Committed, PortPool), AllocateError>
    where
        F: FnMut(&PoolRecord, &str) -> Result<Decision, AllocateError>,
    {
        let pools: Api<PortPool> = Api::all(self.client.clone());
        loop {
            let pool = match prefetched.take() {
                Some(pool) => pool,
                None => match pools.get(pool_name).await {
                    Ok(pool) => pool,
                    Err(kube::Error::Api(status))
                        if status.is_not_found() && !is_unknown_resource(&status) =>
                    {
                        return Err(AllocateError::PoolNotFound {
                            pool: pool_name.into(),
                            owner: owner.into(),
                        });
                    }
                    Err(e) => match retry_cause(&e) {
                        Some(cause @ RetryCause::Transient(_)) => {
                            self.wait(attempts, cause, pool_name, owner, "PortPool")
                                .await?;
                            continue;
                        }
                        _ => {
                            return Err(
                                explain(e, &op("get", POOLS, "PortPool", pool_name, None)).into()
                            );
                        }
                    },
                },
            };
            let record =
                PoolRecord::load(pool.clone()).map_err(|error| AllocateError::PoolSpec {
                    pool: pool_name.into(),
                    error,
                })?;
            let pool_uid = record.uid().map(str::to_string);
            match decide(&record, uid)? {
                Decision::Unchanged(holdings) => {
                    return Ok((
                        Committed {
                            holdings,
                            pool_uid,
                            allocated: 0,
                            released: 0,
                            written: false,
                        },
                        pool,
                    ));
                }
                Decision::Write {
                    status,
                    holdings,
                    allocated,
                    released,
                } => {
                    let mut updated = pool;
                    updated.status = Some(status);
                    // `updated` still carries the resourceVersion we read: that is the CAS.
                    match pools
                        .replace_status(pool_name, &PostParams::default(), &updated)
                        .await
                    {
                        Ok(written) => {
                            return Ok((
                                Committed {
                                    holdings,
                                    pool_uid,
                                    allocated,
                                    released,
                                    written: true,
                                },
                                written,
                            ));
                        }
                        Err(e) => {
                            let cause = retry_cause(&e).ok_or_else(|| {
                                explain(e, &op("update", POOL_STATUS, "PortPool", pool_name, None))
                            })?;
                            self.wait(attempts, cause, pool_name, owner, "PortPool status")
                                .await?;
                        }
                    }
                }
            }
        }
    }

    async fn wait(
        &self,
        attempts: &mut Attempts,
        cause: RetryCause,
        pool: &str,
        owner: &str,
        what: &str,
    ) -> Result<(), AllocateError> {
        let described = describe_cause(&cause);
        match attempts.retry_after(cause).await {
            Ok(delay) => {
                if self.verbosity >= 1 {
                    eprintln!(
                        "{owner}: {described} writing {what} of pool {pool:?}; attempt {} after {} ms",
                        attempts.attempts,
                        delay.as_millis()
                    );
                }
                Ok(())
            }
            Err(Exhausted {
                attempts,
                elapsed,
                conflicts,
                last,
            }) => Err(AllocateError::Exhausted {
                owner: owner.into(),
                pool: pool.into(),
                attempts,
                elapsed_ms: elapsed.as_millis(),
                conflicts,
                last: describe_cause(&last),
            }),
        }
    }
}

fn describe_cause(cause: &RetryCause) -> String {
    match cause {
        RetryCause::Conflict => "409 Conflict (another client wrote first)".to_string(),
        RetryCause::Transient(message) => message.clone(),
    }
}

/// Conflicts and transient failures are retried; anything else is final.
pub(super) fn retry_cause(err: &kube::Error) -> Option<RetryCause> {
    match err {
        kube::Error::Api(status) if status.is_conflict() => Some(RetryCause::Conflict),
        kube::Error::Api(status) if matches!(status.code, 429 | 500 | 502 | 503 | 504) => Some(
            RetryCause::Transient(format!("HTTP {}: {}", status.code, status.message)),
        ),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => {
            Some(RetryCause::Transient(super::error::transport_message(err)))
        }
        _ => None,
    }
}

/// A 404 for the resource type itself (CRDs missing) rather than for the object.
fn is_unknown_resource(status: &kube::core::Status) -> bool {
    status
        .message
        .contains("could not find the requested resource")
}

fn op<'a>(
    verb: &'a str,
    resource: &'a str,
    kind: &'a str,
    name: &'a str,
    namespace: Option<&'a str>,
) -> Op<'a> {
    Op {
        verb,
        resource,
        kind,
        name: Some(name),
        namespace,
    }
}

pub fn owner_of(pa: &PortAllocation) -> String {
    format!("{}/{}", pa.namespace().unwrap_or_default(), pa.name_any())
}

/// The sync decision: plan against what `uid` holds now, and carry the plan out on a copy of
/// the pool state.
fn decide_sync(
    record: &PoolRecord,
    uid: &str,
    owner: &str,
    demands: &[PortDemand],
) -> Result<Decision, AllocateError> {
    let current = record.holdings_of(uid);
    let plan = core::plan(demands, &current);
    if plan.is_noop() {
        return Ok(Decision::Unchanged(current));
    }
    let mut state = record.state.clone();
    let holdings = core::execute(&plan, &mut state, &mut rand::rng())
        .map_err(|e| refusal(e, record, uid, owner))?;
    Ok(Decision::Write {
        status: record.status_with(&state, uid, owner, &holdings),
        holdings,
        allocated: plan.allocate.len(),
        released: plan.release.len(),
    })
}

/// Would syncing `pa` against this pool succeed? Lets `create` refuse before writing anything.
pub fn precheck(record: &PoolRecord, pa: &PortAllocation) -> Result<(), AllocateError> {
    let owner = owner_of(pa);
    let demands = pa.spec.demands().map_err(|error| AllocateError::Spec {
        owner: owner.clone(),
        error,
    })?;
    decide_sync(record, &pa.uid().unwrap_or_default(), &owner, &demands).map(|_| ())
}

/// Add who is involved to a core refusal.
fn refusal(error: AllocError, record: &PoolRecord, uid: &str, owner: &str) -> AllocateError {
    let pool = record.name().to_string();
    match error {
        AllocError::Held { port } => {
            let (holder, slot) = match record.holder_of(port) {
                Some((holder_uid, _, slot)) if holder_uid == uid => {
                    (format!("{owner} itself"), Some(slot))
                }
                Some((_, entry, slot)) => (entry.owner.clone(), Some(slot)),
                None => ("an unknown holder".to_string(), None),
            };
            let slot = match slot {
                Some(SlotKey { role, port, index }) => {
                    format!("role {role}, port {port}, pod index {index}")
                }
                None => "slot unknown".into(),
            };
            AllocateError::PortHeld {
                owner: owner.into(),
                pool,
                port,
                holder,
                slot,
            }
        }
        error @ AllocError::PoolFull { .. } => AllocateError::Refused {
            owner: owner.into(),
            pool,
            error: Box::new(error),
            holders: holders_summary(record),
        },
        error => AllocateError::Refused {
            owner: owner.into(),
            pool,
            error: Box::new(error),
            holders: String::new(),
        },
    }
}

/// `. Holders: ns/a (12 ports), ns/b (8 ports) and 3 more`, largest first.
fn holders_summary(record: &PoolRecord) -> String {
    let mut holders: Vec<(&str, usize)> = record
        .holders
        .values()
        .map(|h| (h.owner.as_str(), h.holdings.len()))
        .collect();
    if holders.is_empty() {
        return String::new();
    }
    holders.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown: Vec<String> = holders
        .iter()
        .take(5)
        .map(|(o, n)| format!("{o} ({n} ports)"))
        .collect();
    let more = holders.len().saturating_sub(5);
    let mut text = format!(". Holders: {}", shown.join(", "));
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

impl fmt::Display for SyncReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "portallocation/{} in {}: {} ports held in pool {}",
            self.name,
            self.namespace,
            self.holdings.len(),
            self.pool
        )?;
        match (self.allocated, self.released) {
            (0, 0) => f.write_str(" (unchanged)"),
            (a, 0) => write!(f, " ({a} allocated)"),
            (0, r) => write!(f, " ({r} released)"),
            (a, r) => write!(f, " ({a} allocated, {r} released)"),
        }
    }
}

//! Client-side allocation with optimistic concurrency.
//!
//! The pool object's `resourceVersion` is the lock: read the pool, decide with the ledger, write
//! the pool's status with the version read (one compare-and-swap carries every port one
//! PortAllocation needs), and on 409 Conflict re-read and decide again. The pool write is the
//! commit point. The PortAllocation's status is written after it and is derived from the
//! committed pool entry, so a client killed between the two writes leaves a state the next sync
//! completes without moving any port: the decision against the pool is then "unchanged" and
//! only the status is written.
//!
//! After both, the ConfigMap the PortAllocation names (`spec.configMap`) is brought in line with
//! the status just written (see [`super::configmaps`]). It follows the allocation and never
//! undoes it: its outcome, good or bad, is part of the [`SyncReport`].

use std::fmt;

use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use super::configmaps::{ConfigMapError, EnvConfigMap, keep_env_configmap};
use super::error::{KubeError, Target, is_unknown_resource};
use super::pool_cache::{PoolCache, ShardCache};
use super::resources::{ALLOCATION_STATUS, ALLOCATIONS, POOL_STATUS, POOLS};
use super::retry::{Attempts, Exhausted, RetryCause, RetryPolicy, Stop};
use super::shard_commit::POOL_SPEC_TTL;
use crate::api::{PortAllocation, PortPool, RecordFormat};
use crate::core::Holdings;
use crate::ledger::{
    Decision, Operation, Outcome, PoolRecord, Refusal, allocation_status, decide, owner_of,
    recorded_holdings,
};

/// Why an allocation did not happen. Nothing is half-done in any of these cases: the pool write
/// is all-or-nothing.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// A lasting refusal, recorded on the PortAllocation: the same command fails the same way
    /// until someone changes the spec or the pool.
    #[error(transparent)]
    Refused(#[from] Refusal),

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
    /// The lasting refusal, if this is one (transport trouble and conflicts are not).
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            AllocateError::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }
}

/// What one sync or release did.
#[derive(Debug)]
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
    /// What keeping its ConfigMap did; `None` when the spec names none. A failure here leaves
    /// the ports allocated and the status written.
    pub configmap: Option<Result<EnvConfigMap, ConfigMapError>>,
}

/// What the pool step committed.
pub(super) struct Committed {
    pub(super) holdings: Holdings,
    pub(super) pool_uid: Option<String>,
    pub(super) allocated: usize,
    pub(super) released: usize,
    pub(super) written: bool,
    /// A sharded pool's: the shards where the owner's entries now are (`status.shards`).
    pub(super) shards: Option<Vec<i32>>,
}

/// Allocates and releases ports for PortAllocations.
#[derive(Clone)]
pub struct Allocator {
    pub(super) client: Client,
    pub policy: RetryPolicy,
    /// The last copy of each pool read or written, decided against instead of a new read.
    pub(super) pools: PoolCache,
    /// The same for the shards of sharded pools.
    pub(super) shards: ShardCache,
}

impl Allocator {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            policy: RetryPolicy::default(),
            pools: PoolCache::default(),
            shards: ShardCache::default(),
        }
    }

    /// Whether to decide against the pool returned by the last write (default) or read the
    /// pool before every allocation (one more request each; for comparison).
    pub fn remember_pools(mut self, on: bool) -> Self {
        (self.pools, self.shards) = if on {
            (PoolCache::default(), ShardCache::default())
        } else {
            (PoolCache::disabled(), ShardCache::disabled())
        };
        self
    }

    /// Make the pool and the PortAllocation's status match its spec. `pool` may be a copy of the
    /// pool read a moment ago, which saves one request; a stale copy costs one conflict.
    pub async fn sync(
        &self,
        pa: PortAllocation,
        pool: Option<PortPool>,
    ) -> Result<SyncReport, AllocateError> {
        let operation = Operation::sync_of(&pa)?;
        self.converge(pa, pool, operation).await
    }

    /// [`Allocator::sync`], and on a lasting refusal record it on the object's status so
    /// `kubectl get` and GitOps dashboards show it.
    pub async fn sync_or_record(
        &self,
        pa: PortAllocation,
        pool: Option<PortPool>,
    ) -> Result<SyncReport, AllocateError> {
        match self.sync(pa.clone(), pool).await {
            Ok(report) => Ok(report),
            Err(error) => {
                self.record_failure(&pa, &error).await;
                Err(error)
            }
        }
    }

    /// Give back the ports of one role, or all of them, without touching the spec.
    pub async fn release(
        &self,
        pa: PortAllocation,
        role: Option<String>,
    ) -> Result<SyncReport, AllocateError> {
        self.converge(pa, None, Operation::Release { role }).await
    }

    /// Bring the ConfigMap `pa` names in line with its spec and status, alone: for an object
    /// whose ports need nothing (the watcher's resync), so a ConfigMap deleted or edited by hand
    /// comes back. `None` when it names none.
    pub async fn keep_configmap(
        &self,
        pa: &PortAllocation,
    ) -> Option<Result<EnvConfigMap, ConfigMapError>> {
        keep_env_configmap(&self.client, pa, false).await
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
        let committed = self
            .commit_to_pool(
                pool,
                owner,
                uid,
                None,
                None,
                &mut attempts,
                &Operation::Remove,
            )
            .await?;
        Ok(committed.released)
    }

    /// Record a lasting refusal on the PortAllocation's status. Best effort: the caller reports
    /// the original error either way.
    async fn record_failure(&self, pa: &PortAllocation, error: &AllocateError) {
        let Some(refusal) = error.refusal() else {
            return;
        };
        let mut holdings = pa
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default();
        // The status must not go on claiming ports the pool no longer gives this object (a
        // release killed before its status write leaves such a status; another object may hold
        // those ports by now). When the status names this very pool object, its entry is the
        // truth. A status naming an earlier pool object of the same name is kept: it is what
        // `repair` restores from.
        let recorded_pool = pa.status.as_ref().and_then(|s| s.pool_uid.clone());
        let pools: Api<PortPool> = Api::all(self.client.clone());
        if let Ok(pool) = pools.get(&pa.spec.pool).await
            // A sharded pool's own status lists no holders: the recorded ones stay.
            && pool.status.as_ref().and_then(|s| s.format).is_none()
            && let Ok(record) = PoolRecord::load(pool)
            && record.uid().is_some()
            && record.uid().map(str::to_string) == recorded_pool
        {
            holdings = record.holdings_of(&pa.uid().unwrap_or_default());
        }
        let mut updated = pa.clone();
        updated.status = Some(allocation_status(
            pa,
            &holdings,
            None,
            Outcome::Refused(refusal),
        ));
        if updated.status != pa.status {
            let api: Api<PortAllocation> =
                Api::namespaced(self.client.clone(), &pa.namespace().unwrap_or_default());
            if let Err(e) = api
                .replace_status(&pa.name_any(), &PostParams::default(), &updated)
                .await
            {
                tracing::info!(
                    "{}: could not record {}: {e}",
                    owner_of(pa),
                    refusal.reason()
                );
            }
        }
    }

    /// Commit to the pool, then write the PortAllocation's status; on a status conflict re-read
    /// the PortAllocation and go round again (the pool step is then a no-op).
    async fn converge(
        &self,
        mut pa: PortAllocation,
        mut pool: Option<PortPool>,
        operation: Operation,
    ) -> Result<SyncReport, AllocateError> {
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
            let committed = self
                .commit_to_pool(
                    &pool_name,
                    &owner,
                    &uid,
                    pool.take(),
                    Some(&mut pa),
                    &mut attempts,
                    &operation,
                )
                .await?;
            allocated += committed.allocated;
            released += committed.released;
            pool_written |= committed.written;

            let outcome = if operation.released_on_purpose(&committed.holdings, released) {
                Outcome::Released
            } else {
                Outcome::Converged
            };
            let mut status = allocation_status(
                &pa,
                &committed.holdings,
                committed.pool_uid.as_deref(),
                outcome,
            );
            if let Some(shards) = &committed.shards {
                status.shards.clone_from(shards);
            }
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
                configmap: None,
            };
            let is_release = matches!(operation, Operation::Release { .. });
            if pa.status.as_ref() == Some(&status) {
                let report = report(pa, &attempts, false);
                return Ok(self.with_configmap(report, is_release).await);
            }
            let mut updated = pa.clone();
            updated.status = Some(status);
            let label = format!("{owner} in pool {pool_name:?}");
            match api
                .replace_status(&name, &PostParams::default(), &updated)
                .await
            {
                Ok(written) => {
                    let report = report(written, &attempts, true);
                    return Ok(self.with_configmap(report, is_release).await);
                }
                Err(e) => {
                    let target = ALLOCATION_STATUS.on("update", &name, Some(&namespace));
                    self.backoff(&mut attempts, e, target, &label, &pool_name, &owner)
                        .await?;
                    pa = api.get(&name).await.map_err(|e| {
                        KubeError::from_kube(e, ALLOCATIONS.on("get", &name, Some(&namespace)))
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

    /// Keep the ConfigMap of the PortAllocation as the report leaves it (spec and the status
    /// just written).
    async fn with_configmap(&self, mut report: SyncReport, released: bool) -> SyncReport {
        report.configmap = keep_env_configmap(&self.client, &report.allocation, released).await;
        report
    }

    /// The compare-and-swap loop on the pool object (on its shards when it is sharded).
    #[allow(clippy::too_many_arguments)]
    async fn commit_to_pool(
        &self,
        pool_name: &str,
        owner: &str,
        uid: &str,
        mut prefetched: Option<PortPool>,
        pa: Option<&mut PortAllocation>,
        attempts: &mut Attempts,
        operation: &Operation,
    ) -> Result<Committed, AllocateError> {
        let pools: Api<PortPool> = Api::all(self.client.clone());
        let label = format!("{owner} in pool {pool_name:?}");
        loop {
            // A remembered copy is tried only for a write, which its resourceVersion checks.
            let mut remembered = false;
            let pool = match prefetched.take() {
                Some(pool) => pool,
                None => match self.pools.get(pool_name) {
                    Some(pool) => {
                        remembered = true;
                        pool
                    }
                    None => match pools.get(pool_name).await {
                        Ok(pool) => {
                            self.pools.remember(&pool);
                            pool
                        }
                        Err(kube::Error::Api(status))
                            if status.is_not_found() && !is_unknown_resource(&status) =>
                        {
                            return Err(Refusal::PoolNotFound {
                                pool: pool_name.into(),
                                owner: owner.into(),
                            }
                            .into());
                        }
                        Err(e) => {
                            let target = POOLS.on("get", pool_name, None);
                            self.backoff(attempts, e, target, &label, pool_name, owner)
                                .await?;
                            continue;
                        }
                    },
                },
            };
            match pool.status.as_ref().and_then(|s| s.format) {
                Some(RecordFormat::Sharded) => {
                    if remembered
                        && self
                            .pools
                            .get_younger_than(pool_name, POOL_SPEC_TTL)
                            .is_none()
                    {
                        // No shard write checks the pool's spec: an old copy is read again.
                        self.pools.forget(pool_name);
                        continue;
                    }
                    return self
                        .commit_to_shards(pool, pa, uid, owner, attempts, operation)
                        .await;
                }
                Some(RecordFormat::Migrating) => {
                    self.pools.forget(pool_name);
                    let cause = RetryCause::Transient(format!(
                        "PortPool {pool_name:?} is being upgraded to PortPoolShards"
                    ));
                    attempts
                        .retry_after(cause, None)
                        .await
                        .map_err(|e| self.exhausted(e, pool_name, owner))?;
                    continue;
                }
                None => {}
            }
            let record = PoolRecord::load(pool.clone()).map_err(|error| Refusal::PoolSpec {
                pool: pool_name.into(),
                error,
            })?;
            let pool_uid = record.uid().map(str::to_string);
            // Decided in a statement of its own: the thread-local RNG must not live across the
            // awaits below, or the future could not move between threads.
            let decision = decide(&record, uid, owner, operation, &mut rand::rng());
            if remembered && !matches!(decision, Ok(Decision::Write { .. })) {
                // Nothing to write, or a refusal: no compare-and-swap would check the copy.
                self.pools.forget(pool_name);
                continue;
            }
            match decision? {
                Decision::Unchanged(holdings) => {
                    return Ok(Committed {
                        holdings,
                        pool_uid,
                        allocated: 0,
                        released: 0,
                        written: false,
                        shards: None,
                    });
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
                            self.pools.remember(&written);
                            tracing::info!(
                                "{label}: {allocated} ports allocated, {released} released, {} held \
                                 (attempt {}, {} conflicts)",
                                holdings.port_count(),
                                attempts.attempts,
                                attempts.conflicts
                            );
                            return Ok(Committed {
                                holdings,
                                pool_uid,
                                allocated,
                                released,
                                written: true,
                                shards: None,
                            });
                        }
                        Err(kube::Error::Api(status)) if remembered && status.is_not_found() => {
                            // The copy outlived its pool: read again (which tells PoolNotFound).
                            self.pools.forget(pool_name);
                        }
                        Err(e) => {
                            self.pools.forget(pool_name);
                            let target = POOL_STATUS.on("update", pool_name, None);
                            self.backoff(attempts, e, target, &label, pool_name, owner)
                                .await?;
                        }
                    }
                }
            }
        }
    }

    /// Wait before the next round, or end the loop with the error the caller reports.
    pub(super) async fn backoff(
        &self,
        attempts: &mut Attempts,
        err: kube::Error,
        target: Target,
        label: &str,
        pool: &str,
        owner: &str,
    ) -> Result<(), AllocateError> {
        attempts
            .backoff(err, target, label)
            .await
            .map_err(|stop| match stop {
                Stop::Final(e) => AllocateError::Kube(e),
                Stop::Exhausted(exhausted) => self.exhausted(exhausted, pool, owner),
            })
    }

    fn exhausted(&self, exhausted: Exhausted, pool: &str, owner: &str) -> AllocateError {
        let Exhausted {
            attempts,
            elapsed,
            conflicts,
            last,
        } = exhausted;
        AllocateError::Exhausted {
            owner: owner.into(),
            pool: pool.into(),
            attempts,
            elapsed_ms: elapsed.as_millis(),
            conflicts,
            last: last.to_string(),
        }
    }
}

impl fmt::Display for SyncReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "portallocation/{} in {}: {} ports held in pool {}",
            self.name,
            self.namespace,
            self.holdings.port_count(),
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

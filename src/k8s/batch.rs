//! Group commit: `sync --all` allocates every PortAllocation of a pool in ONE compare-and-swap.
//!
//! Per pool: read it, decide every PortAllocation with [`decide_batch`], write the one status
//! with the resourceVersion read; on 409 read again and decide again (nothing of a failed write
//! is committed, so every item of it is decided afresh). The pool write is the commit point, as
//! for one PortAllocation; the PortAllocations' statuses are derived from it afterwards, several
//! at a time. A client killed between the two leaves pool entries whose statuses the next sync
//! writes without moving a port, exactly as before.
//!
//! A refusal decided by the ledger (pool full, port held, invalid spec) is its item's outcome
//! and does not block the others. A write the server refuses as a whole for a reason other than a
//! conflict (the tenancy policy refusing one namespace's entry, say) falls back to one
//! compare-and-swap per PortAllocation, so the server's refusal, too, stays with its own item.

use futures::{StreamExt, stream};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use super::allocator::{AllocateError, Allocator, SyncReport};
use super::configmaps::keep_env_configmap;
use super::error::{KubeError, is_unknown_resource};
use super::resources::{POOL_STATUS, POOLS};
use super::retry::{Attempts, Exhausted, Stop};
use crate::api::{PortAllocation, PortPool};
use crate::core::Holdings;
use crate::ledger::{
    BatchItem, ItemOutcome, Operation, Outcome, PoolRecord, Refusal, allocation_status,
    decide_batch, owner_of, recorded_holdings,
};

type ItemResult = Result<SyncReport, AllocateError>;

/// How one pool's batch ended.
enum PoolStep {
    /// The pool now says what `outcomes` say (written, or already so); `record` is the pool
    /// as decided against.
    Committed {
        record: Box<PoolRecord>,
        outcomes: Vec<ItemOutcome>,
        written: bool,
    },
    /// Every item gets this refusal (pool missing, pool spec unusable).
    RefusedAll(Refusal),
    /// The retry budget ran out.
    Exhausted(Exhausted),
    /// The server refused the write or read for a reason no retry fixes: go one by one.
    OneByOne(KubeError),
    /// The pool's record is sharded (or being upgraded): shard by shard.
    Sharded(Box<PortPool>),
}

impl Allocator {
    /// Sync every PortAllocation in `pas`: one pool write per pool for all of them, then their
    /// statuses, at most `concurrency` at a time. One result per input, in the input's order.
    pub async fn sync_many(&self, pas: Vec<PortAllocation>, concurrency: usize) -> Vec<ItemResult> {
        let mut pools: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, pa) in pas.iter().enumerate() {
            match pools.iter_mut().find(|(pool, _)| *pool == pa.spec.pool) {
                Some((_, members)) => members.push(i),
                None => pools.push((pa.spec.pool.clone(), vec![i])),
            }
        }
        let mut results: Vec<Option<ItemResult>> = pas.iter().map(|_| None).collect();
        for (pool, members) in pools {
            let batch: Vec<PortAllocation> = members.iter().map(|&i| pas[i].clone()).collect();
            let done = self.sync_pool(&pool, batch, concurrency.max(1)).await;
            for (i, result) in members.into_iter().zip(done) {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every input belongs to one pool"))
            .collect()
    }

    /// One pool's batch: commit, then write the statuses.
    async fn sync_pool(
        &self,
        pool: &str,
        pas: Vec<PortAllocation>,
        concurrency: usize,
    ) -> Vec<ItemResult> {
        let items: Vec<BatchItem> = pas
            .iter()
            .map(|pa| BatchItem {
                uid: pa.uid().unwrap_or_default(),
                owner: owner_of(pa),
                operation: Operation::sync_of(pa),
            })
            .collect();
        let mut attempts = Attempts::new(self.policy);
        let step = self.commit_batch(pool, &items, &mut attempts).await;
        let (attempts, conflicts) = (attempts.attempts, attempts.conflicts);
        match step {
            PoolStep::Committed {
                record,
                outcomes,
                written,
            } => {
                let record = &record;
                stream::iter(pas.into_iter().zip(outcomes))
                    .map(|(pa, outcome)| async move {
                        let mut report = self
                            .finish(pa, Some(record), record.uid(), None, outcome, written)
                            .await?;
                        report.attempts = attempts;
                        report.conflicts = conflicts;
                        Ok(report)
                    })
                    .buffered(concurrency)
                    .collect()
                    .await
            }
            PoolStep::RefusedAll(refusal) => {
                stream::iter(pas)
                    .map(|pa| {
                        // Each item's refusal names its own PortAllocation.
                        let refusal = match &refusal {
                            Refusal::PoolNotFound { pool, .. } => Refusal::PoolNotFound {
                                pool: pool.clone(),
                                owner: owner_of(&pa),
                            },
                            other => other.clone(),
                        };
                        async move {
                            self.record_refusal(&pa, None, &refusal).await;
                            Err(AllocateError::Refused(refusal))
                        }
                    })
                    .buffered(concurrency)
                    .collect()
                    .await
            }
            PoolStep::Exhausted(exhausted) => pas
                .iter()
                .map(|pa| {
                    Err(AllocateError::Exhausted {
                        owner: owner_of(pa),
                        pool: pool.into(),
                        attempts: exhausted.attempts,
                        elapsed_ms: exhausted.elapsed.as_millis(),
                        conflicts: exhausted.conflicts,
                        last: exhausted.last.to_string(),
                    })
                })
                .collect(),
            PoolStep::Sharded(pool) => self.sync_sharded_pool(*pool, pas, concurrency).await,
            PoolStep::OneByOne(error) => {
                tracing::info!(
                    "pool {pool:?}: the batch of {} failed ({error}); syncing them one by one",
                    pas.len()
                );
                stream::iter(pas)
                    .map(|pa| self.sync_or_record(pa, None))
                    .buffered(concurrency)
                    .collect()
                    .await
            }
        }
    }

    /// The compare-and-swap loop of a batch on the pool object.
    async fn commit_batch(
        &self,
        pool_name: &str,
        items: &[BatchItem],
        attempts: &mut Attempts,
    ) -> PoolStep {
        let pools: Api<PortPool> = Api::all(self.client.clone());
        let label = format!("{} PortAllocations in pool {pool_name:?}", items.len());
        loop {
            // A remembered copy is tried only for a write, which its resourceVersion checks (and
            // with it every refusal decided from the same copy).
            let remembered = self.pools.get(pool_name);
            let from_memory = remembered.is_some();
            let read = match remembered {
                Some(pool) => Ok(pool),
                None => pools.get(pool_name).await,
            };
            let pool = match read {
                Ok(pool) => {
                    self.pools.remember(&pool);
                    pool
                }
                Err(kube::Error::Api(status))
                    if status.is_not_found() && !is_unknown_resource(&status) =>
                {
                    return PoolStep::RefusedAll(Refusal::PoolNotFound {
                        pool: pool_name.into(),
                        owner: items.first().map(|i| i.owner.clone()).unwrap_or_default(),
                    });
                }
                Err(e) => match attempts
                    .backoff(e, POOLS.on("get", pool_name, None), &label)
                    .await
                {
                    Ok(()) => continue,
                    Err(stop) => return stopped(stop),
                },
            };
            if pool.status.as_ref().is_some_and(|s| s.format.is_some()) {
                return PoolStep::Sharded(Box::new(pool));
            }
            let record = match PoolRecord::load(pool.clone()) {
                Ok(record) => record,
                Err(error) => {
                    return PoolStep::RefusedAll(Refusal::PoolSpec {
                        pool: pool_name.into(),
                        error,
                    });
                }
            };
            // In a statement of its own: the thread-local RNG must not live across an await.
            let decision = decide_batch(&record, items, &mut rand::rng());
            let Some(status) = decision.status else {
                if from_memory {
                    self.pools.forget(pool_name);
                    continue;
                }
                return PoolStep::Committed {
                    record: Box::new(record),
                    outcomes: decision.outcomes,
                    written: false,
                };
            };
            let mut updated = pool;
            updated.status = Some(status);
            // `updated` still carries the resourceVersion read: that is the compare-and-swap.
            match pools
                .replace_status(pool_name, &PostParams::default(), &updated)
                .await
            {
                Ok(written) => {
                    self.pools.remember(&written);
                    let count = |f: fn(&ItemOutcome) -> usize| -> usize {
                        decision.outcomes.iter().map(f).sum()
                    };
                    tracing::info!(
                        "{label}: one write, {} ports allocated, {} released, {} refused \
                         (attempt {}, {} conflicts)",
                        count(|o| match o {
                            ItemOutcome::Changed { allocated, .. } => *allocated,
                            _ => 0,
                        }),
                        count(|o| match o {
                            ItemOutcome::Changed { released, .. } => *released,
                            _ => 0,
                        }),
                        count(|o| usize::from(matches!(o, ItemOutcome::Refused(_)))),
                        attempts.attempts,
                        attempts.conflicts
                    );
                    return PoolStep::Committed {
                        record: Box::new(record),
                        outcomes: decision.outcomes,
                        written: true,
                    };
                }
                Err(kube::Error::Api(status)) if from_memory && status.is_not_found() => {
                    // The copy outlived its pool: read again (which tells PoolNotFound).
                    self.pools.forget(pool_name);
                }
                Err(e) => {
                    self.pools.forget(pool_name);
                    let target = POOL_STATUS.on("update", pool_name, None);
                    if let Err(stop) = attempts.backoff(e, target, &label).await {
                        return stopped(stop);
                    }
                }
            }
        }
    }

    /// Write one committed item's status. A status write that fails goes the one-object way,
    /// which re-reads and retries (the pool step is then a no-op for it). `record` is the
    /// one-object record decided against (for a refusal's holdings), `shards` a sharded
    /// owner's `status.shards`.
    pub(super) async fn finish(
        &self,
        pa: PortAllocation,
        record: Option<&PoolRecord>,
        pool_uid: Option<&str>,
        shards: Option<Vec<i32>>,
        outcome: ItemOutcome,
        pool_written: bool,
    ) -> ItemResult {
        let (holdings, allocated, released) = match outcome {
            ItemOutcome::Refused(refusal) => {
                self.record_refusal(&pa, record, &refusal).await;
                return Err(refusal.into());
            }
            ItemOutcome::Unchanged(holdings) => (holdings, 0, 0),
            ItemOutcome::Changed {
                holdings,
                allocated,
                released,
            } => (holdings, allocated, released),
        };
        let mut status = allocation_status(&pa, &holdings, pool_uid, Outcome::Converged);
        if let Some(shards) = shards {
            status.shards = shards;
        }
        let report = |allocation, status_written| SyncReport {
            namespace: pa.namespace().unwrap_or_default(),
            name: pa.name_any(),
            pool: pa.spec.pool.clone(),
            holdings: holdings.clone(),
            allocated,
            released,
            attempts: 1,
            conflicts: 0,
            pool_written: pool_written && allocated + released > 0,
            status_written,
            allocation,
            configmap: None,
        };
        let mut done = if pa.status.as_ref() == Some(&status) {
            report(pa.clone(), false)
        } else {
            let mut updated = pa.clone();
            updated.status = Some(status);
            match allocations(&self.client, &pa)
                .replace_status(&pa.name_any(), &PostParams::default(), &updated)
                .await
            {
                Ok(written) => report(written, true),
                Err(e) => {
                    tracing::info!(
                        "{}: status write failed ({e}); syncing it on its own",
                        owner_of(&pa)
                    );
                    // The one-object path keeps the ConfigMap itself.
                    return self.sync_or_record(pa, None).await.map(|mut one| {
                        one.allocated += allocated;
                        one.released += released;
                        one.pool_written |= pool_written && allocated + released > 0;
                        one
                    });
                }
            }
        };
        // As the one-object path does after its status write: the env files follow the status.
        done.configmap = keep_env_configmap(&self.client, &done.allocation, false).await;
        Ok(done)
    }

    /// Record a refusal on the PortAllocation's status, as [`Allocator::sync_or_record`] does,
    /// from the pool already read. Best effort: the caller reports the refusal either way.
    async fn record_refusal(
        &self,
        pa: &PortAllocation,
        record: Option<&PoolRecord>,
        refusal: &Refusal,
    ) {
        let mut holdings: Holdings = pa
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default();
        // The pool's entry is the truth when the status names this very pool object; a status
        // naming an earlier pool of the same name is what `repair` restores from, so it stays.
        let recorded_pool = pa.status.as_ref().and_then(|s| s.pool_uid.as_deref());
        if let Some(record) = record
            && record.uid().is_some()
            && record.uid() == recorded_pool
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
        if updated.status == pa.status {
            return;
        }
        if let Err(e) = allocations(&self.client, pa)
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

fn allocations(client: &Client, pa: &PortAllocation) -> Api<PortAllocation> {
    Api::namespaced(client.clone(), &pa.namespace().unwrap_or_default())
}

fn stopped(stop: Stop) -> PoolStep {
    match stop {
        Stop::Final(error) => PoolStep::OneByOne(error),
        Stop::Exhausted(exhausted) => PoolStep::Exhausted(exhausted),
    }
}

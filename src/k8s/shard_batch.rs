//! Group commit into a sharded pool: `sync --all` (and the watcher's batches) write each shard
//! once for all the PortAllocations that live in it.
//!
//! One LIST reads every shard. Each PortAllocation whose known shards are one shard, where all
//! of its entries are, joins that shard's batch: the shard is decided with `decide_batch` (each
//! item as if alone; a refusal stays with its item) and written with one compare-and-swap; on
//! 409 the shard is read again and decided again. Everything else (owners spanning shards, a
//! requested port in another window, an item its shard has no room for) goes through the
//! one-object path, [`Allocator::sync_or_record`], which reads the whole pool when it must.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, stream};
use kube::ResourceExt;

use super::allocator::{AllocateError, Allocator, SyncReport};
use super::retry::Attempts;
use super::shards::ShardStore;
use crate::api::{PortAllocation, PortPool};
use crate::ledger::{
    BatchItem, ItemOutcome, Operation, PoolRecord, Refusal, ShardLayout, ShardWrite, ShardedRecord,
    decide_batch, known_shards, load_shard, owner_of, shard_name, single_shard,
};

type ItemResult = Result<SyncReport, AllocateError>;

/// One shard's batch after its commit.
struct ShardCommitted {
    index: u16,
    record: PoolRecord,
    outcomes: Vec<ItemOutcome>,
    written: bool,
}

impl Allocator {
    /// The batch of one sharded pool; one result per input, in the input's order.
    pub(super) async fn sync_sharded_pool(
        &self,
        pool: PortPool,
        pas: Vec<PortAllocation>,
        concurrency: usize,
    ) -> Vec<ItemResult> {
        // When the shards cannot be read as a whole, each item finds its own way.
        let grouped = self.group_by_shard(&pool, &pas).await.unwrap_or_default();
        let mut alone: BTreeSet<usize> = (0..pas.len()).collect();
        let mut results: Vec<Option<ItemResult>> = pas.iter().map(|_| None).collect();
        let committed: Vec<(Vec<usize>, Option<ShardCommitted>)> = stream::iter(grouped)
            .map(|(index, shard, members)| {
                let items: Vec<BatchItem> = members.iter().map(|&i| item_of(&pas[i])).collect();
                let pool = &pool;
                async move {
                    let done = self.commit_shard_batch(pool, index, shard, &items).await;
                    (members, done)
                }
            })
            .buffer_unordered(concurrency.clamp(1, 8))
            .collect()
            .await;
        let pool_uid = pool.metadata.uid.clone();
        let mut finishing = Vec::new();
        for (members, done) in committed {
            let Some(done) = done else { continue };
            for (i, outcome) in members.into_iter().zip(done.outcomes) {
                // No room in this shard (or another core refusal): the one-object path decides
                // on the whole pool.
                if matches!(outcome, ItemOutcome::Refused(Refusal::Core { .. })) {
                    continue;
                }
                alone.remove(&i);
                finishing.push((i, outcome, done.index, done.written));
            }
            drop(done.record);
        }
        let finished: Vec<(usize, ItemResult)> = stream::iter(finishing)
            .map(|(i, outcome, index, written)| {
                let pa = pas[i].clone();
                let pool_uid = pool_uid.clone();
                async move {
                    let shards = match &outcome {
                        ItemOutcome::Changed { holdings, .. }
                        | ItemOutcome::Unchanged(holdings)
                            if !holdings.is_empty() =>
                        {
                            vec![i32::from(index)]
                        }
                        _ => vec![],
                    };
                    let result = self
                        .finish(
                            pa,
                            None,
                            pool_uid.as_deref(),
                            Some(shards),
                            outcome,
                            written,
                        )
                        .await;
                    (i, result)
                }
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        for (i, result) in finished {
            results[i] = Some(result);
        }
        let rest: Vec<(usize, ItemResult)> = stream::iter(alone)
            .map(|i| {
                let pa = pas[i].clone();
                async move { (i, self.sync_or_record(pa, None).await) }
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        for (i, result) in rest {
            results[i] = Some(result);
        }
        results
            .into_iter()
            .map(|r| r.expect("every item is committed in a shard or synced alone"))
            .collect()
    }

    /// Read every shard once and put each item whose entries live in one shard into that
    /// shard's batch (by index, with the shard as read). `None` if the shards cannot be read.
    async fn group_by_shard(
        &self,
        pool: &PortPool,
        pas: &[PortAllocation],
    ) -> Option<Vec<(u16, Option<crate::api::PortPoolShard>, Vec<usize>)>> {
        let store = ShardStore::new(self.client.clone());
        let shards = store.list(&pool.name_any()).await.ok()?;
        let sharded = ShardedRecord::load(pool.clone(), shards.clone()).ok()?;
        let layout = ShardLayout::new(&sharded.ports, pool.spec.core_static_band());
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, pa) in pas.iter().enumerate() {
            let Ok(operation) = Operation::sync_of(pa) else {
                continue;
            };
            let uid = pa.uid().unwrap_or_default();
            let known = known_shards(
                pa.status.as_ref(),
                pool.metadata.uid.as_deref(),
                &layout,
                &uid,
            );
            let Some(index) = single_shard(&known, &operation) else {
                continue;
            };
            if sharded.shards_of(&uid).iter().all(|&k| k == index) {
                groups.entry(index).or_default().push(i);
            }
        }
        let name = pool.name_any();
        Some(
            groups
                .into_iter()
                .map(|(index, members)| {
                    let shard = shards
                        .iter()
                        .find(|s| s.name_any() == shard_name(&name, index))
                        .cloned();
                    (index, shard, members)
                })
                .collect(),
        )
    }

    /// The compare-and-swap loop of one shard's batch. `None` when it gives up (the items then
    /// go the one-object way, which has its own budget and reports its own errors).
    async fn commit_shard_batch(
        &self,
        pool: &PortPool,
        index: u16,
        mut shard: Option<crate::api::PortPoolShard>,
        items: &[BatchItem],
    ) -> Option<ShardCommitted> {
        let store = ShardStore::new(self.client.clone());
        let ports = pool.spec.port_set().ok()?;
        let layout = ShardLayout::new(&ports, pool.spec.core_static_band());
        let name = shard_name(&pool.name_any(), index);
        let label = format!("{} PortAllocations in shard {name:?}", items.len());
        let mut attempts = Attempts::new(self.policy);
        loop {
            let object = shard
                .take()
                .unwrap_or_else(|| crate::ledger::new_shard(pool, index));
            let record = load_shard(pool, &layout, index, object);
            let decision = decide_batch(&record, items, &mut rand::rng());
            let Some(status) = decision.status else {
                return Some(ShardCommitted {
                    index,
                    record,
                    outcomes: decision.outcomes,
                    written: false,
                });
            };
            let write = ShardWrite::replacing(index, &record, status);
            match store.commit(pool, &write).await {
                Ok(written) => {
                    self.shards.remember(&written);
                    tracing::info!("{label}: one write (attempt {})", attempts.attempts);
                    return Some(ShardCommitted {
                        index,
                        record,
                        outcomes: decision.outcomes,
                        written: true,
                    });
                }
                Err((e, target)) => {
                    self.shards.forget(&name);
                    attempts.backoff(e, target, &label).await.ok()?;
                    shard = match store.get(&name).await {
                        Ok(found) => found,
                        Err((e, target)) => {
                            attempts.backoff(e, target, &label).await.ok()?;
                            continue;
                        }
                    };
                }
            }
        }
    }
}

fn item_of(pa: &PortAllocation) -> BatchItem {
    BatchItem {
        uid: pa.uid().unwrap_or_default(),
        owner: owner_of(pa),
        operation: Operation::sync_of(pa),
    }
}

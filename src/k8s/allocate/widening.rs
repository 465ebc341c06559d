//! Pass 2 of a batch round (`batch`): its decision and the status writes that widen owners'
//! known shards, overlapped.
//!
//! An owner placed outside its known shards has its `status.shards` widened before any shard
//! write (the rule that makes a killed client repairable, see `known_shards`). Each widening is
//! known as soon as its owner is decided, and the decision of a large batch takes seconds of one
//! thread (14,474 owners at the envelope), so the decision runs on a thread of its own and each
//! widening's write starts as soon as it is decided, while the rest are decided. The shard writes
//! still start only after every widening has been written.

use std::collections::BTreeSet;

use futures::StreamExt;
use kube::ResourceExt;

use super::allocator::{Allocator, allocations};
use crate::api::PortAllocation;
use crate::k8s::error::Target;
use crate::k8s::resources::ALLOCATION_STATUS;
use crate::ledger::{
    BatchItem, Pass, PoolBatch, PoolRecord, ShardAnomaly, ShardKey, decide_pool_batch_telling,
};

/// A widening status write's result: the object as written, or the error and what it was.
pub(super) type Widened = Result<PortAllocation, (kube::Error, Target)>;

impl Allocator {
    /// Decide pass 2 for `rest` against `sharded` and write the widenings it asks for,
    /// `at_once` at a time, each as soon as it is decided. `pas[second[n]]` is the
    /// PortAllocation of `rest[n]`. Returns the decision and each widening's result by index
    /// into `rest`.
    ///
    /// A record with a shard that could not be loaded decides first and widens nothing: the
    /// caller refuses a batch that would create such a shard, and then nothing is written.
    pub(super) async fn decide_widening(
        &self,
        sharded: &PoolRecord,
        rest: &[BatchItem],
        (pas, second): (&[PortAllocation], &[usize]),
        at_once: usize,
        label: &str,
    ) -> (PoolBatch, Vec<(usize, Widened)>) {
        let early = !has_unloaded_shard(sharded);
        let started = std::time::Instant::now();
        let (tell, heard) = futures::channel::mpsc::unbounded::<(usize, BTreeSet<ShardKey>)>();
        let deciding = {
            let (record, items) = (sharded.clone(), rest.to_vec());
            tokio::task::spawn_blocking(move || {
                let batch = decide_pool_batch_telling(
                    &record,
                    &items,
                    Pass::Anywhere,
                    false,
                    &mut rand::rng(),
                    |n, shards| {
                        if early {
                            // Nobody listening any more (the round was dropped): nothing to do.
                            let _ = tell.unbounded_send((n, shards.clone()));
                        }
                    },
                );
                (batch, started.elapsed())
            })
        };
        let writes = heard
            .map(|(n, shards)| {
                let pa = pas[second[n]].clone();
                async move { (n, self.widen(pa, &shards).await) }
            })
            .buffer_unordered(at_once)
            .collect::<Vec<_>>();
        let (widened, decided) = futures::join!(writes, deciding);
        let (batch, took) = decided.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        tracing::info!(
            "{label}: pass 2 decided for {} in {:.1} s, {} status widenings written meanwhile",
            rest.len(),
            took.as_secs_f64(),
            widened.len()
        );
        (batch, widened)
    }

    /// The widenings of a batch decided without writing them ([`Allocator::decide_widening`]
    /// on a record with a shard it could not load), `at_once` at a time.
    pub(super) async fn widen_all(
        &self,
        batch: &PoolBatch,
        (pas, second): (&[PortAllocation], &[usize]),
        at_once: usize,
    ) -> Vec<(usize, Widened)> {
        let widens: Vec<_> = batch
            .widen
            .iter()
            .map(|(n, shards)| {
                let (n, pa, shards) = (*n, pas[second[*n]].clone(), shards.clone());
                async move { (n, self.widen(pa, &shards).await) }
            })
            .collect();
        futures::stream::iter(widens)
            .buffer_unordered(at_once)
            .collect()
            .await
    }

    /// Write `status.shards = shards` before entries outside the known shards are written.
    async fn widen(&self, pa: PortAllocation, shards: &BTreeSet<ShardKey>) -> Widened {
        let mut updated = pa.clone();
        let mut status = updated.status.take().unwrap_or_default();
        status.shards = crate::ledger::status_shards(shards);
        updated.status = Some(status);
        let name = pa.name_any();
        allocations(&self.client, &pa)
            .replace_status(&name, &crate::k8s::client::write_params(), &updated)
            .await
            .map(crate::k8s::client::lean)
            .map_err(|e| {
                let namespace = pa.namespace();
                (
                    e,
                    ALLOCATION_STATUS.on("update", &name, namespace.as_deref()),
                )
            })
    }
}

/// Whether some shard of the record could not be loaded (see [`ShardAnomaly::NotLoaded`]).
pub(super) fn has_unloaded_shard(sharded: &PoolRecord) -> bool {
    sharded
        .all_anomalies()
        .any(|(_, a)| matches!(a, ShardAnomaly::NotLoaded { .. }))
}

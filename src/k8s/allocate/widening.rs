//! Pass 2 of a batch round (`batch`): the owners pass 1 could not place within their known
//! shards, decided against the shards as pass 1's writes leave them, and what must be written
//! before their entries.
//!
//! An owner placed outside its known shards must be findable before any of its entries is
//! written (the rule that makes a killed client repairable, see `known_shards`). An owner whose
//! status names no shards yet is named in its home shard (`elsewhere`), by the very writes of
//! pass 1, so a batch of 15,000 new owners costs no write of its own for this; any other owner
//! has its `status.shards` widened. The decision of a large batch takes seconds of one thread,
//! so it runs on a thread of its own and each widening's write starts as soon as it is
//! decided. Pass 2's shard writes start only after every widening and every name is written.

use std::collections::{BTreeSet, HashMap};

use futures::StreamExt;
use kube::ResourceExt;

use super::allocator::{AllocateError, Allocator, allocations};
use super::batch::{
    Done, Progress, Round, STATUS_WRITES_AT_ONCE, StopAll, changes, has_unloaded_shard, waited,
};
use super::commit::blocked_shard;
use super::elsewhere::{Marks, home_alone};
use crate::api::PortAllocation;
use crate::k8s::error::Target;
use crate::k8s::resources::ALLOCATION_STATUS;
use crate::k8s::retry::Attempts;
use crate::ledger::{
    BatchItem, Pass, PoolBatch, PoolRecord, ShardKey, ShardWrite, decide_pool_batch_telling,
    marking_writes, rebased,
};

/// A widening status write's result: the object as written, or the error and what it was.
pub(super) type Widened = Result<PortAllocation, (kube::Error, Target)>;

/// Pass 2 decided, before pass 1's writes.
pub(super) struct SecondDecided {
    batch: PoolBatch,
    /// The widenings written while it was decided, by index into its items.
    early: Vec<(usize, Widened)>,
    /// Writes of the shards as pass 1 leaves them that name its owners in their homes: they
    /// go with pass 1's (`with_marks`). Empty when pass 2 would create a shard it cannot.
    pub(super) marking: Vec<ShardWrite>,
    /// A shard pass 2 would create whose name another object holds: (name, why).
    blocked: Option<(String, String)>,
}

impl Allocator {
    /// Pass 2 for `rest` (`second`: their indexes into `pas`), decided against `sharded` as
    /// `first` (pass 1's writes, not yet written) leaves it.
    pub(super) async fn decide_second(
        &self,
        sharded: &PoolRecord,
        first: &[ShardWrite],
        (rest, second): (&[BatchItem], &[usize]),
        pas: &[PortAllocation],
        label: &str,
    ) -> SecondDecided {
        let after = sharded.after_writes(first);
        let homes: Vec<Option<ShardKey>> = second
            .iter()
            .zip(rest)
            .map(|(&i, item)| home_alone(&pas[i], item))
            .collect();
        let owners = (pas, second);
        let (batch, early) = self
            .decide_widening(&after, (rest, &homes), owners, STATUS_WRITES_AT_ONCE, label)
            .await;
        let blocked = blocked_shard(&after, &batch.writes);
        let marking = match blocked {
            Some(_) => Vec::new(),
            None => {
                let named = batch
                    .marked
                    .iter()
                    .map(|&(n, home)| (rest[n].uid.as_str(), rest[n].owner.as_str(), home));
                marking_writes(&after, named)
            }
        };
        SecondDecided {
            batch,
            early,
            marking,
            blocked,
        }
    }

    /// Pass 2's writes, once pass 1's (`written`, with the names `decided.marking` carried)
    /// are committed in `sharded`: the widenings not written yet, then one write per changed
    /// shard.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn second_pass(
        &self,
        pool: &str,
        pas: &mut [PortAllocation],
        (second, rest): (&[usize], &[BatchItem]),
        progress: &mut Progress,
        decided: SecondDecided,
        (sharded, written, marks): (&PoolRecord, &[ShardWrite], &mut Marks),
        attempts: &mut Attempts,
        label: &str,
    ) -> Round {
        let SecondDecided {
            batch,
            early,
            blocked,
            ..
        } = decided;
        if let Some((shard, reason)) = blocked {
            let error = AllocateError::BlockedShard {
                owner: String::new(),
                pool: pool.into(),
                shard,
                reason,
            };
            return Round::Stop(StopAll::Error(error));
        }
        let owners = (&*pas, second);
        let widened = if has_unloaded_shard(sharded) {
            self.widen_all(&batch.widen, owners, STATUS_WRITES_AT_ONCE)
                .await
        } else {
            early
        };
        if let Some((e, target)) = take_widened(widened, pas, second) {
            // A PortAllocation changed meanwhile: decide pass 2 again from a fresh read.
            return waited(attempts.backoff(e, target, label).await, pool);
        }
        for &(n, home) in &batch.marked {
            marks.add(home, &rest[n].uid);
        }
        let writes = rebased(&batch.writes, written, sharded);
        // Each item is committed once the last of its shards is: its status goes then, while
        // the other writes go on.
        let mut waiting = Waiting::new(&writes, rest.len());
        let decided = batch
            .outcomes
            .into_iter()
            .zip(batch.shards)
            .zip(batch.copies);
        for (n, ((outcome, shards), copies)) in decided.enumerate() {
            let Some(outcome) = outcome else { continue };
            let written = changes(&outcome);
            let done = Done {
                outcome,
                shards,
                copies,
                written,
                pool_uid: sharded.pool.uid.clone(),
            };
            let on = if written {
                rest[n].known.union(&done.shards).copied().collect()
            } else {
                Vec::new()
            };
            if let Some(done) = waiting.add(n, &on, done) {
                progress.complete(second[n], &pas[second[n]], done);
            }
        }
        let mut conflict = None;
        let mut conflicts = 0;
        let mut results = self.commit_each(&writes, sharded);
        while let Some((w, result)) = results.next().await {
            match result {
                Ok(_) => {
                    for (n, done) in waiting.committed(w) {
                        progress.complete(second[n], &pas[second[n]], done);
                    }
                }
                Err(e) => {
                    // Its items go round again.
                    waiting.failed(w);
                    conflicts += 1;
                    conflict = Some(e);
                }
            }
        }
        drop(results);
        self.log_writes(label, writes.len(), conflicts);
        match conflict {
            Some((e, target)) => waited(attempts.backoff(e, target, label).await, pool),
            None => Round::Again,
        }
    }

    /// Decide pass 2 for `rest` against `sharded` and write the widenings it asks for,
    /// `at_once` at a time, each as soon as it is decided. `pas[second[n]]` is the
    /// PortAllocation of `rest[n]`. Returns the decision and each widening's result by index
    /// into `rest`.
    ///
    /// A record with a shard that could not be loaded decides first and widens nothing: the
    /// caller refuses a batch that would create such a shard, and then nothing is written.
    async fn decide_widening(
        &self,
        sharded: &PoolRecord,
        (rest, homes): (&[BatchItem], &[Option<ShardKey>]),
        (pas, second): (&[PortAllocation], &[usize]),
        at_once: usize,
        label: &str,
    ) -> (PoolBatch, Vec<(usize, Widened)>) {
        let early = !has_unloaded_shard(sharded);
        let started = std::time::Instant::now();
        let (tell, heard) = futures::channel::mpsc::unbounded::<(usize, BTreeSet<ShardKey>)>();
        let deciding = {
            let (record, items, homes) = (sharded.clone(), rest.to_vec(), homes.to_vec());
            tokio::task::spawn_blocking(move || {
                let batch = decide_pool_batch_telling(
                    &record,
                    &items,
                    (Pass::Anywhere, &homes),
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
            "{label}: pass 2 decided for {} in {:.1} s, {} status widenings written meanwhile, \
             {} owners to name in their home shards",
            rest.len(),
            took.as_secs_f64(),
            widened.len(),
            batch.marked.len()
        );
        (batch, widened)
    }

    /// Widenings decided without writing them, `at_once` at a time: a batch's, on a record
    /// with a shard it could not load ([`Allocator::decide_widening`]), or a step's
    /// (`stepped`). Each is `(n, shards)`: the owner `pas[second[n]]` and its shards.
    pub(super) async fn widen_all(
        &self,
        widen: &[(usize, BTreeSet<ShardKey>)],
        (pas, second): (&[PortAllocation], &[usize]),
        at_once: usize,
    ) -> Vec<(usize, Widened)> {
        let widens: Vec<_> = widen
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
    pub(super) async fn widen(&self, pa: PortAllocation, shards: &BTreeSet<ShardKey>) -> Widened {
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

/// Keep each widened PortAllocation as written (`pas[second[n]]`), so its next write starts
/// from that version; the last failure, if any widening failed.
pub(super) fn take_widened(
    widened: Vec<(usize, Widened)>,
    pas: &mut [PortAllocation],
    second: &[usize],
) -> Option<(kube::Error, Target)> {
    let mut failed = None;
    for (n, result) in widened {
        match result {
            Ok(pa) => pas[second[n]] = pa,
            Err(e) => failed = Some(e),
        }
    }
    failed
}

/// Pass 2's items waiting for their shard writes (by index into the writes): each is
/// committed once the last write it waits for is, and never when one of them fails.
pub(super) struct Waiting {
    index: HashMap<ShardKey, usize>,
    /// By write: the items waiting for it.
    items_of: Vec<Vec<usize>>,
    /// By item: how many writes it still waits for, and what it is once committed.
    left: Vec<usize>,
    pending: Vec<Option<Done>>,
}

impl Waiting {
    pub(super) fn new(writes: &[ShardWrite], items: usize) -> Waiting {
        Waiting {
            index: writes
                .iter()
                .enumerate()
                .map(|(w, write)| (write.key, w))
                .collect(),
            items_of: vec![Vec::new(); writes.len()],
            left: vec![0; items],
            pending: (0..items).map(|_| None).collect(),
        }
    }

    /// Item `n`, committed once the writes of shards `on` are (those without a write count
    /// for nothing): `Some` when it waits for none.
    pub(super) fn add(&mut self, n: usize, on: &[ShardKey], done: Done) -> Option<Done> {
        for key in on {
            if let Some(&w) = self.index.get(key) {
                self.items_of[w].push(n);
                self.left[n] += 1;
            }
        }
        if self.left[n] == 0 {
            return Some(done);
        }
        self.pending[n] = Some(done);
        None
    }

    /// Write `w` committed: the items it was the last wait of.
    pub(super) fn committed(&mut self, w: usize) -> Vec<(usize, Done)> {
        let mut ready = Vec::new();
        for &n in &self.items_of[w] {
            self.left[n] -= 1;
            if self.left[n] == 0
                && let Some(done) = self.pending[n].take()
            {
                ready.push((n, done));
            }
        }
        ready
    }

    /// Write `w` failed: its items are not committed.
    pub(super) fn failed(&mut self, w: usize) {
        for &n in &self.items_of[w] {
            self.pending[n] = None;
        }
    }
}

//! Group commit: `sync --all` (and the watcher's batches) write each shard of a pool once for
//! all the PortAllocations whose entries change in it, whatever their number.
//!
//! A round reads the pool and its shards (one GET, one LIST) and decides every item against
//! that read ([`decide_pool_batch`]), in two passes:
//! 1. every item that stays within its known shards (its home, or the shards its status names):
//!    one write per changed shard, all at once;
//! 2. the rest (homes without room, owners spanning shards), against the shards as pass 1 left
//!    them: first their statuses are widened to name the new shards (the rule that makes a
//!    kill safe; each written as soon as its owner is decided, see `widening`), then one write
//!    per changed shard.
//!
//! In `sync --all`, a pass 2 of more than one step (over 256 owners) goes in steps instead
//! (`stepped`): the names go with pass 1 before it is decided, and each step is written while
//! the next is decided.
//!
//! Each shard is written at most once per pass (or step), by one task, starting from the
//! version the round read or the write before it made, so a batch never conflicts with
//! itself; every write carries at most one 256-port window's entries, so none can outgrow what
//! the API server and etcd take.
//! A shard that another client wrote meanwhile (409) is the only thing a new round redoes: the
//! items of the shards that committed are done. A refusal the ledger decides (pool full, port
//! held, invalid spec) stays with its item. The shard writes are the commit point; the
//! PortAllocations' statuses are derived from them afterwards, several at a time, so a kill in
//! between leaves what a single `sync` leaves.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, stream};
use kube::ResourceExt;

use super::allocator::{AllocateError, Allocator, exhausted_error};
use super::elsewhere::Marks;
use super::sync::SyncReport;
use crate::api::{PortAllocation, PortPoolShard};
use crate::core::SlotKey;
use crate::k8s::process::cpu_bound;
use crate::k8s::record::{ShardStore, read_pool};
use crate::k8s::resources::POOLS;
use crate::k8s::retry::{Attempts, Stop};
use crate::ledger::{
    BatchItem, ItemOutcome, Operation, Pass, PoolBatch, PoolRecord, PoolSnapshot, Refusal,
    ShardAnomaly, ShardKey, ShardWrite, decide_pool_batch, known_shards, listed_shards, owner_of,
    step_ends, with_marks,
};

pub(super) type ItemResult = Result<SyncReport, AllocateError>;

/// Shard writes in flight at once.
const WRITES_AT_ONCE: usize = 8;

/// A batch's status writes in flight at once (the widening ones and the final ones), for
/// `sync --all` and the watcher's group commit alike: they are most of a large batch's time
/// (15,000 new PortAllocations in one pool: 58 of `sync --all`'s 162 s), and with 4 in flight
/// a round of ~1,000 spent longer writing statuses than deciding and writing shards together.
/// A widening write is as small as a final one, so it goes as many at once.
pub(super) const STATUS_WRITES_AT_ONCE: usize = 16;

/// One shard write's result: the shard as written, or the error and what it was.
pub(super) type ShardResult = Result<PortPoolShard, ShardError>;

/// A shard write's error, and what it was.
pub(super) type ShardError = (kube::Error, crate::k8s::error::Target);

/// The version each shard a round wrote has now (`None`: not created yet).
pub(super) type Versions = std::collections::HashMap<ShardKey, Option<String>>;

/// An item decided and committed, waiting for its status write.
pub(super) struct Done {
    pub(super) outcome: ItemOutcome,
    pub(super) shards: BTreeSet<ShardKey>,
    /// Where its pods are spread over copies, the copy of each slot (else empty).
    pub(super) copies: BTreeMap<SlotKey, u16>,
    pub(super) written: bool,
    /// The pool object's UID, as the round that committed it read it.
    pub(super) pool_uid: String,
}

/// Which items of a pool's batch are committed, and where each goes as it is: its status is
/// written at once (`finishing`).
pub(super) struct Progress {
    pub(super) done: Vec<bool>,
    ready: futures::channel::mpsc::UnboundedSender<(usize, PortAllocation, Done)>,
}

impl Progress {
    /// Item `i` (`pa`, as it now is) is committed.
    pub(super) fn complete(&mut self, i: usize, pa: &PortAllocation, done: Done) {
        self.done[i] = true;
        // Nobody listening any more (the batch was dropped): nothing to write.
        let _ = self.ready.unbounded_send((i, pa.clone(), done));
    }
}

/// What a pool's rounds keep for after them: the pool's spec last read, and the home shards
/// that name owners of the batch (`elsewhere`).
#[derive(Default)]
struct Kept {
    pool: Option<PoolSnapshot>,
    marks: Marks,
    /// Whether a pass 2 of more than one step goes in steps (`stepped`).
    in_steps: bool,
}

/// How a round of one pool's batch ended.
pub(super) enum Round {
    /// Read again (conflicts, or a read that failed, already waited for).
    Again,
    /// No round can do more: every item still open gets this.
    Stop(StopAll),
}

pub(super) enum StopAll {
    Refused(Refusal),
    Error(AllocateError),
}

impl Allocator {
    /// Sync every PortAllocation in `pas`: per pool, one write per changed shard for all of
    /// them, then their statuses, [`STATUS_WRITES_AT_ONCE`] at a time. One result per input,
    /// in the input's order.
    pub async fn sync_many(&self, pas: Vec<PortAllocation>) -> Vec<ItemResult> {
        self.sync_batches(pas, false).await
    }

    /// [`Allocator::sync_many`] for `sync --all`: a pass 2 of more than one step is written
    /// step by step while the rest of it is decided (`stepped`). The watcher's rounds stay
    /// whole: the next round's callers queue while one is written, and in steps the envelope's
    /// watcher took 92.4 s from empty where it took 85.9 s without (one run each).
    pub async fn sync_all(&self, pas: Vec<PortAllocation>) -> Vec<ItemResult> {
        self.sync_batches(pas, true).await
    }

    async fn sync_batches(&self, pas: Vec<PortAllocation>, in_steps: bool) -> Vec<ItemResult> {
        let mut pools: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, pa) in pas.iter().enumerate() {
            pools.entry(pa.spec.pool.clone()).or_default().push(i);
        }
        let mut results: Vec<Option<ItemResult>> = pas.iter().map(|_| None).collect();
        for (pool, members) in pools {
            let batch: Vec<PortAllocation> = members.iter().map(|&i| pas[i].clone()).collect();
            let done = self.sync_pool(&pool, batch, in_steps).await;
            for (i, result) in members.into_iter().zip(done) {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every input belongs to one pool"))
            .collect()
    }

    /// One pool's batch: rounds until every item is committed or refused. Each item's status
    /// is written as soon as the shards it is in are committed, [`STATUS_WRITES_AT_ONCE`] at a
    /// time, while the rest are still decided and written.
    async fn sync_pool(
        &self,
        pool: &str,
        mut pas: Vec<PortAllocation>,
        in_steps: bool,
    ) -> Vec<ItemResult> {
        let (ready, committed) = futures::channel::mpsc::unbounded();
        let mut progress = Progress {
            done: vec![false; pas.len()],
            ready,
        };
        let mut attempts = Attempts::new(self.policy);
        let label = format!("{} PortAllocations in pool {pool:?}", pas.len());
        let mut kept = Kept {
            in_steps,
            ..Kept::default()
        };
        let rounds = async {
            let stop = loop {
                let open: Vec<usize> = (0..pas.len()).filter(|&i| !progress.done[i]).collect();
                if open.is_empty() {
                    break None;
                }
                let round = self.batch_round(
                    pool,
                    &mut pas,
                    &open,
                    &mut progress,
                    &mut kept,
                    &mut attempts,
                    &label,
                );
                match round.await {
                    Round::Again => continue,
                    Round::Stop(stop) => break Some(stop),
                }
            };
            // No item is committed after this: the status writes end with those sent.
            let done = std::mem::take(&mut progress.done);
            drop(progress);
            (stop, done)
        };
        let finishing = committed
            .map(|(i, pa, done)| async move { (i, self.finish(pa, done).await) })
            .buffer_unordered(STATUS_WRITES_AT_ONCE)
            .collect::<Vec<_>>();
        let ((stop, done), finished) = futures::join!(rounds, finishing);
        let mut results: Vec<Option<ItemResult>> = pas.iter().map(|_| None).collect();
        for (i, result) in finished {
            results[i] = Some(result);
        }
        let left: Vec<usize> = (0..pas.len()).filter(|&i| !done[i]).collect();
        let (all, stop) = (&pas, &stop);
        let stopped = stream::iter(left)
            .map(|i| async move { (i, self.stopped(&all[i], stop.as_ref()).await) })
            .buffer_unordered(STATUS_WRITES_AT_ONCE)
            .collect::<Vec<_>>()
            .await;
        for (i, error) in stopped {
            results[i] = Some(Err(error));
        }
        let results: Vec<ItemResult> = results
            .into_iter()
            .map(|r| r.expect("each item finished or stopped"))
            .map(|r| {
                r.map(|mut report| {
                    report.attempts = attempts.attempts;
                    report.conflicts = attempts.conflicts;
                    report
                })
            })
            .collect();
        // Home shards stop naming the owners whose statuses now name their shards.
        if let Some(snapshot) = &kept.pool {
            let named: BTreeSet<String> = results
                .iter()
                .flatten()
                .filter(|r| !listed_shards(r.allocation.status.as_ref()).is_empty())
                .filter_map(|r| r.allocation.uid())
                .collect();
            self.unmark(snapshot, kept.marks, &named, &label).await;
        }
        results
    }

    /// One read, two passes. Items committed (or refused) are set in `done`.
    #[allow(clippy::too_many_arguments)]
    async fn batch_round(
        &self,
        pool: &str,
        pas: &mut [PortAllocation],
        open: &[usize],
        progress: &mut Progress,
        kept: &mut Kept,
        attempts: &mut Attempts,
        label: &str,
    ) -> Round {
        let mut sharded = match self.read_record(pool, attempts, label).await {
            Ok(sharded) => sharded,
            Err(round) => return round,
        };
        self.pools.remember(pool, &sharded.pool);
        kept.pool = Some(sharded.pool.clone());
        let items: Vec<BatchItem> = open.iter().map(|&i| item_of(&pas[i], &sharded)).collect();
        kept.marks.add_found(&sharded, &items);

        // Pass 1: within known shards; the pool's spec goes to every shard that lacks it.
        let first = cpu_bound(|| {
            decide_pool_batch(&sharded, &items, Pass::WithinKnown, true, &mut rand::rng())
        });
        let left: Vec<usize> = (0..items.len())
            .filter(|&n| first.outcomes[n].is_none())
            .collect();
        let rest: Vec<BatchItem> = left.iter().map(|&n| items[n].clone()).collect();
        let second: Vec<usize> = left.iter().map(|&n| open[n]).collect();
        if kept.in_steps && step_ends(rest.len()).len() > 1 && !has_unloaded_shard(&sharded) {
            let round = (sharded, first, &mut kept.marks);
            let pass = (open, progress, attempts, label);
            return self
                .round_in_steps(pool, pas, round, (&second, &rest), pass)
                .await;
        }
        // Pass 2 is decided against the shards as pass 1's writes leave them, before those are
        // written, so that the same writes name in their home shards exactly the owners it
        // places elsewhere (`elsewhere`); its own writes wait for them. Pass 2 goes in steps
        // (`stepped`) only in `sync --all`, when it takes more than one, on a record whose
        // every shard loaded (else it may refuse the whole batch, and then writes nothing).
        let decided = match rest.is_empty() {
            true => None,
            false => Some(
                self.decide_second(&sharded, &first.writes, (&rest, &second), pas, label)
                    .await,
            ),
        };
        let writes = match &decided {
            Some(decided) => with_marks(&first.writes, &decided.marking),
            None => first.writes.clone(),
        };
        let (conflict, _) = self
            .write_first(&writes, &mut sharded, first, (open, progress, &*pas), label)
            .await;
        if let Some((e, target)) = conflict {
            // Some shard was written by another client meanwhile: its items go round again,
            // with pass 2, after a fresh read.
            return waited(attempts.backoff(e, target, label).await, pool);
        }
        let Some(decided) = decided else {
            return Round::Again;
        };
        let round = (&sharded, writes.as_slice(), &mut kept.marks);
        self.second_pass(
            pool,
            pas,
            (&second, &rest),
            progress,
            decided,
            round,
            attempts,
            label,
        )
        .await
    }

    /// Commit pass 1's `writes` (the names of the owners pass 2 moves among them) and complete
    /// the items of pass 1 (`first`) whose shards committed. Returns a conflict, if a shard
    /// was written by another client meanwhile, and the version each shard written now has.
    pub(super) async fn write_first(
        &self,
        writes: &[ShardWrite],
        sharded: &mut PoolRecord,
        first: PoolBatch,
        (open, progress, pas): (&[usize], &mut Progress, &[PortAllocation]),
        label: &str,
    ) -> (Option<ShardError>, Versions) {
        let committed = self.write_all(writes, sharded, label).await;
        let mut conflict = None;
        let mut versions = Versions::new();
        for (write, result) in writes.iter().zip(committed) {
            match result {
                Ok(written) => {
                    versions.insert(write.key, written.metadata.resource_version.clone());
                    replace_shard(sharded, written);
                }
                Err(e) => conflict = Some(e),
            }
        }
        let failed: BTreeSet<ShardKey> = failed_shards(writes, sharded);
        let outcomes = first
            .outcomes
            .into_iter()
            .zip(first.shards)
            .zip(first.copies);
        for (n, ((outcome, shards), copies)) in outcomes.enumerate() {
            match outcome {
                Some(outcome) if shards.is_disjoint(&failed) || !changes(&outcome) => {
                    let written = changes(&outcome);
                    let done = Done {
                        outcome,
                        shards,
                        copies,
                        written,
                        pool_uid: sharded.pool.uid.clone(),
                    };
                    progress.complete(open[n], &pas[open[n]], done);
                }
                None | Some(_) => {}
            }
        }
        (conflict, versions)
    }

    /// Read the pool and its shards once; a round's answer (`Err`) when that fails.
    async fn read_record(
        &self,
        pool: &str,
        attempts: &mut Attempts,
        label: &str,
    ) -> Result<PoolRecord, Round> {
        let store = ShardStore::new(self.client.clone());
        let read = match read_pool(&self.client, pool).await {
            Ok(Some(object)) => store
                .list(pool)
                .await
                .map(|shards| (PoolSnapshot::of_pool(&object), shards)),
            Ok(None) => {
                return Err(Round::Stop(StopAll::Refused(Refusal::PoolNotFound {
                    pool: pool.into(),
                    owner: String::new(),
                })));
            }
            Err(e) => Err((e, POOLS.on("get", pool, None))),
        };
        let (mut copy, shards) = match read {
            Ok(read) => read,
            Err((e, target)) => return Err(waited(attempts.backoff(e, target, label).await, pool)),
        };
        crate::k8s::nodes::count_if_unknown(&self.client, &mut copy).await;
        cpu_bound(|| PoolRecord::load(copy, shards)).map_err(|error| {
            Round::Stop(StopAll::Refused(Refusal::PoolSpec {
                pool: pool.into(),
                error,
            }))
        })
    }

    /// Commit `writes` (one per shard), several at once; one result per write, in order.
    pub(super) async fn write_all(
        &self,
        writes: &[ShardWrite],
        sharded: &PoolRecord,
        label: &str,
    ) -> Vec<ShardResult> {
        let mut results: Vec<(usize, ShardResult)> =
            self.commit_each(writes, sharded).collect().await;
        results.sort_by_key(|(n, _)| *n);
        let mut ordered: Vec<ShardResult> = Vec::with_capacity(results.len());
        for (_, result) in results {
            ordered.push(result);
        }
        let results = ordered;
        self.log_writes(
            label,
            writes.len(),
            results.iter().filter(|r| r.is_err()).count(),
        );
        results
    }

    /// Commit `writes` (one per shard), several at once, each result as it comes, with its
    /// index into `writes`. A shard written is remembered, one not written forgotten.
    pub(super) fn commit_each<'a>(
        &'a self,
        writes: &'a [ShardWrite],
        sharded: &'a PoolRecord,
    ) -> impl futures::Stream<Item = (usize, ShardResult)> + 'a {
        let store = ShardStore::new(self.client.clone());
        stream::iter(writes.iter().enumerate())
            .map(move |(n, write)| {
                let store = store.clone();
                async move {
                    let result = store.commit(&sharded.pool, write).await;
                    match &result {
                        Ok(written) => self.shards.remember(&write.name, written),
                        Err(_) => self.shards.forget(&write.name),
                    }
                    (n, result)
                }
            })
            .buffer_unordered(WRITES_AT_ONCE)
    }

    /// The `-v 1` line of a pass's shard writes (the envelope's cell reads it).
    pub(super) fn log_writes(&self, label: &str, writes: usize, conflicts: usize) {
        if writes > 0 {
            tracing::info!("{label}: {writes} shard writes, {conflicts} conflicts");
        }
    }
}

fn item_of(pa: &PortAllocation, sharded: &PoolRecord) -> BatchItem {
    let owner = owner_of(pa);
    BatchItem {
        uid: pa.uid().unwrap_or_default(),
        known: known_shards(pa.status.as_ref(), &sharded.layout, &owner),
        owner,
        operation: Operation::sync_of(pa),
    }
}

/// Whether an outcome changes entries (and so needs its shards committed).
pub(super) fn changes(outcome: &ItemOutcome) -> bool {
    matches!(outcome, ItemOutcome::Changed { .. })
}

/// The shards among `writes` whose write did not commit (not replaced by its response).
fn failed_shards(writes: &[ShardWrite], sharded: &PoolRecord) -> BTreeSet<ShardKey> {
    writes
        .iter()
        .filter(|w| {
            sharded
                .copy(w.key.copy)
                .and_then(|copy| copy.shards.get(&w.key.window))
                .is_none_or(|s| s.record.resource_version() == w.resource_version)
        })
        .map(|w| w.key)
        .collect()
}

/// The shard as written becomes the record the next pass decides against.
fn replace_shard(sharded: &mut PoolRecord, written: PortPoolShard) {
    sharded.replace(written);
}

pub(super) fn waited(result: Result<(), Stop>, pool: &str) -> Round {
    match result {
        Ok(()) => Round::Again,
        Err(Stop::Final(e)) => Round::Stop(StopAll::Error(AllocateError::Kube(e))),
        Err(Stop::Exhausted(exhausted)) => {
            Round::Stop(StopAll::Error(exhausted_error(exhausted, pool, "")))
        }
    }
}

/// Whether some shard of the record could not be loaded (see [`ShardAnomaly::NotLoaded`]).
pub(super) fn has_unloaded_shard(sharded: &PoolRecord) -> bool {
    sharded
        .all_anomalies()
        .any(|(_, a)| matches!(a, ShardAnomaly::NotLoaded { .. }))
}

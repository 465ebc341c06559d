//! Pass 2 of a batch round in steps (`batch`): its decision takes seconds of one thread at the
//! envelope (15,000 new owners), while the API server waits. So the home shards name every
//! owner pass 2 may move at once, in pass 1's writes, which go without waiting for pass 2; pass
//! 2 is decided meanwhile on a thread of its own, step after step ([`BatchSteps`]); and each
//! step's widenings, then its shard writes, go as soon as it is decided and the step before it
//! is committed. The statuses of a step's owners are written as their shards commit, while
//! later steps are still decided and written.
//!
//! Naming before deciding names some owners in vain: one refused with nothing outside its home
//! is unnamed with the others at the batch's end (`elsewhere`). A shard changed in two steps is
//! written in each, the later from the version the earlier made, so a batch still never
//! conflicts with itself.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;

use super::allocator::Allocator;
use super::batch::{
    Done, Progress, Round, STATUS_WRITES_AT_ONCE, ShardError, Versions, changes, waited,
};
use super::elsewhere::{Marks, home_alone};
use super::widening::{Waiting, take_widened};
use crate::api::PortAllocation;
use crate::k8s::retry::Attempts;
use crate::ledger::{
    BatchItem, BatchSteps, ItemOutcome, Pass, PoolBatch, PoolRecord, ShardKey, ShardWrite,
    marking_writes, step_ends, with_marks,
};

/// A step of pass 2 as the deciding thread hands it over: its first item, and what it decided.
type Step = (usize, PoolBatch);

/// One round's pass 2, in the order its steps are committed.
struct Second<'a> {
    pool: &'a str,
    second: &'a [usize],
    rest: &'a [BatchItem],
    sharded: &'a PoolRecord,
    versions: Versions,
    /// Shard writes that failed.
    failed: usize,
    label: &'a str,
}

impl Allocator {
    /// A round whose pass 2 goes in steps: pass 1's writes with every name pass 2 may need,
    /// then each step's writes as it comes (see the module's comment).
    pub(super) async fn round_in_steps(
        &self,
        pool: &str,
        pas: &mut [PortAllocation],
        (mut sharded, first, marks): (PoolRecord, PoolBatch, &mut Marks),
        (second, rest): (&[usize], &[BatchItem]),
        (open, progress, attempts, label): (&[usize], &mut Progress, &mut Attempts, &str),
    ) -> Round {
        let homes: Vec<Option<ShardKey>> = second
            .iter()
            .zip(rest)
            .map(|(&i, item)| home_alone(&pas[i], item))
            .collect();
        let writes = {
            let after = sharded.after_writes(&first.writes);
            let named = rest.iter().zip(&homes).filter_map(|(item, home)| {
                Some((item.uid.as_str(), item.owner.as_str(), (*home)?))
            });
            with_marks(&first.writes, &marking_writes(&after, named))
        };
        let stop = Arc::new(AtomicBool::new(false));
        let after = sharded.after_writes(&writes);
        let steps = decide_in_steps(&after, rest, homes.clone(), &stop, label);
        let (conflict, versions) = self
            .write_first(&writes, &mut sharded, first, (open, progress, &*pas), label)
            .await;
        if let Some((e, target)) = conflict {
            stop.store(true, Ordering::Relaxed);
            return waited(attempts.backoff(e, target, label).await, pool);
        }
        for (item, home) in rest.iter().zip(&homes) {
            if let Some(home) = home {
                marks.add(*home, &item.uid);
            }
        }
        let mut pass = Second {
            pool,
            second,
            rest,
            sharded: &sharded,
            versions,
            failed: 0,
            label,
        };
        let mut written = 0;
        let mut steps = std::pin::pin!(steps);
        while let Some((start, step)) = steps.next().await {
            written += step.writes.len();
            let committed = self
                .commit_step(&mut pass, (start, step), pas, progress, marks, attempts)
                .await;
            if let Err(round) = committed {
                stop.store(true, Ordering::Relaxed);
                self.log_writes(label, written, pass.failed);
                return round;
            }
        }
        self.log_writes(label, written, pass.failed);
        Round::Again
    }

    /// One step: its widenings, then one write per shard it changed, each from the version
    /// the round last wrote; its items are committed as their shards are. `Err`: the round
    /// ends so (a write failed and was waited for).
    async fn commit_step(
        &self,
        pass: &mut Second<'_>,
        (start, step): Step,
        pas: &mut [PortAllocation],
        progress: &mut Progress,
        marks: &mut Marks,
        attempts: &mut Attempts,
    ) -> Result<(), Round> {
        let (second, rest, label) = (pass.second, pass.rest, pass.label);
        let widened = self
            .widen_all(&step.widen, (&*pas, second), STATUS_WRITES_AT_ONCE)
            .await;
        if let Some((e, target)) = take_widened(widened, pas, second) {
            // A PortAllocation changed meanwhile: decide pass 2 again from a fresh read.
            return Err(waited(attempts.backoff(e, target, label).await, pass.pool));
        }
        let writes: Vec<ShardWrite> = step
            .writes
            .into_iter()
            .map(|write| match pass.versions.get(&write.key) {
                Some(version) => ShardWrite {
                    resource_version: version.clone(),
                    ..write
                },
                None => write,
            })
            .collect();
        let mut waiting = Waiting::new(&writes, step.outcomes.len());
        let decided = step.outcomes.into_iter().zip(step.shards).zip(step.copies);
        for (k, ((outcome, shards), copies)) in decided.enumerate() {
            let Some(outcome) = outcome else { continue };
            let n = start + k;
            if needless(&outcome, &shards, &rest[n]) {
                marks.needless(&rest[n].uid);
            }
            let written = changes(&outcome);
            let on: Vec<ShardKey> = match written {
                true => rest[n].known.union(&shards).copied().collect(),
                false => Vec::new(),
            };
            let done = Done {
                outcome,
                shards,
                copies,
                written,
                pool_uid: pass.sharded.pool.uid.clone(),
            };
            if let Some(done) = waiting.add(k, &on, done) {
                progress.complete(second[n], &pas[second[n]], done);
            }
        }
        let mut conflict: Option<ShardError> = None;
        let mut results = self.commit_each(&writes, pass.sharded);
        while let Some((w, result)) = results.next().await {
            match result {
                Ok(shard) => {
                    let version = shard.metadata.resource_version.clone();
                    pass.versions.insert(writes[w].key, version);
                    for (k, done) in waiting.committed(w) {
                        let n = second[start + k];
                        progress.complete(n, &pas[n], done);
                    }
                }
                Err(e) => {
                    // Its items go round again.
                    waiting.failed(w);
                    pass.failed += 1;
                    conflict = Some(e);
                }
            }
        }
        drop(results);
        match conflict {
            Some((e, target)) => Err(waited(attempts.backoff(e, target, label).await, pass.pool)),
            None => Ok(()),
        }
    }
}

/// Decide pass 2 for `rest` against `after` (the shards as pass 1's writes leave them) on
/// a thread of its own, step after step, until `stop`. Each step comes with its first item.
fn decide_in_steps(
    after: &PoolRecord,
    rest: &[BatchItem],
    homes: Vec<Option<ShardKey>>,
    stop: &Arc<AtomicBool>,
    label: &str,
) -> futures::channel::mpsc::UnboundedReceiver<Step> {
    let (tell, steps) = futures::channel::mpsc::unbounded::<Step>();
    let (record, items, stop, label) = (
        after.clone(),
        rest.to_vec(),
        stop.clone(),
        label.to_string(),
    );
    // Detached: a round that stops early sets `stop`, and the thread ends after its step.
    drop(tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let mut deciding = BatchSteps::new(&record, &items, (Pass::Anywhere, &homes));
        let mut rng = rand::rng();
        let (mut widened, mut named, mut count) = (0, 0, 0);
        for end in step_ends(items.len()) {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let start = deciding.decided();
            deciding.decide_to(end, &mut rng, |_, _| {});
            let step = deciding.step(false);
            widened += step.widen.len();
            named += step.marked.len();
            count += 1;
            if tell.unbounded_send((start, step)).is_err() {
                return;
            }
        }
        tracing::info!(
            "{label}: pass 2 decided for {} in {:.1} s, in {count} steps each written as \
             the next was decided, {widened} status widenings written meanwhile, {named} \
             owners to name in their home shards",
            items.len(),
            started.elapsed().as_secs_f64(),
        );
    }));
    steps
}

/// Whether `item`, named in its home before it was decided, was named in vain: refused, with
/// no entry outside its known shards.
fn needless(outcome: &ItemOutcome, shards: &BTreeSet<ShardKey>, item: &BatchItem) -> bool {
    matches!(outcome, ItemOutcome::Refused { .. }) && shards.is_subset(&item.known)
}

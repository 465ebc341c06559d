//! A batch decided in steps: the group commit's second pass, whose decision takes seconds of
//! one thread at the envelope, commits each step's writes while the next step is decided, so
//! its first shard and status writes need not wait for the whole decision. Deciding in steps
//! decides exactly what one batch would (the items go in the same order against the same
//! record); only the writes are cut between steps, and a shard changed in two steps is written
//! in each. Pure.

use std::collections::BTreeSet;

use rand::Rng;

use super::shard_choice::{BatchItem, Pass, PoolBatch, decide_into};
use crate::ledger::record::pool_record::PoolRecord;
use crate::ledger::record::windows::ShardKey;

/// The first step's items: few, so that its writes start soon.
const FIRST_STEP: usize = 256;
/// The largest step's items: each step's writes wait for its whole decision (at the envelope
/// about 0.4 ms an item), and a step is the most a client that gives up decides in vain.
const LARGEST_STEP: usize = 2048;

/// A batch being decided, step after step (see the module's comment).
pub struct BatchSteps<'a> {
    work: PoolRecord,
    items: &'a [BatchItem],
    pass: Pass,
    homes: &'a [Option<ShardKey>],
    /// The items decided so far.
    decided: usize,
    /// What the items decided since the last step decided: its item indexes (`widen`,
    /// `marked`) are the batch's.
    open: PoolBatch,
}

impl<'a> BatchSteps<'a> {
    /// `items` to decide in order against `sharded`; `homes[n]`, when given, is where item `n`
    /// may be named instead of widened (see `decide_pool_batch_telling`).
    pub fn new(
        sharded: &PoolRecord,
        items: &'a [BatchItem],
        (pass, homes): (Pass, &'a [Option<ShardKey>]),
    ) -> BatchSteps<'a> {
        BatchSteps {
            work: sharded.clone(),
            items,
            pass,
            homes,
            decided: 0,
            open: PoolBatch::default(),
        }
    }

    /// How many items are decided.
    pub fn decided(&self) -> usize {
        self.decided
    }

    /// Decide the items up to `end` (excluded), telling `widened` each widening as it is
    /// decided.
    pub fn decide_to(
        &mut self,
        end: usize,
        rng: &mut impl Rng,
        mut widened: impl FnMut(usize, &BTreeSet<ShardKey>),
    ) {
        let end = end.min(self.items.len());
        for i in self.decided..end {
            let home = self.homes.get(i).copied().flatten();
            let item = (i, &self.items[i], home);
            decide_into(
                &mut self.work,
                &mut self.open,
                item,
                self.pass,
                rng,
                &mut widened,
            );
        }
        self.decided = self.decided.max(end);
    }

    /// The items decided since the last step, with one write per shard they changed (with
    /// `propagate`, also every shard behind the pool's spec). A write carries its shard as
    /// every item decided so far leaves it, at the version read: a shard an earlier step wrote
    /// is written from the version that write made (the caller knows it).
    pub fn step(&mut self, propagate: bool) -> PoolBatch {
        let mut step = std::mem::take(&mut self.open);
        step.writes = self.work.cut_writes(propagate);
        step
    }
}

/// Where the steps of a batch of `items` end: a small first step, then each as large as all
/// before it, up to [`LARGEST_STEP`]. The last ends at `items`.
pub fn step_ends(items: usize) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut end = 0;
    while end < items {
        let size = end.clamp(FIRST_STEP, LARGEST_STEP);
        end = (end + size).min(items);
        ends.push(end);
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_grow_from_a_small_first_one_and_end_at_the_batch_end() {
        assert_eq!(step_ends(0), Vec::<usize>::new());
        assert_eq!(step_ends(100), vec![100]);
        assert_eq!(
            step_ends(15_000),
            vec![
                256, 512, 1024, 2048, 4096, 6144, 8192, 10240, 12288, 14336, 15000
            ]
        );
    }
}

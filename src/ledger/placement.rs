//! Which shards an owner's decision is made on, for one owner and for a whole batch (group
//! commit), against one read of the pool's shards. Pure.
//!
//! An owner is decided in its one known shard alone when it can be (its home shard, or the
//! shard its status names): that is the common case, and the write touches one small object.
//! Otherwise (no room there, a requested port in another window, entries in several shards)
//! it goes whole into the fullest shard that takes it (best fit, as for a block in a run:
//! emptier windows stay whole for larger owners), else into as few shards as it fits: its own
//! plus the 2, 4, 8, ... fullest, then the whole pool, whose refusal is then the answer; only
//! there can a block use a free run across a window edge. Static-band ports count against a
//! shard (KEP-3668). Best fit gathers the clients that leave their home onto one shard; that
//! happens only when homes are full, and what it buys is measured in `benches/placement.rs`. A decision that writes outside the owner's known shards
//! names the status widening that must be written first (the rule that makes a kill safe, see
//! `known`).
//!
//! A batch is decided item after item against the shards as the items before it left them, so
//! it equals running the items one after another, with one write per shard instead of one per
//! item. Its first pass decides only what stays within known shards; the rest (which needs
//! status writes before its shard writes) is decided by a second pass after the first pass is
//! committed, so that a widening that fails never leaves shard writes depending on it.

use std::collections::BTreeSet;

use rand::Rng;

use crate::core::{Band, Holdings};

use super::copy_record::{CopyRecord, ShardWrite, split_by_shard};
use super::decision::{Decision, Operation, decide};
use super::known::single_shard;
use super::refusal::Refusal;

/// One owner's part of a batch.
#[derive(Clone, Debug)]
pub struct BatchItem {
    pub uid: String,
    /// `namespace/name` of the PortAllocation: its home shard, and how entries name it.
    pub owner: String,
    /// What it asks for, or why its spec cannot be served at all.
    pub operation: Result<Operation, Refusal>,
    /// The shards where its entries may be (`known_shards` of its status).
    pub known: BTreeSet<u16>,
}

/// What the batch decided for one item.
#[derive(Clone, Debug, PartialEq)]
pub enum ItemOutcome {
    /// The shards already hold what the item asks for.
    Unchanged(Holdings),
    /// The item's entries change in the writes.
    Changed {
        holdings: Holdings,
        allocated: usize,
        released: usize,
    },
    /// A lasting refusal; the item keeps what it held (`holdings`).
    Refused {
        refusal: Refusal,
        holdings: Holdings,
    },
}

impl ItemOutcome {
    /// What the item holds once the writes are committed.
    pub fn holdings(&self) -> &Holdings {
        match self {
            ItemOutcome::Unchanged(holdings)
            | ItemOutcome::Changed { holdings, .. }
            | ItemOutcome::Refused { holdings, .. } => holdings,
        }
    }
}

/// Which items a pass decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Only items that stay within their known shards; the others are left (`None`).
    WithinKnown,
    /// Every item, wherever it fits.
    Anywhere,
}

/// The decision for a batch against one read of a pool's shards.
#[derive(Clone, Debug)]
pub struct PoolBatch {
    /// One per item, in order; `None`: left for the second pass.
    pub outcomes: Vec<Option<ItemOutcome>>,
    /// One per item: the shards its entries are in once the writes are committed (what its
    /// `status.shards` says afterwards).
    pub shards: Vec<BTreeSet<u16>>,
    /// Items whose `status.shards` must be widened to these shards before any write.
    pub widen: Vec<(usize, BTreeSet<u16>)>,
    /// One per changed shard, ascending by window.
    pub writes: Vec<ShardWrite>,
}

/// Decide `items` in order against `sharded`. With `propagate`, shards that carry an older
/// spec of the pool are written too, so a pool edit reaches them.
pub fn decide_pool_batch(
    sharded: &CopyRecord,
    items: &[BatchItem],
    pass: Pass,
    propagate: bool,
    rng: &mut impl Rng,
) -> PoolBatch {
    let mut work = sharded.clone();
    let mut batch = PoolBatch {
        outcomes: Vec::with_capacity(items.len()),
        shards: Vec::with_capacity(items.len()),
        widen: Vec::new(),
        writes: Vec::new(),
    };
    for (i, item) in items.iter().enumerate() {
        let decided = decide_item(&mut work, item, pass, rng);
        if let Some((_, Some(widened))) = &decided {
            batch.widen.push((i, widened.clone()));
        }
        batch
            .shards
            .push(work.shards_of(&item.uid).into_iter().collect());
        batch.outcomes.push(decided.map(|(outcome, _)| outcome));
    }
    batch.writes = work.writes(propagate);
    batch
}

/// One owner, decided wherever it fits (the whole-pool path of a single allocation).
pub fn place(sharded: &CopyRecord, item: &BatchItem, rng: &mut impl Rng) -> Placed {
    let batch = decide_pool_batch(
        sharded,
        std::slice::from_ref(item),
        Pass::Anywhere,
        false,
        rng,
    );
    let (outcome, shards) = (
        batch.outcomes.into_iter().next().flatten(),
        batch.shards.into_iter().next().unwrap_or_default(),
    );
    Placed {
        outcome: outcome.expect("the Anywhere pass decides every item"),
        shards,
        widen: batch.widen.into_iter().next().map(|(_, w)| w),
        writes: batch.writes,
    }
}

/// [`place`]'s answer.
#[derive(Clone, Debug)]
pub struct Placed {
    pub outcome: ItemOutcome,
    /// Where the owner's entries are once `writes` are committed.
    pub shards: BTreeSet<u16>,
    /// Its status must name these shards before the writes.
    pub widen: Option<BTreeSet<u16>>,
    pub writes: Vec<ShardWrite>,
}

/// One item against the shards as the items before it left them; `work` follows the decision.
/// `None` when `pass` leaves it. The second value: the widened known shards, when needed.
fn decide_item(
    work: &mut CopyRecord,
    item: &BatchItem,
    pass: Pass,
    rng: &mut impl Rng,
) -> Option<(ItemOutcome, Option<BTreeSet<u16>>)> {
    let (uid, owner) = (item.uid.as_str(), item.owner.as_str());
    let operation = match &item.operation {
        Ok(operation) => operation,
        Err(refusal) => {
            let holdings = work.holdings_of(uid);
            return Some((refused(refusal.clone(), holdings), None));
        }
    };
    let present: BTreeSet<u16> = work.shards_of(uid).into_iter().collect();
    let before = work.holdings_of(uid);
    if matches!(operation, Operation::Remove) {
        // Its object is gone: every entry goes, wherever it is (undecodable ones too).
        if present.is_empty() {
            return Some((ItemOutcome::Unchanged(before), None));
        }
        work.set(uid, owner, &Holdings::new());
        let released = before.len();
        let outcome = ItemOutcome::Changed {
            holdings: Holdings::new(),
            allocated: 0,
            released,
        };
        return Some((outcome, None));
    }
    // Alone in its one known shard.
    if let Some(home) = single_shard(&item.known, operation)
        && present.iter().all(|&k| k == home)
    {
        let decision = match work.shards.get(&home) {
            Some(shard) => decide(&shard.record, uid, owner, operation, rng),
            None => decide(&work.shard_record(home), uid, owner, operation, rng),
        };
        match decision {
            Err(Refusal::Core { .. }) => {}
            Err(refusal) => return Some((refused(refusal, before), None)),
            Ok(decision) => return Some((apply(work, uid, owner, decision), None)),
        }
    }
    if pass == Pass::WithinKnown {
        return None;
    }
    let decision = match elsewhere(work, &present, uid, owner, operation, rng) {
        Ok(decision) => decision,
        Err(refusal) => return Some((refused(refusal, before), None)),
    };
    let touched = touched_by(work, uid, decision.holdings());
    let outcome = apply(work, uid, owner, decision);
    let widened = (!touched.is_subset(&item.known)).then(|| {
        let mut all = item.known.clone();
        all.extend(touched);
        all.extend(present);
        all
    });
    Some((outcome, widened))
}

/// The decision for an owner its known shard cannot serve alone: whole in the best shard that
/// takes it (see [`best_window`]), else on as few shards as it fits. Each try is one decision in
/// memory; nothing is read again.
fn elsewhere(
    work: &CopyRecord,
    present: &BTreeSet<u16>,
    uid: &str,
    owner: &str,
    operation: &Operation,
    rng: &mut impl Rng,
) -> Result<Decision, Refusal> {
    let order = work.layout.home_order(owner);
    if present.len() <= 1 {
        let candidates: Vec<u16> = match present.first() {
            Some(&only) => vec![only],
            None => order.clone(),
        };
        if let Some(decision) = best_window(work, &candidates, uid, owner, operation, rng)? {
            return Ok(decision);
        }
    }
    // Spanning: the fullest windows first (dynamic before static), for the reason above.
    let mut order = order;
    order.sort_by_cached_key(|&index| {
        let free = work
            .shards
            .get(&index)
            .map(|shard| shard.record.state.free_count());
        let is_static = work.layout.get(index).is_some_and(|span| span.is_static());
        (is_static, free.unwrap_or(u32::MAX))
    });
    let mut take = 2;
    while take < order.len() {
        let windows: BTreeSet<u16> = present
            .iter()
            .chain(order.iter().take(take))
            .copied()
            .collect();
        match decide(&work.union_record_of(&windows), uid, owner, operation, rng) {
            Err(Refusal::Core { .. }) => take *= 2,
            other => return other,
        }
    }
    decide(&work.union_record(), uid, owner, operation, rng)
}

/// The best of the windows that take the owner whole: the fewest static-band ports (KEP-3668:
/// automatic ports use the static band only when the dynamic band cannot take them), then the
/// fullest window (best fit, as for a block within a window: emptier windows keep room for
/// larger owners). `None` when none takes it.
fn best_window(
    work: &CopyRecord,
    candidates: &[u16],
    uid: &str,
    owner: &str,
    operation: &Operation,
    rng: &mut impl Rng,
) -> Result<Option<Decision>, Refusal> {
    let mut best: Option<((usize, u32), Decision)> = None;
    for &index in candidates {
        let fresh;
        let record = match work.shards.get(&index) {
            Some(shard) => &shard.record,
            None => {
                fresh = work.shard_record(index);
                &fresh
            }
        };
        let decision = match decide(record, uid, owner, operation, rng) {
            Err(Refusal::Core { .. }) => continue,
            other => other?,
        };
        let state = &record.state;
        let statics = decision
            .holdings()
            .iter()
            .flat_map(|(_, block)| block.ports())
            .filter(|&port| state.band_of(port) == Some(Band::Static))
            .count();
        let key = (statics, state.free_count());
        if best.as_ref().is_none_or(|(best_key, _)| key < *best_key) {
            best = Some((key, decision));
        }
    }
    Ok(best.map(|(_, decision)| decision))
}

/// The shards whose part of `uid`'s holdings changes if its holdings become `after`.
fn touched_by(work: &CopyRecord, uid: &str, after: &Holdings) -> BTreeSet<u16> {
    let parts = split_by_shard(after);
    let mut touched: BTreeSet<u16> = BTreeSet::new();
    for (&index, part) in &parts {
        let now = work.shards.get(&index).map(|s| s.record.holdings_of(uid));
        if now.as_ref() != Some(part) {
            touched.insert(index);
        }
    }
    for index in work.shards_of(uid) {
        if !parts.contains_key(&index) {
            touched.insert(index);
        }
    }
    touched
}

fn apply(work: &mut CopyRecord, uid: &str, owner: &str, decision: Decision) -> ItemOutcome {
    match decision {
        Decision::Unchanged(holdings) => ItemOutcome::Unchanged(holdings),
        Decision::Write {
            holdings,
            allocated,
            released,
        } => {
            work.set(uid, owner, &holdings);
            ItemOutcome::Changed {
                holdings,
                allocated,
                released,
            }
        }
    }
}

fn refused(refusal: Refusal, holdings: Holdings) -> ItemOutcome {
    ItemOutcome::Refused { refusal, holdings }
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "placement_fill_tests.rs"]
mod fill_tests;

//! Which shards an owner's decision is made on, for one owner and for a whole batch (group
//! commit), against one read of the pool's shards. Pure.
//!
//! An owner is decided in its one known shard alone when it can be (its home shard, or the
//! shard its status names): that is the common case, and the write touches one small object.
//! Otherwise (no room there, a requested port in another window, entries in several shards)
//! it is decided over the windows of its copy (`window_choice`: best fit, then as few windows
//! as it fits). A decision that writes outside the owner's known shards names the status
//! widening that must be written first (the rule that makes a kill safe, see `known_shards`).
//!
//! In a pool with reuse (`nodeReuse: N` or `followNodes`, see `pool_record` and `node_bound`)
//! an owner is decided in the copy where it has entries; a new owner goes to the first copy
//! that takes it whole, in order, so copy 1 fills only once copy 0 cannot take a holder. A
//! workload no copy takes whole has its pods spread over the copies (`spread`).
//!
//! A batch is decided item after item against the shards as the items before it left them, so
//! it equals running the items one after another, with one write per shard instead of one per
//! item. Its first pass decides only what stays within known shards; the rest (which needs
//! status writes before its shard writes) is decided by a second pass after the first pass is
//! committed, so that a widening that fails never leaves shard writes depending on it.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;

use crate::core::{Holdings, SlotKey};

use super::home_fit::loose_in_window;
use super::spread;
use super::window_choice::elsewhere;
use crate::ledger::decision::{Decision, Operation, decide};
use crate::ledger::record::copy_record::CopyRecord;
use crate::ledger::record::holdings_across_shards::split_by_shard;
use crate::ledger::record::known_shards::single_shard;
use crate::ledger::record::pool_record::PoolRecord;
use crate::ledger::record::shard_record::ShardWrite;
use crate::ledger::record::window_record::WindowRecord;
use crate::ledger::record::windows::ShardKey;
use crate::ledger::refusal::Refusal;
use spread_choice::{decide_spread, may_spread};

/// One owner's part of a batch.
#[derive(Clone, Debug)]
pub struct BatchItem {
    pub uid: String,
    /// `namespace/name` of the PortAllocation: its home shard, and how entries name it.
    pub owner: String,
    /// What it asks for, or why its spec cannot be served at all.
    pub operation: Result<Operation, Refusal>,
    /// The shards where its entries may be (`known_shards` of its status).
    pub known: BTreeSet<ShardKey>,
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
#[derive(Clone, Debug, Default)]
pub struct PoolBatch {
    /// One per item, in order; `None`: left for the second pass.
    pub outcomes: Vec<Option<ItemOutcome>>,
    /// One per item: the shards its entries are in once the writes are committed (what its
    /// `status.shards` says afterwards).
    pub shards: Vec<BTreeSet<ShardKey>>,
    /// One per item: where its pods are spread over copies, the copy of each of its slots
    /// (what its status records), else empty.
    pub copies: Vec<BTreeMap<SlotKey, u16>>,
    /// Items whose `status.shards` must be widened to these shards before any write.
    pub widen: Vec<(usize, BTreeSet<ShardKey>)>,
    /// Items named instead in their home shard's `status.elsewhere` (see
    /// [`decide_pool_batch_telling`]): that shard must be written so before any other write.
    pub marked: Vec<(usize, ShardKey)>,
    /// One per changed shard, copy after copy, ascending by window.
    pub writes: Vec<ShardWrite>,
}

/// Decide `items` in order against `sharded`. With `propagate`, shards that carry an older
/// spec of the pool are written too, so a pool edit reaches them.
pub fn decide_pool_batch(
    sharded: &PoolRecord,
    items: &[BatchItem],
    pass: Pass,
    propagate: bool,
    rng: &mut impl Rng,
) -> PoolBatch {
    decide_pool_batch_telling(sharded, items, (pass, &[]), propagate, rng, |_, _| {})
}

/// [`decide_pool_batch`], telling `widened` each item's widening (its index, the shards) as
/// soon as it is decided, so that its status write can go while the rest are decided.
///
/// `homes[n]`, when given, is item `n`'s home shard, where it may be named
/// (`status.elsewhere`) instead of widened: a whole batch then needs one write per home shard
/// where it needed one status write per item. Only for an item known by its home alone (its
/// status names no shards), whose next sync reads that shard first.
pub fn decide_pool_batch_telling(
    sharded: &PoolRecord,
    items: &[BatchItem],
    (pass, homes): (Pass, &[Option<ShardKey>]),
    propagate: bool,
    rng: &mut impl Rng,
    mut widened: impl FnMut(usize, &BTreeSet<ShardKey>),
) -> PoolBatch {
    let mut work = sharded.clone();
    let mut batch = PoolBatch::default();
    for (i, item) in items.iter().enumerate() {
        let home = homes.get(i).copied().flatten();
        decide_into(
            &mut work,
            &mut batch,
            (i, item, home),
            pass,
            rng,
            &mut widened,
        );
    }
    batch.writes = work.writes(propagate);
    batch
}

/// One item decided against `work` (a batch's, or a step's in `batch_steps`), recorded in `batch`; `i` is its
/// index in the batch, `home` where it may be named instead of widened.
pub(super) fn decide_into(
    work: &mut PoolRecord,
    batch: &mut PoolBatch,
    (i, item, home): (usize, &BatchItem, Option<ShardKey>),
    pass: Pass,
    rng: &mut impl Rng,
    widened: &mut impl FnMut(usize, &BTreeSet<ShardKey>),
) {
    let decided = decide_item(work, item, pass, rng);
    if let Some((_, Some(shards))) = &decided {
        match home {
            Some(home) => {
                work.mark_elsewhere(home, &item.uid, &item.owner);
                batch.marked.push((i, home));
            }
            None => {
                widened(i, shards);
                batch.widen.push((i, shards.clone()));
            }
        }
    }
    batch.shards.push(work.shards_of(&item.uid));
    batch.copies.push(work.spread_copies(&item.uid));
    batch.outcomes.push(decided.map(|(outcome, _)| outcome));
}

/// One owner, decided wherever it fits (the whole-pool path of a single allocation).
pub fn place(sharded: &PoolRecord, item: &BatchItem, rng: &mut impl Rng) -> Placed {
    let batch = decide_pool_batch(
        sharded,
        std::slice::from_ref(item),
        Pass::Anywhere,
        false,
        rng,
    );
    let (outcome, shards, copies) = (
        batch.outcomes.into_iter().next().flatten(),
        batch.shards.into_iter().next().unwrap_or_default(),
        batch.copies.into_iter().next().unwrap_or_default(),
    );
    Placed {
        outcome: outcome.expect("the Anywhere pass decides every item"),
        shards,
        copies,
        widen: batch.widen.into_iter().next().map(|(_, w)| w),
        writes: batch.writes,
    }
}

/// [`place`]'s answer.
#[derive(Clone, Debug)]
pub struct Placed {
    pub outcome: ItemOutcome,
    /// Where the owner's entries are once `writes` are committed.
    pub shards: BTreeSet<ShardKey>,
    /// Where its pods are spread over copies, the copy of each slot (else empty).
    pub copies: BTreeMap<SlotKey, u16>,
    /// Its status must name these shards before the writes.
    pub widen: Option<BTreeSet<ShardKey>>,
    pub writes: Vec<ShardWrite>,
}

/// One owner against the shards as the items before it left them; `work` follows the decision.
/// `None` when `pass` leaves it. The second value: the widened known shards, when needed.
fn decide_item(
    work: &mut PoolRecord,
    item: &BatchItem,
    pass: Pass,
    rng: &mut impl Rng,
) -> Option<(ItemOutcome, Option<BTreeSet<ShardKey>>)> {
    let operation = match &item.operation {
        Ok(operation) => operation,
        Err(refusal) => {
            let holdings = work.holdings_of(&item.uid);
            return Some((refused(refusal.clone(), holdings), None));
        }
    };
    let seen = Seen::read(work, item, operation);
    if matches!(operation, Operation::Remove) {
        return Some((remove_everywhere(work, seen), None));
    }
    if seen.copies.len() > 1 && spread::is_spread(work, seen.uid) {
        return decide_spread(work, item, seen, pass, None, rng);
    }
    match decide_in_known_shard(work, item, &seen, rng) {
        Some(Ok(outcome)) => return Some((outcome, None)),
        Some(Err(refusal)) => return Some((refused(refusal, seen.before), None)),
        None => {}
    }
    if pass == Pass::WithinKnown {
        return None;
    }
    let (copy, decision) = match choose_copy(work, &seen, rng) {
        Ok(chosen) => chosen,
        Err(whole) if may_spread(work, &seen, &whole) => {
            return decide_spread(work, item, seen, pass, Some(whole), rng);
        }
        Err(refusal) => {
            let keep = seen.copies.first().copied().unwrap_or_default();
            return Some((refused_in(work, seen, keep, refusal), None));
        }
    };
    if let Some(refusal) = beyond_reuse(work, copy, &decision, seen.owner) {
        return Some((refused_in(work, seen, copy, refusal), None));
    }
    Some(apply_in_copy(work, item, seen, copy, decision))
}

/// Where an item's entries are before it is decided, read once: the decision paths below ask
/// the same of `work` and must see it as it was.
struct Seen<'a> {
    uid: &'a str,
    owner: &'a str,
    operation: &'a Operation,
    /// The shards holding its entries.
    present: BTreeSet<ShardKey>,
    /// The copies holding its entries.
    copies: BTreeSet<u16>,
    /// What it holds.
    before: Holdings,
    /// Another copy may take what this one refuses, while the owner holds nothing anywhere.
    movable: bool,
}

impl<'a> Seen<'a> {
    fn read(work: &PoolRecord, item: &'a BatchItem, operation: &'a Operation) -> Self {
        let copies = work.copies_of(&item.uid);
        Seen {
            uid: &item.uid,
            owner: &item.owner,
            operation,
            present: work.shards_of(&item.uid),
            movable: copies.is_empty() && work.may_reuse(),
            before: work.holdings_of(&item.uid),
            copies,
        }
    }
}

/// Its object is gone: every entry goes, wherever it is (undecodable ones too).
fn remove_everywhere(work: &mut PoolRecord, seen: Seen) -> ItemOutcome {
    if seen.present.is_empty() {
        return ItemOutcome::Unchanged(seen.before);
    }
    let released = drop_entries(work, seen.uid, seen.owner, &seen.copies);
    ItemOutcome::Changed {
        holdings: Holdings::new(),
        allocated: 0,
        released,
    }
}

/// The owner decided alone in its one known shard, the common case whose write touches one
/// small object. `None` when that shard cannot serve it (no room, a port held there by
/// someone else while another copy may take it, or no single known shard): it is decided
/// elsewhere. A refusal the other paths would give too is the answer.
fn decide_in_known_shard(
    work: &mut PoolRecord,
    item: &BatchItem,
    seen: &Seen,
    rng: &mut impl Rng,
) -> Option<Result<ItemOutcome, Refusal>> {
    let key = single_shard(&item.known, seen.operation)?;
    if !seen.present.iter().all(|&k| k == key) {
        return None;
    }
    let decision = {
        let fresh: WindowRecord;
        let record = match work.copy(key.copy).and_then(|c| c.shards.get(&key.window)) {
            Some(shard) => &shard.record,
            None => {
                fresh = work.copy_or_empty(key.copy).shard_record(key.window);
                &fresh
            }
        };
        let decision = decide(record, seen.uid, seen.owner, seen.operation, rng);
        // A block the window would put in a loose run: the whole copy may fit it tighter.
        if let Ok(decided) = &decision
            && !work.may_reuse()
            && loose_in_window(record, &seen.before, decided)
        {
            return None;
        }
        decision
    };
    match decision {
        Err(Refusal::Core { .. }) => None,
        Err(Refusal::PortHeld { .. }) if seen.movable => None,
        Err(refusal) => Some(Err(refusal)),
        Ok(decision) => Some(match beyond_reuse(work, key.copy, &decision, seen.owner) {
            Some(refusal) => Err(refusal),
            None => Ok(apply(
                work.copy_mut(key.copy),
                seen.uid,
                seen.owner,
                decision,
            )),
        }),
    }
}

/// The copy it is in, else every copy in order: the first that takes it whole, and the
/// decision there. A new owner refused by every copy is refused as such, with the lowest
/// copy's refusal. An owner a race left in several copies tries each of them in order, and
/// one refused by all of them gets the lowest one's refusal.
fn choose_copy(
    work: &mut PoolRecord,
    seen: &Seen,
    rng: &mut impl Rng,
) -> Result<(u16, Decision), Refusal> {
    let candidates: Vec<u16> = if seen.copies.is_empty() {
        work.copy_candidates(seen.operation.ports_per_pod())
            .collect()
    } else {
        seen.copies.iter().copied().collect()
    };
    let raced = seen.copies.len() > 1;
    // The copies it may use (a follow-nodes pool also tries the first it may not, to say why).
    let ports_per_pod = seen.operation.ports_per_pod();
    let tried = candidates
        .iter()
        .filter(|&&copy| work.copy_allowed(copy, ports_per_pod).is_ok())
        .count() as u16;
    let needed = seen.operation.ports_asked();
    // A new owner skips a copy with fewer free ports than it asks for: that copy would refuse
    // it, and learning how costs a record of the whole copy. Only the lowest copy's refusal is
    // ever shown, so only that one is worked out, and only if every copy refuses.
    let mut lowest_skipped: Option<u16> = None;
    let mut first_refusal: Option<(u16, Refusal)> = None;
    for copy in candidates {
        if seen.movable && work.copy(copy).is_some_and(|c| c.free_ports() < needed) {
            lowest_skipped.get_or_insert(copy);
            continue;
        }
        match decide_in_copy(work, seen, copy, rng) {
            Ok(decision) => return Ok((copy, decision)),
            Err(refusal @ (Refusal::Core { .. } | Refusal::PortHeld { .. }))
                if seen.movable || raced =>
            {
                first_refusal.get_or_insert((copy, refusal));
            }
            Err(refusal) => return Err(refusal),
        }
    }
    if raced && let Some((_, refusal)) = first_refusal {
        return Err(refusal);
    }
    let refusal = match first_refusal {
        Some((copy, refusal)) if lowest_skipped.is_none_or(|skipped| copy < skipped) => refusal,
        _ => {
            let skipped = lowest_skipped.expect("a refusal or a skipped copy for every copy");
            match decide_in_copy(work, seen, skipped, rng) {
                // Cannot happen while the count is right; if it does, the placement is sound.
                Ok(decision) => return Ok((skipped, decision)),
                Err(refusal) => refusal,
            }
        }
    };
    Err(refusal.in_every_copy(tried, &work.copy_bound()))
}

/// The owner decided in one copy, where its entries there are (see [`elsewhere`]).
fn decide_in_copy(
    work: &mut PoolRecord,
    seen: &Seen,
    copy: u16,
    rng: &mut impl Rng,
) -> Result<Decision, Refusal> {
    let windows: BTreeSet<u16> = seen
        .present
        .iter()
        .filter(|k| k.copy == copy)
        .map(|k| k.window)
        .collect();
    let record = work.copy_mut(copy);
    elsewhere(record, &windows, seen.uid, seen.owner, seen.operation, rng)
}

/// Applies the decision in `copy`, drops the owner's entries in any other copy, and names the
/// known shards to widen to when the writes reach beyond them.
fn apply_in_copy(
    work: &mut PoolRecord,
    item: &BatchItem,
    seen: Seen,
    copy: u16,
    decision: Decision,
) -> (ItemOutcome, Option<BTreeSet<ShardKey>>) {
    let (uid, owner) = (seen.uid, seen.owner);
    let mut touched: BTreeSet<ShardKey> = touched_by(&work.copies[&copy], uid, decision.holdings())
        .into_iter()
        .map(|window| ShardKey::new(copy, window))
        .collect();
    // Entries in another copy (two clients raced on one new object): they go.
    let strays: BTreeSet<u16> = seen.copies.iter().copied().filter(|&c| c != copy).collect();
    touched.extend(seen.present.iter().filter(|k| strays.contains(&k.copy)));
    let dropped = drop_entries(work, uid, owner, &strays);
    let outcome = match apply(work.copy_mut(copy), uid, owner, decision) {
        ItemOutcome::Unchanged(holdings) if dropped > 0 => ItemOutcome::Changed {
            holdings,
            allocated: 0,
            released: dropped,
        },
        ItemOutcome::Changed {
            holdings,
            allocated,
            released,
        } => ItemOutcome::Changed {
            holdings,
            allocated,
            released: released + dropped,
        },
        other => other,
    };
    let widened = (!touched.is_subset(&item.known)).then(|| {
        let mut all = item.known.clone();
        all.extend(touched);
        all.extend(seen.present);
        all
    });
    (outcome, widened)
}

/// Remove `uid`'s entries from the given copies; how many ports that frees.
fn drop_entries(work: &mut PoolRecord, uid: &str, owner: &str, copies: &BTreeSet<u16>) -> usize {
    let mut released = 0;
    for &copy in copies {
        let record = work.copy_mut(copy);
        released += record.holdings_of(uid).len();
        record.set(uid, owner, &Holdings::new());
    }
    released
}

/// A decision that takes new ports in a copy the pool does not allow its pods (past its
/// `nodeReuse`, lowered while the owner held ports there; or where following the nodes, its
/// pods could be kept off every node): refused, the owner keeps what it has.
fn beyond_reuse(work: &PoolRecord, copy: u16, decision: &Decision, owner: &str) -> Option<Refusal> {
    let allocates = matches!(decision, Decision::Write { allocated, .. } if *allocated > 0);
    if !allocates {
        return None;
    }
    let ports_per_pod = decision.holdings().ports_per_pod();
    let refused = work.copy_allowed(copy, ports_per_pod).err()?;
    Some(Refusal::of_copy(owner, work.name(), refused))
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

/// A refusal of an owner decided in `keep`. One that a race between two clients left in
/// several copies keeps only its entries in `keep`, where its next sync decides it: the others
/// go now, as a decision that succeeds drops them, or a workload its pool keeps refusing would
/// hold them for good. Its status then records what is left.
fn refused_in(work: &mut PoolRecord, seen: Seen, keep: u16, refusal: Refusal) -> ItemOutcome {
    let strays: BTreeSet<u16> = seen.copies.iter().copied().filter(|&c| c != keep).collect();
    if strays.is_empty() {
        return refused(refusal, seen.before);
    }
    drop_entries(work, seen.uid, seen.owner, &strays);
    refused(refusal, work.holdings_of(seen.uid))
}

fn refused(refusal: Refusal, holdings: Holdings) -> ItemOutcome {
    ItemOutcome::Refused { refusal, holdings }
}

#[path = "shard_choice_spread.rs"]
mod spread_choice;

#[cfg(test)]
#[path = "shard_choice_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "shard_choice_fill_tests.rs"]
mod fill_tests;

#[cfg(test)]
#[path = "shard_choice_reuse_tests.rs"]
mod reuse_tests;

#[cfg(test)]
#[path = "shard_choice_batch_tests.rs"]
mod batch_tests;

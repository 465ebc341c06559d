//! Where in one copy of a pool an owner goes, when its known shard cannot serve it alone.
//! Pure.
//!
//! Whole in the fullest window (or pair of neighbouring windows) that takes it: best fit, as
//! for a block in a run, so emptier windows stay whole for larger owners. An owner asking for
//! blocks is also tried on the whole copy as one record, whose best fit may cross any window
//! edge. Else on as few shards as it fits: its own plus the 2, 4, 8, ... fullest, then the
//! whole copy, whose refusal is then the answer. A block is thus refused only when no free run
//! of the copy holds it.
//! Among equally tight places, one nearer the end of the pool the owner goes toward
//! (`block_end`: long blocks high, the rest low). Static-band ports count against a window
//! (KEP-3668). What best fit buys is measured in
//! `benches/placement.rs`.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::BTreeSet;

use rand::Rng;

use crate::core::{Band, Holdings, Lean, desired_slots};

use super::block_end::{by_size, distance, end_of};
use super::free_runs::FreeRuns;
use crate::ledger::decision::{Decision, Operation, decide};
use crate::ledger::record::copy_record::CopyRecord;
use crate::ledger::record::window_record::WindowRecord;
use crate::ledger::refusal::Refusal;

/// The decision for an owner its known shard cannot serve alone: whole in the best window or
/// pair of neighbouring windows that takes it (see [`best_place`]), else on as few shards as it
/// fits. Each try is one decision in memory; nothing is read again.
pub(super) fn elsewhere(
    work: &CopyRecord,
    present: &BTreeSet<u16>,
    uid: &str,
    owner: &str,
    operation: &Operation,
    rng: &mut impl Rng,
) -> Result<Decision, Refusal> {
    // Every place tried decides the same slots: worked out once here, not once a place.
    let slots;
    let operation = match operation {
        Operation::Sync(demands) => {
            slots = Operation::Slots(desired_slots(demands));
            &slots
        }
        other => other,
    };
    let blocks = operation.asks_for_blocks();
    let order = work.layout.home_order(owner);
    // An owner with nothing in this copy that names no port of its own needs as many free
    // ports as it asks for: a record with fewer would refuse it for room, so none is built or
    // tried (in a filling pool, most windows; trying them was most of a batch's decision).
    let needs =
        (present.is_empty() && !operation.requests_ports()).then(|| operation.ports_asked());
    let roomy = |free: u32| needs.is_none_or(|needed| free >= needed);
    if present.len() <= 1 {
        let runs = OnceCell::new();
        let before = work.holdings_of(uid);
        let candidates: Vec<u16> = match present.first() {
            Some(&only) => vec![only],
            None => order.clone(),
        };
        let windows = candidates
            .iter()
            .filter(|&&index| roomy(work.window_free(index)))
            .map(|&index| match work.shards.get(&index) {
                Some(shard) => Cow::Borrowed(&shard.record),
                None => Cow::Owned(work.shard_record(index)),
            });
        // Two neighbouring windows as one record: the free ports at their shared edge are one
        // run, which a block longer than either side's part still fits. Ranked with the single
        // windows, so a pair wins only where it fits tighter.
        // Only a block can need the edge: a single port fits in one window or not at all, and
        // building a pair's record is the dear part of placing an owner in a full pool.
        let pairs = neighbours(work, present.first().copied())
            .filter(|_| blocks)
            .filter(|pair| roomy(pair.iter().map(|&index| work.window_free(index)).sum()))
            .map(|pair| Cow::Owned(work.pair_record(&pair)));
        // The whole copy as one record: its best fit may lie across a window edge that no
        // pair joins, or at the end of a run where a window's own best fit would cut it.
        // In a pool that sorts owners by block length, toward the end of their size.
        let end = by_size(&work.pool).then(|| end_of(operation));
        let whole = blocks.then(|| {
            let mut record = work.union_record();
            record.state = record.state.leaning(end.unwrap_or(Lean::Low));
            Cow::Owned(record)
        });
        let places = windows.chain(pairs).chain(whole);
        let fit = Fit {
            copy: work,
            runs: &runs,
            before: &before,
            end,
            fresh: needs.is_some() && before.is_empty(),
        };
        if let Some(decision) = best_place(places, &fit, uid, owner, operation, rng)? {
            return Ok(decision);
        }
    }
    // Spanning: the fullest windows first (dynamic before static), for the reason above. A
    // window with no free port adds nothing but the cost of joining its entries: only the
    // owner's own windows and those with room are joined, the whole copy last.
    let mut order = order;
    order.retain(|&index| work.window_free(index) > 0 && !present.contains(&index));
    order.sort_by_cached_key(|&index| {
        let free = work
            .shards
            .get(&index)
            .map(|shard| shard.record.state.free_count());
        let is_static = work.layout.get(index).is_some_and(|span| span.is_static());
        (is_static, free.unwrap_or(u32::MAX))
    });
    let mut take = 2;
    loop {
        let every = take >= order.len();
        let windows: BTreeSet<u16> = present
            .iter()
            .chain(order.iter().take(take))
            .copied()
            .collect();
        if roomy(windows.iter().map(|&index| work.window_free(index)).sum()) {
            match decide(&work.union_record_of(&windows), uid, owner, operation, rng) {
                Err(Refusal::Core { .. }) => {}
                other => return other,
            }
        }
        if every {
            break;
        }
        take *= 2;
    }
    // Refused by every window with room: the whole copy says why, naming its holders.
    decide(&work.union_record(), uid, owner, operation, rng)
}

/// Each pair of neighbouring windows of the layout (with `only` among them, when given).
fn neighbours(work: &CopyRecord, only: Option<u16>) -> impl Iterator<Item = BTreeSet<u16>> + '_ {
    let spans = work.layout.shards();
    spans
        .windows(2)
        .filter(|pair| pair[0].index + 1 == pair[1].index)
        .map(|pair| BTreeSet::from([pair[0].index, pair[1].index]))
        .filter(move |pair| only.is_none_or(|only| pair.contains(&only)))
}

/// How [`best_place`] ranks a place, smallest best: static-band ports, fit, distance from its
/// end of the pool, splits, free ports.
type PlaceKey = (usize, u32, u32, u32, u32);

/// What [`best_place`] ranks places by: the copy's free runs, what the owner holds, and the
/// end of the pool it is placed toward (`block_end`; `None`: no end preferred).
struct Fit<'a> {
    copy: &'a CopyRecord,
    /// The copy's free runs, worked out for the first place that takes the owner.
    runs: &'a OnceCell<FreeRuns>,
    before: &'a Holdings,
    end: Option<Lean>,
    /// The owner holds nothing in this copy and names no port: every port it is given is new
    /// and free, so a place whose free runs are all longer than the best fit so far cannot
    /// win, and is not decided (most windows of a filling copy, for each new owner).
    fresh: bool,
}

impl Fit<'_> {
    /// Whether `record` may rank before `best`: its fewest static-band ports and tightest fit
    /// (the shortest free run among its ports, see [`FreeRuns::shortest_within`]) do not
    /// already lose to `best`'s. Deciding those was a third of the envelope's pass 2
    /// (`benches/decision.rs`: 10.3 s, 7.2 s without).
    fn may_beat(&self, record: &WindowRecord, best: &PlaceKey) -> bool {
        let (true, Some(runs)) = (self.fresh, self.runs.get()) else {
            return true;
        };
        let ranges = record.ports.ranges();
        let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
            return true;
        };
        // No free port: the decision there would refuse for room, which ranks nothing.
        runs.shortest_within(first.first, last.last)
            .is_some_and(|tightest| (0, tightest) <= (best.0, best.1))
    }
}

/// The best of the records (a window, or windows joined) that take the owner whole: the
/// fewest static-band ports (KEP-3668: automatic ports use the static band only when the
/// dynamic band cannot take them), then the tightest fit across the whole copy (the shortest
/// free run its largest new block cuts, window edges ignored: runs too long for it stay whole
/// for larger owners), then nearest the end of the pool it goes toward (`block_end`), then
/// against an end of its run rather than inside it (a block with free ports on both sides cuts
/// one run into two), then the fullest record. Among equals the first, so candidates in the
/// owner's home order keep owners apart. `None` when none takes it.
fn best_place<'a>(
    records: impl Iterator<Item = Cow<'a, WindowRecord>>,
    fit: &Fit,
    uid: &str,
    owner: &str,
    operation: &Operation,
    rng: &mut impl Rng,
) -> Result<Option<Decision>, Refusal> {
    let mut best: Option<(PlaceKey, Decision)> = None;
    for record in records {
        if let Some((best_key, _)) = &best
            && !fit.may_beat(&record, best_key)
        {
            continue;
        }
        let decision = match decide(&record, uid, owner, operation, rng) {
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
        let after = decision.holdings();
        let runs = fit.runs.get_or_init(|| FreeRuns::of(fit.copy));
        let key = (
            statics,
            runs.fit(fit.before, after),
            fit.end.map_or(0, |end| distance(end, fit.before, after)),
            runs.splits(fit.before, after),
            state.free_count(),
        );
        if best.as_ref().is_none_or(|(best_key, _)| key < *best_key) {
            best = Some((key, decision));
        }
    }
    Ok(best.map(|(_, decision)| decision))
}

//! Where a pool puts the ports it chooses itself: packed or scattered placement.
//!
//! Packed placement, the default, is address-ordered best fit, the policy memory allocators
//! use to keep fragmentation low: a block (a single port is a block of one) goes into the
//! shortest free run that holds it, against one end of that run, so long runs stay whole for
//! long blocks and no new gap is cut. Every port of one allocation leans toward the same end,
//! so they lie together and leave one run behind when the allocation is deleted.
//!
//! Randomness is kept where it costs almost no room: the end is drawn per allocation, and the
//! allocation's first (largest) block picks between the first two places from that end. Two
//! clients reading the same packed pool choose differently about three times in four (a
//! uniformly random start did almost always, but cut the runs blocks need); as every write is
//! a compare-and-swap of the record, the loser of a race re-reads whichever ports it chose.
//!
//! A shard's window of a pool (`PoolState::leaning`) has no such choice: two clients writing
//! one shard conflict whatever ports they chose, so its end is fixed by the window (see the
//! ledger's `window_lean`), and the free ports of two neighbouring windows stay one run.
//!
//! Scattered placement is a uniformly random start anywhere in the band, as Kubernetes'
//! NodePort allocator does for single ports. It cuts every long run, and is kept only so
//! benchmarks can show both in one run.

use std::ops::Range;

use rand::Rng;
use rand::seq::IndexedRandom;

use super::bitmap::PortBitmap;
use super::range::PortSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Placement {
    /// Best fit against one end of the run.
    #[default]
    Packed,
    /// The first fit after a uniformly random start.
    Scattered,
}

/// The end of its free run a packed block is placed against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lean {
    Low,
    High,
}

/// Where a packed block aims: against which end of its run, and among how many places.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Aim {
    pub lean: Lean,
    pub among: usize,
}

impl Aim {
    /// The aim of an allocation's first block, or of a block taken on its own: a random end,
    /// and a choice of places.
    pub(super) fn first(rng: &mut impl Rng) -> Aim {
        let lean = if rng.random() { Lean::High } else { Lean::Low };
        Aim {
            lean,
            among: FIRST_CHOICES,
        }
    }

    /// The first aim in a state that always leans one way (a shard's window of a pool).
    pub(super) fn fixed(lean: Lean) -> Aim {
        Aim {
            lean,
            among: FIXED_CHOICES,
        }
    }

    /// The aim of the allocation's later blocks: the same end, the best place.
    pub(super) fn then(self) -> Aim {
        Aim { among: 1, ..self }
    }
}

/// How many places an allocation's first block chooses among. Each place past the first
/// leaves a gap (a multiple of the block) that later blocks must fill: at 2, all 1,000 seeds
/// of the benchmark's random mix stay above 90 % at refusal, before and after churn; at 4, one
/// fell to 86 %.
const FIRST_CHOICES: usize = 2;
const FIXED_CHOICES: usize = 1;

impl Placement {
    /// The first index of `count` free contiguous ports (inside one range of the pool, so no
    /// exclusion) within `within`, or `None` if no free run there is that long. Packed takes
    /// one of the places `aim` allows; scattered ignores it.
    pub(super) fn place(
        self,
        held: &PortBitmap,
        ports: &PortSet,
        within: Range<u32>,
        count: u32,
        aim: Aim,
        rng: &mut impl Rng,
    ) -> Option<u32> {
        let count = count.max(1);
        match self {
            Placement::Packed => best_fit(held, ports, within, count, aim)
                .choose(rng)
                .copied(),
            Placement::Scattered => scattered(held, ports, within, count, rng),
        }
    }
}

/// The first `aim.among` places for `count` ports: the shortest runs that hold them first
/// (in port order among equals), each tiled from its `aim.lean` end, so a place past the
/// first leaves whole blocks of `count` before it.
fn best_fit(
    held: &PortBitmap,
    ports: &PortSet,
    within: Range<u32>,
    count: u32,
    aim: Aim,
) -> Vec<u32> {
    let among = aim.among.max(1);
    let mut runs = Vec::new();
    let mut exact = 0;
    for run in free_runs(held, ports, within) {
        let len = run.len() as u32;
        if len >= count {
            exact += usize::from(len == count);
            runs.push(run);
            // Nothing fits better than a run of exactly `count`.
            if exact >= among {
                break;
            }
        }
    }
    runs.sort_by_key(|run| run.len());
    runs.iter()
        .flat_map(|run| {
            (0..run.len() as u32 / count).map(move |k| match aim.lean {
                Lean::Low => run.start + k * count,
                Lean::High => run.end - (k + 1) * count,
            })
        })
        .take(among)
        .collect()
}

/// The maximal free runs inside `within`, ascending, split at gaps between the pool's ranges.
fn free_runs<'a>(
    held: &'a PortBitmap,
    ports: &'a PortSet,
    within: Range<u32>,
) -> impl Iterator<Item = Range<u32>> + 'a {
    ports.index_spans().flat_map(move |span| {
        held.clear_runs(span.start.max(within.start), span.end.min(within.end))
    })
}

/// The first fitting place after a uniformly random start, wrapping within `within`. A
/// block's start is rounded down to a multiple of `count`, so blocks of one size in an empty
/// band tile it.
fn scattered(
    held: &PortBitmap,
    ports: &PortSet,
    within: Range<u32>,
    count: u32,
    rng: &mut impl Rng,
) -> Option<u32> {
    if within.end.saturating_sub(within.start) < count {
        return None;
    }
    if count == 1 {
        let start = rng.random_range(within.clone());
        return held.first_clear_wrapping(start, within.start, within.end);
    }
    let offset = rng.random_range(0..within.end - within.start);
    let start = within.start + offset / count * count;
    let first_run = |starts: Range<u32>| {
        ports.index_spans().find_map(|span| {
            let from = span.start.max(starts.start);
            let to = span.end.min(within.end);
            if from >= starts.end || from >= to {
                return None;
            }
            held.find_clear_run(from, to, count)
                .filter(|&start| start < starts.end)
        })
    };
    first_run(start..within.end).or_else(|| first_run(within.start..start))
}

#[cfg(test)]
#[path = "placement_policy_tests.rs"]
mod tests;

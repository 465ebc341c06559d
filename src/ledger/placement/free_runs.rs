//! The free runs of one copy of a pool as if it were one record: the windows' free ports joined
//! across window edges (a run stops only at a held port or a gap in the pool's ranges). Pure.
//!
//! A window's own record cannot see that the free ports at its edge continue into its
//! neighbour's, so what looks like a small leftover there may be the one run a long block could
//! still use. Placement ranks the places an owner could go (a window, a pair of windows) by the
//! run its largest new block would cut, measured here: best fit across the whole copy.

use std::collections::BTreeMap;

use crate::core::{Holdings, PoolState};

use crate::ledger::record::copy_record::CopyRecord;
use crate::ledger::record::windows::WINDOW_PORTS;

/// Free runs, ascending, as (first port, length).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FreeRuns {
    runs: Vec<(u16, u32)>,
}

impl FreeRuns {
    /// The free runs of `copy`: a port is free when it is a pool port that its window's shard
    /// does not hold (a window without a shard is all free). Worked out once for each owner
    /// placed in a copy, so a window with no shard or no free port counts as one step, not
    /// port by port.
    pub fn of(copy: &CopyRecord) -> FreeRuns {
        let mut runs = Vec::new();
        for range in copy.ports.ranges() {
            let mut open: Option<(u16, u32)> = None;
            let mut port = u32::from(range.first);
            let last = u32::from(range.last);
            while port <= last {
                let window = (port / WINDOW_PORTS) as u16;
                // This window's part of the range.
                let end = last.min((u32::from(window) + 1) * WINDOW_PORTS - 1);
                let state = copy.shards.get(&window).map(|shard| &shard.record.state);
                match state {
                    None => match open.as_mut() {
                        Some((_, len)) => *len += end - port + 1,
                        None => open = Some((port as u16, end - port + 1)),
                    },
                    // Every port of the part is one this shard records, and it holds them all.
                    Some(state) if state.free_count() == 0 && covers(state, port, end) => {
                        runs.extend(open.take())
                    }
                    Some(state) => {
                        for p in port..=end {
                            let p = p as u16;
                            match (state.is_held(p), open.as_mut()) {
                                (false, Some((_, len))) => *len += 1,
                                (false, None) => open = Some((p, 1)),
                                (true, Some(_)) => runs.extend(open.take()),
                                (true, None) => {}
                            }
                        }
                    }
                }
                port = end + 1;
            }
            runs.extend(open);
        }
        FreeRuns { runs }
    }

    /// The length of the free run that contains `port`; 0 when the port is not free.
    pub fn around(&self, port: u16) -> u32 {
        let after = self.runs.partition_point(|&(first, _)| first <= port);
        match after.checked_sub(1).map(|i| self.runs[i]) {
            Some((first, len)) if u32::from(port) < u32::from(first) + len => len,
            _ => 0,
        }
    }

    /// The shortest free run with a port in `first..=last`; `None` when no port there is
    /// free. Every new port placed there lies in one of these runs, so no placement there fits
    /// tighter than this ([`FreeRuns::fit`] of a new owner is at least it).
    pub fn shortest_within(&self, first: u16, last: u16) -> Option<u32> {
        // Runs are ascending and disjoint: those ending before `first` come first.
        let start = self
            .runs
            .partition_point(|&(run_first, len)| u32::from(run_first) + len <= u32::from(first));
        self.runs[start..]
            .iter()
            .take_while(|&&(run_first, _)| run_first <= last)
            .map(|&(_, len)| len)
            .min()
    }

    /// How many of the new blocks in `after` (slots `before` did not hold as they are) lie
    /// inside a free run with free ports on both sides: each cuts one run into two.
    pub fn splits(&self, before: &Holdings, after: &Holdings) -> u32 {
        let free = |port: u32| u16::try_from(port).is_ok_and(|p| self.around(p) > 0);
        after
            .iter()
            .filter(|(slot, block)| before.block(slot) != Some(*block))
            .filter(|(_, block)| {
                let (first, last) = (u32::from(block.first), u32::from(block.last()));
                first > 0 && free(first - 1) && free(last + 1)
            })
            .count() as u32
    }

    /// How well `after` fits, as the owner now holding `before` would be placed: the length of
    /// the run its largest new block (a slot it did not hold as it is) lies in, longest first
    /// among equals; 0 when nothing is new. Smaller is a tighter fit.
    pub fn fit(&self, before: &Holdings, after: &Holdings) -> u32 {
        let mut largest: BTreeMap<u16, u32> = BTreeMap::new();
        for (slot, block) in after.iter() {
            if before.block(slot) != Some(block) {
                let run = self.around(block.first);
                largest
                    .entry(block.count)
                    .and_modify(|r| *r = (*r).max(run))
                    .or_insert(run);
            }
        }
        largest.last_key_value().map_or(0, |(_, &run)| run)
    }
}

/// Whether `state` records every port of `first..=last` (a shard written under an older spec
/// of the pool may not).
fn covers(state: &PoolState, first: u32, last: u32) -> bool {
    state
        .ports()
        .ranges()
        .iter()
        .any(|range| u32::from(range.first) <= first && last <= u32::from(range.last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fixtures::{holders, pool_of, shard_of, sharded};

    /// Windows 117 (30000-30207) and 118 (30208-30463), 30300 excluded; 30000-30099 and
    /// 30250 held.
    fn two_windows_with_a_gap() -> FreeRuns {
        let pool = pool_of(&["30000-30463"], &["30300"]);
        let record = sharded(
            &pool,
            vec![
                shard_of(&pool, 117, holders(&[("a", "r.p=30000-30099")])),
                shard_of(&pool, 118, holders(&[("b", "r.p=30250")])),
            ],
        );
        FreeRuns::of(record.first())
    }

    #[test]
    fn runs_join_across_window_edges_and_stop_at_gaps_and_held_ports() {
        let runs = two_windows_with_a_gap();
        // 30100-30249 crosses the edge at 30207/30208.
        assert_eq!(runs.around(30100), 150);
        assert_eq!(runs.around(30207), 150);
        assert_eq!(runs.around(30208), 150);
        assert_eq!(runs.around(30250), 0, "held");
        assert_eq!(runs.around(30251), 49, "30251-30299: the exclusion ends it");
        assert_eq!(runs.around(30301), 163);
        assert_eq!(runs.around(29999), 0, "not a pool port");
    }

    #[test]
    fn the_shortest_run_within_a_span_counts_runs_that_cross_its_edges() {
        // Runs: 30100-30249 (150), 30251-30299 (49), 30301-30463 (163).
        let runs = two_windows_with_a_gap();
        assert_eq!(runs.shortest_within(30000, 30099), None, "all held");
        assert_eq!(runs.shortest_within(30000, 30100), Some(150));
        assert_eq!(runs.shortest_within(30240, 30260), Some(49));
        assert_eq!(runs.shortest_within(30299, 30301), Some(49));
        assert_eq!(runs.shortest_within(30400, 30463), Some(163));
        assert_eq!(runs.shortest_within(30300, 30300), None, "not a pool port");
    }

    #[test]
    fn the_fit_is_the_run_of_the_largest_new_block() {
        let pool = pool_of(&["30000-30463"], &[]);
        let record = sharded(
            &pool,
            vec![shard_of(&pool, 117, holders(&[("a", "r.p=30100-30109")]))],
        );
        let runs = FreeRuns::of(record.first());
        let before = Holdings::decode("r.keep=30000-30063").unwrap();
        let after = Holdings::decode("r.keep=30000-30063 r.s=30099 r.b=30110-30117").unwrap();
        // The block of 8 is the largest new one: it lies in 30110-30463.
        assert_eq!(runs.fit(&before, &after), 354);
        assert_eq!(runs.fit(&after, &after), 0);
    }

    #[test]
    fn a_block_with_free_ports_on_both_sides_splits_its_run() {
        let pool = pool_of(&["30000-30463"], &[]);
        let record = sharded(
            &pool,
            vec![shard_of(&pool, 117, holders(&[("a", "r.p=30100-30109")]))],
        );
        let runs = FreeRuns::of(record.first());
        let none = Holdings::new();
        let at_end = Holdings::decode("r.b=30110-30117").unwrap();
        let inside = Holdings::decode("r.b=30120-30127").unwrap();
        let at_pool_start = Holdings::decode("r.b=30000-30007").unwrap();
        let at_pool_end = Holdings::decode("r.b=30456-30463").unwrap();
        assert_eq!(runs.splits(&none, &at_end), 0, "against the held block");
        assert_eq!(runs.splits(&none, &inside), 1);
        assert_eq!(runs.splits(&none, &at_pool_start), 0);
        assert_eq!(runs.splits(&none, &at_pool_end), 0);
        assert_eq!(runs.splits(&inside, &inside), 0, "nothing new");
    }
}

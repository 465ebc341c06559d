//! Whether an owner's one known window is a tight enough place for the blocks it asks for, so
//! that the window may decide it alone. Pure, and decided from that window only, so the
//! Kubernetes layer's one-shard path and the ledger's batches agree without reading more.
//!
//! Deciding in the known window is cheap (one shard read, one write, no status write first)
//! and keeps concurrent owners apart, but the window does not see the rest of the pool: a
//! block put into a long free run cuts what a longer block needed, while a run elsewhere may
//! have held it exactly. Blocks of 16-256 ports decided that way filled a 4,096-port pool only
//! to three quarters, in some seeds, before a long block found no run. So a new block of
//! [`LOOSE_FROM`] ports or more is placed in the known window alone only when it fills the free
//! run it lands in (as the window sees it) but for fewer than [`SLACK`] ports, and takes no
//! static-band port (a window whose dynamic part is full falls back to its static ports, while
//! the pool's dynamic band may still hold the block: KEP-3668); otherwise the
//! whole copy decides, best fit across windows (`window_choice`). Single ports and small
//! blocks fit any gap, and stay home.

use crate::core::{Band, Holdings, PoolState};

use super::block_end::{by_size, has_long_new_block};
use crate::ledger::decision::Decision;
use crate::ledger::record::window_record::WindowRecord;

/// Blocks this long or longer are placed by fit; shorter ones stay in the known window.
pub const LOOSE_FROM: u32 = 16;

/// A known window keeps a block when the free run it lands in is shorter than the block plus
/// this many ports.
pub const SLACK: u32 = 16;

/// Whether `decision`, made in `record` (one window, as read), puts a new block of
/// [`LOOSE_FROM`] ports or more where the whole copy may place it better: into a free run at
/// least [`SLACK`] ports longer than the block, or into static-band ports (the pool's dynamic
/// band, which the window cannot see, may hold it). `before`: what the owner holds there now.
pub fn loose_in_window(record: &WindowRecord, before: &Holdings, decision: &Decision) -> bool {
    let Decision::Write { holdings, .. } = decision else {
        return false;
    };
    if has_long_new_block(before, holdings) && by_size(&record.pool) {
        return true;
    }
    let state = &record.state;
    holdings
        .iter()
        .filter(|&(slot, block)| before.block(slot) != Some(block))
        .filter(|(_, block)| u32::from(block.count) >= LOOSE_FROM)
        .any(|(_, block)| {
            let run = run_around(state, before, block.first);
            run >= u32::from(block.count) + SLACK
                || block
                    .ports()
                    .any(|p| state.band_of(p) == Some(Band::Static))
        })
}

/// The length of the run of ports free in `state` (or held by the owner itself, which it may
/// give up for the new block) that contains `port`, within the record's ports.
fn run_around(state: &PoolState, before: &Holdings, port: u16) -> u32 {
    let own: std::collections::BTreeSet<u16> = before.ports().collect();
    let free = |p: u16| state.contains(p) && (!state.is_held(p) || own.contains(&p));
    if !free(port) {
        return 0;
    }
    let mut len = 1;
    let mut p = port;
    while p > 1 && free(p - 1) {
        p -= 1;
        len += 1;
    }
    let mut p = port;
    while p < u16::MAX && free(p + 1) {
        p += 1;
        len += 1;
    }
    len
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::api::StaticBandSetting;
    use crate::ledger::decision::decide;
    use crate::ledger::fixtures::{blocks, holders, pool_of, shard_of, sharded, whole_record};

    /// Whether owner `new` asking for `counts` is loose in window 118 (30208-30463) holding
    /// `held`.
    fn loose(held: &[(&str, &str)], counts: &[u32]) -> bool {
        let record = whole_record(&pool_of(&["30208-30463"], &[]), holders(held));
        let before = record.holdings_of("new");
        let operation = blocks(counts);
        let mut rng = StdRng::seed_from_u64(1);
        let decision = decide(&record, "new", "ns/new", &operation, &mut rng).unwrap();
        loose_in_window(&record, &before, &decision)
    }

    #[test]
    fn a_block_in_a_run_longer_than_it_by_the_slack_is_loose() {
        // An empty window: a run of 256.
        assert!(loose(&[], &[16]));
        assert!(loose(&[], &[256 - SLACK]));
        assert!(
            !loose(&[], &[256 - SLACK + 1]),
            "fills the run but for < SLACK"
        );
        assert!(!loose(&[], &[256]));
        // 30208-30447 held: the run left is 16 ports, which a block of 16 fills exactly.
        let full = [("a", "r.p=30208-30447")];
        assert!(!loose(&full, &[16]));
        // 30208-30399 held: a run of 64, loose for 16, tight for 64 and for 64 - SLACK + 1.
        let most = [("a", "r.p=30208-30399")];
        assert!(loose(&most, &[16]));
        assert!(!loose(&most, &[64]));
        assert!(!loose(&most, &[64 - SLACK + 1]));
    }

    /// Whether owner `new` asking for `counts` is loose in window 117 (30000-30207) of a pool
    /// over `ranges` holding `held` there: the window's own record, as the one-shard path reads
    /// it.
    fn loose_in_117(
        ranges: &[&str],
        auto_band: bool,
        held: &[(&str, &str)],
        counts: &[u32],
    ) -> bool {
        let mut pool = pool_of(ranges, &[]);
        if auto_band {
            pool.spec.static_band = StaticBandSetting::Auto;
        }
        let sharded = sharded(&pool, vec![shard_of(&pool, 117, holders(held))]);
        let record = sharded.first().shard_record(117);
        let before = record.holdings_of("new");
        let mut rng = StdRng::seed_from_u64(1);
        let decision = decide(&record, "new", "ns/new", &blocks(counts), &mut rng).unwrap();
        loose_in_window(&record, &before, &decision)
    }

    #[test]
    fn a_block_in_static_band_ports_is_loose() {
        // 30000-34095 with the KEP-3668 band: 30000-30127 static, in window 117 (30000-30207).
        // Its dynamic part full, a block of 120 fits the static run of 128 within the slack;
        // the pool's dynamic band, which this window cannot see, may take it.
        let dynamic_full = [("a", "r.p=30128-30207")];
        assert!(loose_in_117(&["30000-34095"], true, &dynamic_full, &[120]));
        // The same window without a band: a tight run, kept.
        assert!(!loose_in_117(
            &["30000-30207"],
            false,
            &dynamic_full,
            &[120]
        ));
    }

    #[test]
    fn single_ports_and_short_blocks_are_never_loose() {
        assert!(!loose(&[], &[1]));
        assert!(!loose(&[], &[1, 1, 1]));
        assert!(!loose(&[], &[LOOSE_FROM - 1]));
        // One loose block among others makes the decision loose.
        assert!(loose(&[], &[1, 8, LOOSE_FROM]));
    }

    #[test]
    fn what_the_owner_already_holds_is_not_a_new_block() {
        let record = whole_record(
            &pool_of(&["30208-30463"], &[]),
            holders(&[("new", "r.p0=30208-30223")]),
        );
        let before = record.holdings_of("new");
        let mut rng = StdRng::seed_from_u64(1);
        let same = decide(&record, "new", "ns/new", &blocks(&[16]), &mut rng).unwrap();
        assert!(matches!(same, Decision::Unchanged(_)));
        assert!(!loose_in_window(&record, &before, &same));
        // Growing it to 32 from a run of 256 (its own 16 count as free for the new block).
        let grown = decide(&record, "new", "ns/new", &blocks(&[32]), &mut rng).unwrap();
        assert!(loose_in_window(&record, &before, &grown));
    }
}

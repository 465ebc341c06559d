//! Which end of a pool an owner is placed toward, by its largest new block. Pure.
//!
//! Holders never move (their ports are bound), so what churn leaves free is the holes of the
//! owners deleted. Where long and short blocks lie mixed, the hole a long block leaves is cut
//! by short ones before the next long block comes, and a pool at three quarters refuses a
//! long block while only short runs are left. So in a pool of several windows, an owner whose
//! largest new block has [`LONG_FROM`] ports or more is placed toward the pool's high end, and
//! every other owner toward its low end: long blocks lie among long blocks, and the holes they
//! leave stay long or join into longer ones. Best fit still comes first: the end only ranks
//! places whose runs are equally tight. Measured in `benches/placement.rs`.
//!
//! Pools of one window, and pools with reuse (`nodeReuse`, `followNodes`), place as before:
//! [`by_size`] says whether a copy sorts blocks so.

use crate::core::{Holdings, Lean, PortBlock};

use crate::ledger::decision::Operation;
use crate::ledger::record::pool_snapshot::PoolSnapshot;

/// Blocks this long or longer are placed toward the pool's high end.
pub const LONG_FROM: u32 = 128;

/// Whether `pool` sorts its owners by block length: several windows, no reuse.
pub fn by_size(pool: &PoolSnapshot) -> bool {
    !pool.spec.may_reuse() && pool.layout().is_ok_and(|layout| layout.shards().len() > 1)
}

/// The end an owner asking for `operation` is placed toward: high when it asks for a block of
/// [`LONG_FROM`] ports or more.
pub fn end_of(operation: &Operation) -> Lean {
    let longest = match operation {
        Operation::Sync(demands) => demands.iter().map(|d| d.count).max(),
        Operation::Slots(slots) => slots.values().map(|want| want.count).max(),
        Operation::Release { .. } | Operation::Remove => None,
    };
    if longest.unwrap_or(0) >= LONG_FROM {
        Lean::High
    } else {
        Lean::Low
    }
}

/// How far the largest new block of `after` (a slot `before` did not hold as it is) lies from
/// the `end` its owner is placed toward, in ports: smaller is nearer. 0 when nothing is new.
pub fn distance(end: Lean, before: &Holdings, after: &Holdings) -> u32 {
    let largest = after
        .iter()
        .filter(|(slot, block)| before.block(slot) != Some(*block))
        .map(|(_, block)| block)
        .max_by_key(|block| (block.count, std::cmp::Reverse(block.first)));
    largest.map_or(0, |block: PortBlock| match end {
        Lean::Low => u32::from(block.first),
        Lean::High => u32::from(u16::MAX - block.last()),
    })
}

/// Whether a new block in `after` is long: placed toward the high end, which a window alone
/// cannot see, so the whole copy decides it.
pub fn has_long_new_block(before: &Holdings, after: &Holdings) -> bool {
    after
        .iter()
        .filter(|(slot, block)| before.block(slot) != Some(*block))
        .any(|(_, block)| u32::from(block.count) >= LONG_FROM)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fixtures::blocks as sync;

    #[test]
    fn an_owner_with_a_long_block_goes_high_and_any_other_low() {
        assert_eq!(end_of(&sync(&[1, 1, LONG_FROM])), Lean::High);
        assert_eq!(end_of(&sync(&[256])), Lean::High);
        assert_eq!(end_of(&sync(&[LONG_FROM - 1, 64, 1])), Lean::Low);
        assert_eq!(end_of(&sync(&[1])), Lean::Low);
        assert_eq!(end_of(&Operation::Remove), Lean::Low);
    }

    #[test]
    fn the_distance_is_the_largest_new_blocks_from_its_end() {
        let before = Holdings::decode("r.old=30000-30299").unwrap();
        let after = Holdings::decode("r.old=30000-30299 r.s=30400 r.b=30500-30515").unwrap();
        // The block of 16 is the largest new one (the 300 it held are not new).
        assert_eq!(distance(Lean::Low, &before, &after), 30500);
        assert_eq!(distance(Lean::High, &before, &after), 65535 - 30515);
        assert_eq!(distance(Lean::Low, &after, &after), 0, "nothing new");
        assert!(!has_long_new_block(&before, &after));
        let grown = Holdings::decode("r.old=30000-30299 r.b=30500-30627").unwrap();
        assert!(has_long_new_block(&before, &grown));
        assert!(!has_long_new_block(&grown, &grown));
    }
}

//! Dry runs: what an operation would do to a pool, decided exactly as the real one decides it
//! ([`place`]) but against a copy of the record that nothing writes back. Items of one run are
//! previewed in order against the same copy, so two new objects of one manifest never appear to
//! take the same port.

use rand::Rng;

use crate::core::{Holdings, PortBlock, SlotKey};

use super::placement::shard_choice::{BatchItem, ItemOutcome, place};
use super::record::pool_record::PoolRecord;
use super::record::shard_record::{ShardWrite, new_shard};

/// The ports one item would take, keep and free.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PortChanges {
    pub take: Vec<(SlotKey, PortBlock)>,
    pub keep: Vec<(SlotKey, PortBlock)>,
    pub free: Vec<(SlotKey, PortBlock)>,
}

impl PortChanges {
    /// From what an owner holds now to what it would hold. A slot whose port would change (a
    /// block that grew) frees the old port and takes the new one.
    pub fn between(before: &Holdings, after: &Holdings) -> PortChanges {
        let mut changes = PortChanges::default();
        for (slot, block) in after.iter() {
            match before.block(slot) {
                Some(held) if held == block => changes.keep.push((slot.clone(), block)),
                _ => changes.take.push((slot.clone(), block)),
            }
        }
        for (slot, block) in before.iter() {
            if after.block(slot) != Some(block) {
                changes.free.push((slot.clone(), block));
            }
        }
        changes
    }

    /// Whether anything would be taken or freed.
    pub fn is_change(&self) -> bool {
        !self.take.is_empty() || !self.free.is_empty()
    }

    /// Ports (not slots) in each list: a block counts all of its ports.
    pub fn port_counts(&self) -> (u32, u32, u32) {
        let count =
            |list: &[(SlotKey, PortBlock)]| list.iter().map(|(_, b)| u32::from(b.count)).sum();
        (count(&self.take), count(&self.keep), count(&self.free))
    }
}

/// One item's preview.
#[derive(Clone, Debug)]
pub struct Previewed {
    /// What it holds now.
    pub before: Holdings,
    pub outcome: ItemOutcome,
    /// The shard writes the real operation would send (for a server-side dry run).
    pub writes: Vec<ShardWrite>,
}

impl Previewed {
    pub fn changes(&self) -> PortChanges {
        PortChanges::between(&self.before, self.outcome.holdings())
    }
}

/// Decide `item` against `record` and apply the writes to the copy, so the next item sees them.
pub fn preview(record: &mut PoolRecord, item: &BatchItem, rng: &mut impl Rng) -> Previewed {
    let before = record.holdings_of(&item.uid);
    let placed = place(record, item, rng);
    for write in &placed.writes {
        let mut shard = new_shard(&record.pool, write.key);
        shard.status = Some(write.status.clone());
        record.replace(shard);
    }
    Previewed {
        before,
        outcome: placed.outcome,
        writes: placed.writes,
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::ledger::fixtures::{allocation, holders, pool_of, shard_of, sharded};
    use crate::ledger::{Operation, ShardKey, home_shard, owner_of};

    fn item(record: &PoolRecord, pa: &crate::api::PortAllocation) -> BatchItem {
        let owner = owner_of(pa);
        BatchItem {
            uid: pa.metadata.uid.clone().unwrap(),
            known: home_shard(&record.layout, &owner)
                .map(ShardKey::first)
                .into_iter()
                .collect(),
            owner,
            operation: Operation::sync_of(pa),
        }
    }

    #[test]
    fn two_new_objects_of_one_run_never_share_a_port() {
        let pool = pool_of(&["100-103"], &[]);
        let mut record = sharded(
            &pool,
            vec![shard_of(&pool, 0, holders(&[("old", "web.http=100")]))],
        );
        let mut rng = StdRng::seed_from_u64(7);
        let a = {
            let item = item(&record, &allocation("a", 2, None));
            preview(&mut record, &item, &mut rng)
        };
        let b = {
            let item = item(&record, &allocation("b", 1, None));
            preview(&mut record, &item, &mut rng)
        };
        let taken: Vec<u16> = [&a, &b]
            .iter()
            .flat_map(|p| p.changes().take.into_iter().map(|(_, block)| block.first))
            .collect();
        assert_eq!(taken.len(), 3);
        let mut unique = taken.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 3, "{taken:?}");
        assert!(
            !taken.contains(&100),
            "the held port is never previewed as taken"
        );
        // The pool now has no room left in the copy: a third object is refused there.
        let c = {
            let item = item(&record, &allocation("c", 1, None));
            preview(&mut record, &item, &mut rng)
        };
        assert!(
            matches!(c.outcome, ItemOutcome::Refused { .. }),
            "{:?}",
            c.outcome
        );
        assert!(!c.changes().is_change());
    }

    #[test]
    fn scale_down_frees_and_keeps_the_rest() {
        let pool = pool_of(&["100-109"], &[]);
        let held = "web.http=100,101,102";
        let mut record = sharded(&pool, vec![shard_of(&pool, 0, holders(&[("a", held)]))]);
        let pa = allocation("a", 1, None);
        let mut rng = StdRng::seed_from_u64(1);
        let previewed = {
            let item = item(&record, &pa);
            preview(&mut record, &item, &mut rng)
        };
        let changes = previewed.changes();
        assert_eq!(changes.port_counts(), (0, 1, 2));
        assert_eq!(changes.keep[0].1.first, 100);
        assert!(changes.is_change());
        assert_eq!(previewed.writes.len(), 1);
        // A second preview of the same spec against the updated copy changes nothing.
        let again = {
            let item = item(&record, &pa);
            preview(&mut record, &item, &mut rng)
        };
        assert!(!again.changes().is_change());
        assert!(again.writes.is_empty());
    }

    #[test]
    fn a_grown_block_frees_the_old_and_takes_the_new() {
        let before = Holdings::decode("r.w=100-103").unwrap();
        let after = Holdings::decode("r.w=200-207").unwrap();
        let changes = PortChanges::between(&before, &after);
        assert_eq!(changes.port_counts(), (8, 0, 4));
    }
}

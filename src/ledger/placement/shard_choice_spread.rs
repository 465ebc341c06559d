//! The pod-by-pod path of `shard_choice`: a workload no copy of a pool with reuse takes whole
//! has its pods spread over the copies (`spread`), and a workload spread so is decided that
//! way from then on.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;

use super::{BatchItem, ItemOutcome, Pass, Seen, refused, remove_everywhere, touched_by};
use crate::core::{Holdings, SlotKey, Want, desired_slots, plan_slots};
use crate::ledger::decision::Operation;
use crate::ledger::placement::spread;
use crate::ledger::record::holdings_across_shards::split_by_shard;
use crate::ledger::record::pool_record::PoolRecord;
use crate::ledger::record::windows::ShardKey;
use crate::ledger::refusal::Refusal;

/// Whether a workload no copy takes whole may have its pods spread over the copies: a pool
/// with reuse, a sync, a refusal for room or a held port, and entries in one copy at most.
pub(super) fn may_spread(work: &PoolRecord, seen: &Seen, whole: &Refusal) -> bool {
    work.may_reuse()
        && matches!(seen.operation, Operation::Sync(_))
        && matches!(whole, Refusal::Core { .. } | Refusal::PortHeld { .. })
        && seen.copies.len() <= 1
}

/// The owner decided pod by pod over the copies (see `spread`). `whole`: the refusal of the
/// workload in one copy, which a failure to spread it too extends.
pub(super) fn decide_spread(
    work: &mut PoolRecord,
    item: &BatchItem,
    seen: Seen,
    pass: Pass,
    whole: Option<Refusal>,
    rng: &mut impl Rng,
) -> Option<(ItemOutcome, Option<BTreeSet<ShardKey>>)> {
    let desired = match seen.operation {
        Operation::Sync(demands) => desired_slots(demands),
        Operation::Slots(slots) => slots.clone(),
        Operation::Release { role } => kept_slots(&seen.before, role.as_deref()),
        Operation::Remove => return Some((remove_everywhere(work, seen), None)),
    };
    // A spread workload that holds what it asks for (every resync of it): nothing to decide.
    if whole.is_none() && plan_slots(desired.clone(), &seen.before).is_noop() {
        return Some((ItemOutcome::Unchanged(seen.before), None));
    }
    // Its largest pod, as asked or as held: what the copies it may use depend on.
    let ports_per_pod = seen
        .operation
        .ports_per_pod()
        .max(seen.before.ports_per_pod());
    let asked = spread::Asked {
        uid: seen.uid,
        owner: seen.owner,
        desired: &desired,
        ports_per_pod,
    };
    let decided = match spread::spread(work, &asked, rng) {
        Ok(decided) => decided,
        Err(unplaced) => {
            let bound = work.copy_bound();
            let refusal = match whole {
                Some(whole) => unplaced.explain(whole, &bound),
                None => unplaced.into_refusal(&bound),
            };
            return Some((refused(refusal, seen.before), None));
        }
    };
    let mut touched: BTreeSet<ShardKey> = BTreeSet::new();
    for (&copy, after) in &decided.parts {
        let windows: BTreeSet<u16> = match work.copy(copy) {
            Some(record) => touched_by(record, seen.uid, after),
            None => split_by_shard(after).into_keys().collect(),
        };
        touched.extend(
            windows
                .into_iter()
                .map(|window| ShardKey::new(copy, window)),
        );
    }
    let widened = (!touched.is_subset(&item.known)).then(|| {
        let mut all = item.known.clone();
        all.extend(touched);
        all.extend(seen.present.iter().copied());
        all
    });
    if pass == Pass::WithinKnown && widened.is_some() {
        return None;
    }
    let holdings = decided.holdings();
    let (allocated, released) = (decided.allocated, decided.released);
    work.copies.extend(decided.copies);
    let outcome = if allocated == 0 && released == 0 {
        ItemOutcome::Unchanged(holdings)
    } else {
        ItemOutcome::Changed {
            holdings,
            allocated,
            released,
        }
    };
    Some((outcome, widened))
}

/// `held` without `role`'s slots (all of them without a role), each kept exactly as held.
fn kept_slots(held: &Holdings, role: Option<&str>) -> BTreeMap<SlotKey, Want> {
    held.iter()
        .filter(|(slot, _)| role.is_some_and(|r| slot.spec_role() != r))
        .map(|(slot, block)| {
            let want = Want {
                requested: Some(block.first),
                count: u32::from(block.count),
            };
            (slot.clone(), want)
        })
        .collect()
}

//! Placement in a pool with `nodeReuse`: copies fill in order, an owner stays in its copy, a
//! port is held at most once per copy and so at most N times in all.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::api::PortPool;
use crate::core::SlotKey;
use crate::ledger::fixtures::{allocation, holders, pool_of, pool_record, pool_reused, shard_in};
use crate::ledger::{PoolSnapshot, Reason, ShardKey, home_shard, owner_of, preview};

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

fn removal(uid: &str) -> BatchItem {
    BatchItem {
        uid: uid.into(),
        owner: format!("ns/{uid}"),
        operation: Ok(Operation::Remove),
        known: BTreeSet::new(),
    }
}

/// Who holds each port, per copy, from the record itself.
fn holders_by_port(record: &PoolRecord) -> BTreeMap<u16, Vec<(u16, String)>> {
    let mut by_port: BTreeMap<u16, Vec<(u16, String)>> = BTreeMap::new();
    for (&copy, shards) in &record.copies {
        for shard in shards.shards.values() {
            for (uid, entry) in &shard.record.holders {
                for port in entry.holdings.ports() {
                    by_port.entry(port).or_default().push((copy, uid.clone()));
                }
            }
        }
    }
    by_port
}

/// No port twice in one copy, at most `reuse` holders of a port, each of an owner's slots in
/// one copy.
fn check_invariants(record: &PoolRecord, reuse: usize) -> Result<(), String> {
    for (port, holders) in holders_by_port(record) {
        let copies: BTreeSet<u16> = holders.iter().map(|(c, _)| *c).collect();
        if copies.len() != holders.len() {
            return Err(format!("port {port} held twice in one copy: {holders:?}"));
        }
        if holders.len() > reuse {
            return Err(format!(
                "port {port} has {} holders: {holders:?}",
                holders.len()
            ));
        }
    }
    let owners: BTreeSet<String> = record
        .copies
        .values()
        .flat_map(|c| c.shards.values())
        .flat_map(|s| s.record.holders.keys().cloned())
        .collect();
    for uid in owners {
        let parts = record.parts_of(&uid);
        let slots: usize = parts.iter().map(|(_, part)| part.len()).sum();
        if slots != record.slot_copies(&uid).len() {
            return Err(format!("{uid} holds a slot in two copies: {parts:?}"));
        }
    }
    Ok(())
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(28)
}

#[test]
fn copies_fill_in_order_and_the_last_refusal_names_every_copy() {
    let pool = pool_reused(&["100-103"], 2);
    let mut record = pool_record(&pool, vec![]);
    let mut rng = rng();
    let mut placed = BTreeMap::new();
    for name in ["a", "b", "c", "d"] {
        let it = item(&record, &allocation(name, 2, None));
        let outcome = preview(&mut record, &it, &mut rng);
        assert!(matches!(
            outcome.outcome,
            ItemOutcome::Changed { allocated: 2, .. }
        ));
        placed.insert(name, record.copies_of(name));
    }
    assert_eq!(placed["a"], BTreeSet::from([0]));
    assert_eq!(placed["b"], BTreeSet::from([0]));
    assert_eq!(
        placed["c"],
        BTreeSet::from([1]),
        "copy 1 only once copy 0 is full"
    );
    assert_eq!(placed["d"], BTreeSet::from([1]));
    check_invariants(&record, 2).unwrap();
    assert_eq!(
        holders_by_port(&record).values().map(Vec::len).max(),
        Some(2)
    );

    let it = item(&record, &allocation("e", 1, None));
    let refused = preview(&mut record, &it, &mut rng).outcome;
    let ItemOutcome::Refused { refusal, .. } = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(refusal.reason(), Reason::PoolFull);
    assert!(
        refusal
            .to_string()
            .contains("each of the pool's 1 other copies, nodeReuse 2, refused too"),
        "{refusal}"
    );
}

#[test]
fn a_copy_with_too_few_free_ports_is_passed_over_and_one_with_enough_is_not() {
    let pool = pool_reused(&["100-104"], 3);
    let mut record = pool_record(&pool, vec![]);
    let mut rng = rng();
    let mut place = |record: &mut PoolRecord, name: &str, ports: i32| {
        let it = item(record, &allocation(name, ports, None));
        let outcome = preview(record, &it, &mut rng).outcome;
        assert!(
            matches!(outcome, ItemOutcome::Changed { .. }),
            "{name}: {outcome:?}"
        );
        record.copies_of(name)
    };
    // Copy 0 keeps one free port after `a`; `b` asks for two and goes to copy 1.
    assert_eq!(place(&mut record, "a", 4), BTreeSet::from([0]));
    assert_eq!(place(&mut record, "b", 2), BTreeSet::from([1]));
    // One port fits copy 0's last free one: the skip counts, it does not guess.
    assert_eq!(place(&mut record, "c", 1), BTreeSet::from([0]));
    // Copies 0 and 1 cannot take four; copy 2 can.
    assert_eq!(place(&mut record, "d", 4), BTreeSet::from([2]));
    check_invariants(&record, 3).unwrap();
}

#[test]
fn a_new_owner_in_a_later_copy_widens_its_status_to_that_copys_shards_first() {
    let pool = pool_reused(&["100-103"], 3);
    let full = holders(&[("a", "web.http=100,101,102,103")]);
    let record = pool_record(&pool, vec![shard_in(&pool, ShardKey::first(0), full)]);
    let it = item(&record, &allocation("b", 1, None));
    let placed = place(&record, &it, &mut rng());
    assert_eq!(placed.shards, BTreeSet::from([ShardKey::new(1, 0)]));
    assert_eq!(
        placed.widen,
        Some(BTreeSet::from([ShardKey::first(0), ShardKey::new(1, 0)])),
        "the home key stays listed beside the new one"
    );
    assert_eq!(placed.writes.len(), 1);
    assert_eq!(placed.writes[0].key, ShardKey::new(1, 0));
    assert_eq!(placed.writes[0].name, "p-0-c1");
    assert_eq!(placed.writes[0].resource_version, None, "a shard to create");
}

#[test]
fn an_owner_grows_in_its_own_copy_and_its_new_pods_go_where_there_is_room() {
    let pool = pool_reused(&["100-103"], 2);
    let shards = vec![
        shard_in(&pool, ShardKey::first(0), holders(&[("a", "web.http=100")])),
        shard_in(
            &pool,
            ShardKey::new(1, 0),
            holders(&[("c", "web.http=100,101,102,103")]),
        ),
    ];
    let record = pool_record(&pool, shards);
    let mut grown = item(&record, &allocation("c", 5, None));
    grown.known = BTreeSet::from([ShardKey::new(1, 0)]);
    let placed = place(&record, &grown, &mut rng());
    assert!(
        matches!(
            placed.outcome,
            ItemOutcome::Changed {
                allocated: 1,
                released: 0,
                ..
            }
        ),
        "{:?}",
        placed.outcome
    );
    let held = placed.outcome.holdings();
    for (index, port) in [(0, 100), (1, 101), (2, 102), (3, 103)] {
        assert_eq!(held.get(&SlotKey::new("web", "http", index)), Some(port));
    }
    assert_eq!(
        placed.widen,
        Some(BTreeSet::from([ShardKey::first(0), ShardKey::new(1, 0)])),
        "its fifth pod goes to copy 0, named in its status first"
    );
    assert_eq!(placed.writes.len(), 1, "copy 1's shard is unchanged");
    assert_eq!(placed.writes[0].key, ShardKey::first(0));
}

#[test]
fn a_requested_port_held_in_the_first_copy_is_taken_in_the_next() {
    let fixed = |name| allocation(name, 1, Some(100));
    for (reuse, expected) in [(1, None), (2, Some(ShardKey::new(1, 0)))] {
        let pool = match reuse {
            1 => pool_of(&["100-103"], &[]),
            n => pool_reused(&["100-103"], n),
        };
        let shards = vec![shard_in(
            &pool,
            ShardKey::first(0),
            holders(&[("a", "web.http=100")]),
        )];
        let record = pool_record(&pool, shards);
        let placed = place(&record, &item(&record, &fixed("b")), &mut rng());
        match expected {
            None => {
                let ItemOutcome::Refused { refusal, .. } = &placed.outcome else {
                    panic!("{:?}", placed.outcome);
                };
                assert_eq!(refusal.reason(), Reason::PortHeld);
            }
            Some(key) => {
                assert_eq!(placed.shards, BTreeSet::from([key]));
                assert_eq!(
                    placed.outcome.holdings().ports().collect::<Vec<_>>(),
                    vec![100]
                );
            }
        }
    }
}

#[test]
fn entries_left_in_a_second_copy_by_a_race_are_dropped_and_the_first_kept() {
    let pool = pool_reused(&["100-103"], 2);
    let shards = vec![
        shard_in(&pool, ShardKey::first(0), holders(&[("x", "web.http=100")])),
        shard_in(
            &pool,
            ShardKey::new(1, 0),
            holders(&[("x", "web.http=101")]),
        ),
    ];
    let record = pool_record(&pool, shards);
    let mut it = item(&record, &allocation("x", 1, None));
    it.known = BTreeSet::from([ShardKey::first(0), ShardKey::new(1, 0)]);
    let placed = place(&record, &it, &mut rng());
    assert_eq!(
        placed.outcome.holdings().ports().collect::<Vec<_>>(),
        vec![100]
    );
    assert!(matches!(
        placed.outcome,
        ItemOutcome::Changed { released: 1, .. }
    ));
    assert_eq!(placed.shards, BTreeSet::from([ShardKey::first(0)]));
    assert_eq!(placed.writes.len(), 1);
    assert_eq!(placed.writes[0].key, ShardKey::new(1, 0));
    assert!(placed.writes[0].status.holders.is_empty());
}

/// `x` as two clients racing on its creation left it: one entry in each copy, `a` in copy 0
/// and `b` in copy 1 beside it; `x` asks for port 100.
fn raced(copy_1: &str) -> (PoolRecord, BatchItem) {
    let pool = pool_reused(&["100-103"], 2);
    let shards = vec![
        shard_in(
            &pool,
            ShardKey::first(0),
            holders(&[("a", "web.http=100"), ("x", "web.http=101")]),
        ),
        shard_in(&pool, ShardKey::new(1, 0), entries(copy_1)),
    ];
    let record = pool_record(&pool, shards);
    let mut it = item(&record, &allocation("x", 1, Some(100)));
    it.known = BTreeSet::from([ShardKey::first(0), ShardKey::new(1, 0)]);
    (record, it)
}

/// `"uid ports;uid ports"` as entries.
fn entries(text: &str) -> Vec<crate::api::PoolHolder> {
    let pairs: Vec<(&str, &str)> = text
        .split(';')
        .map(|e| e.split_once(' ').expect("uid ports"))
        .collect();
    holders(&pairs)
}

#[test]
fn an_owner_a_race_left_in_two_copies_goes_to_the_one_that_takes_it() {
    // Copy 0 refuses 100 (a holds it); copy 1, where x's other entry is, takes it.
    let (record, it) = raced("x web.http=102");
    let placed = place(&record, &it, &mut rng());
    assert!(
        matches!(
            placed.outcome,
            ItemOutcome::Changed {
                released: 2,
                allocated: 1,
                ..
            }
        ),
        "{:?}",
        placed.outcome
    );
    assert_eq!(
        placed.outcome.holdings().ports().collect::<Vec<_>>(),
        vec![100]
    );
    assert_eq!(placed.shards, BTreeSet::from([ShardKey::new(1, 0)]));
    let written: BTreeMap<ShardKey, usize> = placed
        .writes
        .iter()
        .map(|w| (w.key, w.status.holders.len()))
        .collect();
    assert_eq!(
        written,
        BTreeMap::from([(ShardKey::first(0), 1), (ShardKey::new(1, 0), 1)]),
        "x leaves copy 0 (a stays) and holds 100 in copy 1"
    );
}

#[test]
fn an_owner_a_race_left_in_two_copies_and_refused_by_both_keeps_only_the_first() {
    // 100 is held in both copies: refused, and the stray entry in copy 1 goes.
    let (record, it) = raced("b web.http=100;x web.http=102");
    let placed = place(&record, &it, &mut rng());
    let ItemOutcome::Refused { refusal, holdings } = &placed.outcome else {
        panic!("{:?}", placed.outcome);
    };
    assert_eq!(refusal.reason(), Reason::PortHeld);
    assert_eq!(holdings.ports().collect::<Vec<_>>(), vec![101]);
    assert_eq!(placed.writes.len(), 1, "only copy 1's shard changes");
    assert_eq!(placed.writes[0].key, ShardKey::new(1, 0));
    let left: Vec<&str> = placed.writes[0]
        .status
        .holders
        .iter()
        .map(|h| h.ports.as_str())
        .collect();
    assert_eq!(left, vec!["web.http=100"], "b keeps its port");
    assert_eq!(placed.shards, BTreeSet::from([ShardKey::first(0)]));
}

#[test]
fn an_owner_in_a_copy_past_node_reuse_may_shrink_but_not_grow() {
    let mut pool: PortPool = pool_reused(&["100-103"], 3);
    let shards = vec![shard_in(
        &pool,
        ShardKey::new(2, 0),
        holders(&[("x", "web.http=100,101")]),
    )];
    pool.spec.node_reuse = Some(2);
    pool.metadata.generation = Some(2);
    let record = PoolRecord::load(PoolSnapshot::of_pool(&pool), shards).unwrap();
    assert_eq!(
        record.reuse(),
        2,
        "the pool read is newer than the shard's snapshot"
    );
    let known = BTreeSet::from([ShardKey::new(2, 0)]);
    let mut grow = item(&record, &allocation("x", 3, None));
    grow.known = known.clone();
    let ItemOutcome::Refused { refusal, .. } = place(&record, &grow, &mut rng()).outcome else {
        panic!("growth past nodeReuse");
    };
    assert!(matches!(
        refusal,
        Refusal::BeyondReuse {
            copy: 2,
            reuse: 2,
            ..
        }
    ));
    assert!(
        refusal
            .to_string()
            .contains("Set nodeReuse to 3 or more again"),
        "{refusal}"
    );
    let mut shrink = item(&record, &allocation("x", 1, None));
    shrink.known = known;
    let placed = place(&record, &shrink, &mut rng());
    assert!(matches!(
        placed.outcome,
        ItemOutcome::Changed {
            released: 1,
            allocated: 0,
            ..
        }
    ));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        rng_seed: proptest::test_runner::RngSeed::Fixed(28),
        ..ProptestConfig::default()
    })]

    /// Random creations and deletions of 1-3 pod owners into a 20-port pool over two windows
    /// with reuse 1-4: after every step no port is held twice in a copy, never more than N
    /// times in all, each of an owner's pods is in one copy; and an owner is refused only when
    /// the copies together lack the free ports it asks for (its pods spread when one copy does).
    #[test]
    fn a_port_is_held_at_most_once_per_copy(
        reuse in 1i32..=4,
        steps in prop::collection::vec((any::<bool>(), 1i32..=3, any::<u8>()), 1..60),
        seed in any::<u64>(),
    ) {
        let pool = match reuse {
            1 => pool_of(&["250-269"], &[]),
            n => pool_reused(&["250-269"], n),
        };
        let mut record = pool_record(&pool, vec![]);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut live: Vec<String> = Vec::new();
        for (n, (create, replicas, pick)) in steps.into_iter().enumerate() {
            if create || live.is_empty() {
                let name = format!("o{n}");
                let free: Vec<u32> = (0..reuse as u16)
                    .map(|c| record.copy_or_empty(c).union_record().state.free_count())
                    .collect();
                let it = item(&record, &allocation(&name, replicas, None));
                match preview(&mut record, &it, &mut rng).outcome {
                    ItemOutcome::Refused { refusal, .. } => {
                        prop_assert_eq!(refusal.reason(), Reason::PoolFull);
                        prop_assert!(free.iter().sum::<u32>() < replicas as u32, "{free:?}");
                    }
                    _ => live.push(name),
                }
            } else {
                let gone = live.remove(usize::from(pick) % live.len());
                preview(&mut record, &removal(&gone), &mut rng);
            }
            if let Err(broken) = check_invariants(&record, reuse as usize) {
                prop_assert!(false, "{}", broken);
            }
        }
    }
}

//! A workload bigger than one copy: its pods spread over the copies, each pod whole in one.

use std::collections::{BTreeMap, BTreeSet};

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::api::{PortAllocation, PortRequest, PortScope};
use crate::core::SlotKey;
use crate::ledger::fixtures::{allocation, pool_record, pool_reused};
use crate::ledger::placement::shard_choice::{BatchItem, ItemOutcome};
use crate::ledger::{Operation, PoolRecord, Reason, ShardKey, owner_of, preview};

/// `name` with one role `engine` of `pods` pods, each with `ports` PodScoped ports.
fn workload(name: &str, pods: i32, ports: usize) -> PortAllocation {
    let mut pa = allocation(name, pods, None);
    let role = &mut pa.spec.roles[0];
    role.name = "engine".into();
    role.ports = (0..ports)
        .map(|i| PortRequest {
            name: format!("p{i}"),
            scope: PortScope::PodScoped,
            env: format!("P{i}"),
            ..Default::default()
        })
        .collect();
    pa
}

/// Its item, with every shard the record has for it known (as its status would say).
fn item(record: &PoolRecord, pa: &PortAllocation) -> BatchItem {
    let uid = pa.metadata.uid.clone().unwrap();
    BatchItem {
        known: record.shards_of(&uid),
        uid,
        owner: owner_of(pa),
        operation: Operation::sync_of(pa),
    }
}

fn sync(record: &mut PoolRecord, pa: &PortAllocation) -> ItemOutcome {
    let it = item(record, pa);
    preview(record, &it, &mut StdRng::seed_from_u64(34)).outcome
}

/// The copy of each pod (`role`, index), asserting each pod's ports are in one copy.
fn pod_copies(record: &PoolRecord, uid: &str) -> BTreeMap<(String, u32), u16> {
    let mut pods: BTreeMap<(String, u32), BTreeSet<u16>> = BTreeMap::new();
    for (slot, copy) in record.slot_copies(uid) {
        pods.entry((slot.role, slot.index))
            .or_default()
            .insert(copy);
    }
    pods.into_iter()
        .map(|(pod, copies)| {
            assert_eq!(copies.len(), 1, "pod {pod:?} in copies {copies:?}");
            (pod, *copies.first().unwrap())
        })
        .collect()
}

/// No port is held twice in one copy.
fn assert_no_port_twice_in_a_copy(record: &PoolRecord) {
    for copy in record.copies.values() {
        let mut seen = BTreeSet::new();
        for shard in copy.shards.values() {
            for entry in shard.record.holders.values() {
                for port in entry.holdings.ports() {
                    assert!(seen.insert(port), "port {port} twice in copy {}", copy.copy);
                }
            }
        }
    }
}

#[test]
fn twenty_four_pods_of_four_ports_spread_over_three_copies_of_forty_ports() {
    let pool = pool_reused(&["41000-41039"], 4);
    let mut record = pool_record(&pool, vec![]);
    let pa = workload("decode", 24, 4);
    let outcome = sync(&mut record, &pa);
    let ItemOutcome::Changed { allocated: 96, .. } = outcome else {
        panic!("{outcome:?}");
    };
    let copies = pod_copies(&record, "decode");
    assert_eq!(copies.len(), 24);
    let per_copy = copies.values().fold(BTreeMap::new(), |mut n, &c| {
        *n.entry(c).or_insert(0) += 1;
        n
    });
    assert_eq!(
        per_copy,
        BTreeMap::from([(0, 10), (1, 10), (2, 4)]),
        "copies fill in order"
    );
    assert_no_port_twice_in_a_copy(&record);
    assert_eq!(outcome_holdings(&record, "decode"), 96);

    // A second run moves nothing: every pod keeps its ports.
    let before = record.holdings_of("decode");
    assert!(matches!(sync(&mut record, &pa), ItemOutcome::Unchanged(_)));
    assert_eq!(record.holdings_of("decode"), before);
}

fn outcome_holdings(record: &PoolRecord, uid: &str) -> u32 {
    record.holdings_of(uid).port_count()
}

#[test]
fn a_spread_workload_scales_down_and_up_pod_by_pod() {
    let pool = pool_reused(&["100-107"], 3);
    let mut record = pool_record(&pool, vec![]);
    let pa = workload("w", 6, 2);
    assert!(matches!(
        sync(&mut record, &pa),
        ItemOutcome::Changed { allocated: 12, .. }
    ));
    let first = record.holdings_of("w");

    let shrunk = workload("w", 3, 2);
    let outcome = sync(&mut record, &shrunk);
    assert!(
        matches!(
            outcome,
            ItemOutcome::Changed {
                allocated: 0,
                released: 6,
                ..
            }
        ),
        "{outcome:?}"
    );
    for (slot, block) in record.holdings_of("w").iter() {
        assert_eq!(first.block(slot), Some(block), "pod {slot:?} kept its port");
    }

    let grown = workload("w", 7, 2);
    let outcome = sync(&mut record, &grown);
    assert!(
        matches!(
            outcome,
            ItemOutcome::Changed {
                allocated: 8,
                released: 0,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(pod_copies(&record, "w").len(), 7);
    assert_no_port_twice_in_a_copy(&record);
}

#[test]
fn an_owner_that_outgrows_its_copy_keeps_its_pods_and_puts_new_ones_in_another() {
    let pool = pool_reused(&["100-103"], 2);
    let mut record = pool_record(&pool, vec![]);
    let small = workload("w", 2, 2);
    sync(&mut record, &small);
    let before = record.holdings_of("w");
    assert_eq!(record.copies_of("w"), BTreeSet::from([0]));

    let outcome = sync(&mut record, &workload("w", 3, 2));
    assert!(
        matches!(outcome, ItemOutcome::Changed { allocated: 2, .. }),
        "{outcome:?}"
    );
    let copies = pod_copies(&record, "w");
    assert_eq!(copies[&("engine".to_string(), 0)], 0);
    assert_eq!(copies[&("engine".to_string(), 1)], 0);
    assert_eq!(copies[&("engine".to_string(), 2)], 1);
    for (slot, block) in before.iter() {
        assert_eq!(record.holdings_of("w").block(slot), Some(block));
    }
}

#[test]
fn a_role_scoped_port_goes_with_the_roles_first_pod() {
    let pool = pool_reused(&["100-104"], 3);
    let mut record = pool_record(&pool, vec![]);
    let mut pa = workload("w", 4, 2);
    pa.spec.roles[0].ports.push(PortRequest {
        name: "dist".into(),
        scope: PortScope::RoleScoped,
        env: "DIST".into(),
        ..Default::default()
    });
    let outcome = sync(&mut record, &pa);
    assert!(
        matches!(outcome, ItemOutcome::Changed { allocated: 9, .. }),
        "{outcome:?}"
    );
    let slots = record.slot_copies("w");
    let pod0 = slots[&SlotKey::new("engine", "p0", 0)];
    assert_eq!(slots[&SlotKey::new("engine", "dist", 0)], pod0);
    assert_no_port_twice_in_a_copy(&record);
}

#[test]
fn pods_that_fit_nowhere_are_refused_with_how_far_the_spread_got_and_nothing_is_written() {
    let pool = pool_reused(&["100-107"], 2);
    let mut record = pool_record(&pool, vec![]);
    let pa = workload("w", 12, 2);
    let it = item(&record, &pa);
    let placed = crate::ledger::place(&record, &it, &mut StdRng::seed_from_u64(1));
    let ItemOutcome::Refused { refusal, holdings } = &placed.outcome else {
        panic!("{:?}", placed.outcome);
    };
    assert_eq!(refusal.reason(), Reason::PoolFull);
    assert!(holdings.is_empty());
    assert!(placed.writes.is_empty(), "{:?}", placed.writes);
    let text = refusal.to_string();
    assert!(
        text.contains("spread pod by pod over the copies, 8 of its 12 pods fit, and pod engine[8] fits in none"),
        "{text}"
    );
    assert!(text.contains("raise its nodeReuse"), "{text}");
    assert!(sync(&mut record, &pa).holdings().is_empty());
}

#[test]
fn releasing_and_removing_a_spread_workload_frees_every_copy() {
    let pool = pool_reused(&["100-105"], 3);
    for operation in [Operation::Release { role: None }, Operation::Remove] {
        let mut record = pool_record(&pool, vec![]);
        sync(&mut record, &workload("w", 5, 2));
        assert_eq!(record.copies_of("w").len(), 2);
        let mut it = item(&record, &workload("w", 5, 2));
        it.operation = Ok(operation.clone());
        let outcome = preview(&mut record, &it, &mut StdRng::seed_from_u64(2)).outcome;
        assert!(
            matches!(outcome, ItemOutcome::Changed { released: 10, .. }),
            "{operation:?}: {outcome:?}"
        );
        assert!(record.copies_of("w").is_empty(), "{operation:?}");
    }
}

#[test]
fn a_new_spread_owner_widens_its_status_to_every_copy_before_writing() {
    let pool = pool_reused(&["100-103"], 3);
    let record = pool_record(&pool, vec![]);
    let mut it = item(&record, &workload("w", 3, 2));
    it.known = BTreeSet::from([ShardKey::first(0)]);
    let placed = crate::ledger::place(&record, &it, &mut StdRng::seed_from_u64(3));
    assert!(matches!(
        placed.outcome,
        ItemOutcome::Changed { allocated: 6, .. }
    ));
    assert_eq!(
        placed.shards,
        BTreeSet::from([ShardKey::first(0), ShardKey::new(1, 0)])
    );
    assert_eq!(placed.widen, Some(placed.shards.clone()));
}

#[test]
fn a_pool_that_follows_its_nodes_spreads_a_workload_only_over_the_copies_its_pods_may_use() {
    let mut pool = crate::ledger::fixtures::pool_of(&["100-107"], &[]);
    pool.spec.follow_nodes = Some(crate::api::FollowNodes::default());
    let with_nodes = |nodes| {
        let mut snapshot = crate::ledger::PoolSnapshot::of_pool(&pool);
        snapshot.nodes = Some(crate::ledger::NodeCount::Counted(nodes));
        PoolRecord::load(snapshot, Vec::new()).unwrap()
    };
    // Pods of 2 ports: 6 nodes allow copies 0-2 (2 x 2 other holders < 6), room for 12 pods.
    let mut six = with_nodes(6);
    let pa = workload("w", 10, 2);
    assert!(matches!(
        sync(&mut six, &pa),
        ItemOutcome::Changed { allocated: 20, .. }
    ));
    let mut per_copy: BTreeMap<u16, usize> = BTreeMap::new();
    for copy in pod_copies(&six, "w").into_values() {
        *per_copy.entry(copy).or_default() += 1;
    }
    assert_eq!(per_copy, BTreeMap::from([(0, 4), (1, 4), (2, 2)]));

    // 4 nodes allow copies 0-1 only: 8 of the 10 pods fit, and the refusal says why.
    let mut four = with_nodes(4);
    let ItemOutcome::Refused { refusal, holdings } = sync(&mut four, &pa) else {
        panic!("10 pods of 2 ports in two copies of 8 ports");
    };
    assert!(holdings.is_empty());
    let text = refusal.to_string();
    assert!(text.contains("8 of its 10 pods fit"), "{text}");
    assert!(
        text.contains(
            "fits in none (copy 2 refused: pods of 2 ports with 2 other holders per port could \
             be kept off 4 of the pool's 4 nodes)"
        ),
        "the rule that kept it out of copy 2, with its figures: {text}"
    );
    assert!(
        text.contains(
            "each of the 1 other copies its pods may use while following the pool's nodes"
        ),
        "{text}"
    );
    assert!(four.copies_in_use().is_empty(), "nothing written");
}

mod follow_nodes_property {
    use super::*;
    use crate::ledger::record::node_bound::CopyBound;
    use proptest::prelude::*;

    fn record_with_nodes(nodes: u32) -> PoolRecord {
        let mut pool = crate::ledger::fixtures::pool_of(&["100-107"], &[]);
        pool.spec.follow_nodes = Some(crate::api::FollowNodes::default());
        let mut snapshot = crate::ledger::PoolSnapshot::of_pool(&pool);
        snapshot.nodes = Some(crate::ledger::NodeCount::Counted(nodes));
        PoolRecord::load(snapshot, Vec::new()).unwrap()
    }

    /// How many pods of `size` ports the copies below `allowed` still have room for.
    fn room(record: &PoolRecord, allowed: u16, size: u32) -> u32 {
        (0..allowed)
            .map(|copy| record.copy(copy).map_or(8, |c| c.free_ports()) / size)
            .sum()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// A spread workload in a follow-nodes pool uses exactly the copies a separate holder
        /// of its pod size may use: never one past them, and it is refused only when those
        /// copies have no room for its pods.
        #[test]
        fn a_spread_workload_gets_the_copies_a_separate_holder_would(
            nodes in 1u32..12,
            size in 1usize..4,
            replicas in 1i32..24,
            present in proptest::collection::vec(1usize..4, 0..3),
        ) {
            let mut record = record_with_nodes(nodes);
            for (i, &k) in present.iter().enumerate() {
                let _ = sync(&mut record, &workload(&format!("h{i}"), 1, k));
            }
            let size32 = size as u32;
            let allowed = match record.copy_bound() {
                CopyBound::FollowNodes(_) => {
                    record.copy_bound().copies_allowed(size32, record.in_use())
                }
                CopyBound::Fixed(_) => unreachable!("a follow-nodes pool"),
            };
            let room = room(&record, allowed, size32);
            let before = record.clone();
            let pa = workload("w", replicas, size);
            match sync(&mut record, &pa) {
                ItemOutcome::Refused { .. } => {
                    prop_assert!(
                        room < replicas as u32,
                        "refused with room for {room} of {replicas} pods in copies 0..{allowed}"
                    );
                    prop_assert_eq!(record.copies_in_use(), before.copies_in_use());
                }
                _ => {
                    for copy in pod_copies(&record, "w").into_values() {
                        prop_assert!(copy < allowed, "pod in copy {copy}, allowed 0..{allowed}");
                    }
                    assert_no_port_twice_in_a_copy(&record);
                }
            }
        }
    }
}

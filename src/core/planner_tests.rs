//! Unit and property tests of the planner with single ports.

use super::super::band::{Band, StaticBand};
use super::super::range::{PortRange, PortSet};
use super::*;
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeSet;

fn demand(role: &str, port: &str, scope: Scope, replicas: u32) -> PortDemand {
    PortDemand {
        role: role.into(),
        port: port.into(),
        scope,
        replicas,
        requested: None,
        count: 1,
    }
}

fn requesting(mut demand: PortDemand, port: u16) -> PortDemand {
    demand.requested = Some(port);
    demand
}

fn slot(role: &str, port: &str, index: u32) -> SlotKey {
    SlotKey::new(role, port, index)
}

fn pool(ranges: &str) -> PoolState {
    PoolState::new(ranges.parse().unwrap(), StaticBand::Auto)
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(42)
}

#[test]
fn desired_slots_follow_scope_and_replicas() {
    let demands = [
        demand("decode", "http", Scope::PodScoped, 3),
        requesting(demand("router", "http", Scope::RoleScoped, 2), 30080),
        demand("idle", "http", Scope::RoleScoped, 0),
        demand("idle", "metrics", Scope::PodScoped, 0),
    ];
    let slots: Vec<(SlotKey, Option<u16>)> = desired_slots(&demands)
        .into_iter()
        .map(|(slot, want)| (slot, want.requested))
        .collect();
    assert_eq!(
        slots,
        [
            (slot("decode", "http", 0), None),
            (slot("decode", "http", 1), None),
            (slot("decode", "http", 2), None),
            (slot("router", "http", 0), Some(30080)),
        ]
    );
}

#[test]
fn first_plan_allocates_everything_and_the_second_plans_nothing() {
    let demands = [
        demand("decode", "http", Scope::PodScoped, 3),
        requesting(demand("router", "http", Scope::RoleScoped, 1), 30080),
    ];
    let mut state = pool("30000-32767");
    let first = plan(&demands, &Holdings::new());
    assert_eq!(first.allocate.len(), 4);
    assert_eq!(first.automatic_count(), 3);
    let held = execute(&first, &mut state, &mut rng()).unwrap();
    assert_eq!(held.len(), 4);
    assert_eq!(held.get(&slot("router", "http", 0)), Some(30080));
    assert_eq!(state.held_count(), 4);
    for port in held.ports() {
        assert!(state.is_held(port));
    }
    assert!(plan(&demands, &held).is_noop());
}

#[test]
fn changing_a_requested_port_moves_only_that_slot() {
    let mut state = pool("30000-30100");
    let before = [
        requesting(demand("a", "http", Scope::RoleScoped, 1), 30010),
        demand("a", "metrics", Scope::RoleScoped, 1),
    ];
    let held = execute(&plan(&before, &Holdings::new()), &mut state, &mut rng()).unwrap();
    let metrics = held.get(&slot("a", "metrics", 0)).unwrap();

    let after = [
        requesting(demand("a", "http", Scope::RoleScoped, 1), 30020),
        demand("a", "metrics", Scope::RoleScoped, 1),
    ];
    let change = plan(&after, &held);
    assert_eq!(
        change.release,
        [(slot("a", "http", 0), PortBlock::single(30010))]
    );
    assert_eq!(
        change.allocate,
        [(slot("a", "http", 0), Want::single(Some(30020)))]
    );
    let held = execute(&change, &mut state, &mut rng()).unwrap();
    assert_eq!(held.get(&slot("a", "metrics", 0)), Some(metrics));
    assert!(!state.is_held(30010));
    assert!(state.is_held(30020));
}

#[test]
fn dropping_a_request_keeps_the_port() {
    let held: Holdings = [(slot("a", "http", 0), 30010)].into_iter().collect();
    let demands = [demand("a", "http", Scope::RoleScoped, 1)];
    assert!(plan(&demands, &held).is_noop());
}

#[test]
fn two_slots_can_swap_requested_ports_in_one_plan() {
    let mut state = pool("100-200");
    let first = [
        requesting(demand("a", "x", Scope::RoleScoped, 1), 100),
        requesting(demand("b", "x", Scope::RoleScoped, 1), 101),
    ];
    let held = execute(&plan(&first, &Holdings::new()), &mut state, &mut rng()).unwrap();
    let swapped = [
        requesting(demand("a", "x", Scope::RoleScoped, 1), 101),
        requesting(demand("b", "x", Scope::RoleScoped, 1), 100),
    ];
    let held = execute(&plan(&swapped, &held), &mut state, &mut rng()).unwrap();
    assert_eq!(held.get(&slot("a", "x", 0)), Some(101));
    assert_eq!(held.get(&slot("b", "x", 0)), Some(100));
    assert_eq!(state.held_count(), 2);
}

#[test]
fn a_port_requested_twice_is_refused_before_anything_changes() {
    let mut state = pool("30000-30100");
    let demands = [requesting(
        demand("decode", "http", Scope::PodScoped, 2),
        30050,
    )];
    let err = execute(&plan(&demands, &Holdings::new()), &mut state, &mut rng()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "port 30050 is requested by 2 slots (decode.http[0], decode.http[1]): one port can be held only once, so request it for one slot, or leave it unset so each slot gets its own"
    );
    assert_eq!(state.held_count(), 0);
}

#[test]
fn a_failed_request_rolls_back_the_releases_and_earlier_requests() {
    let mut state = pool("100-110");
    let held = execute(
        &plan(&[demand("a", "x", Scope::PodScoped, 2)], &Holdings::new()),
        &mut state,
        &mut rng(),
    )
    .unwrap();
    state.take_requested(109).unwrap();
    let snapshot = state.clone();
    let demands = [
        requesting(demand("b", "x", Scope::RoleScoped, 1), 105),
        requesting(demand("c", "x", Scope::RoleScoped, 1), 109),
    ];
    // Releases a.x[0..2], takes 105, then fails on 109.
    let err = execute(&plan(&demands, &held), &mut state, &mut rng()).unwrap_err();
    assert_eq!(err, AllocError::Held { port: 109 });
    assert_eq!(state, snapshot);

    let outside = [requesting(demand("b", "x", Scope::RoleScoped, 1), 99)];
    let err = execute(&plan(&outside, &held), &mut state, &mut rng()).unwrap_err();
    assert!(matches!(err, AllocError::NotInPool { port: 99, .. }));
    assert_eq!(state, snapshot);
}

#[test]
fn pool_full_counts_what_the_plan_needs() {
    let mut state = pool("30000-30009");
    for port in 30000..30008 {
        state.take_requested(port).unwrap();
    }
    let demands = [demand("a", "x", Scope::PodScoped, 5)];
    let err = execute(&plan(&demands, &Holdings::new()), &mut state, &mut rng()).unwrap_err();
    assert_eq!(
        err,
        AllocError::PoolFull {
            size: 10,
            used: 8,
            needed: 5,
            free: 2,
            runs: None,
        }
    );
}

// ---- property tests -------------------------------------------------

const ROLES: [&str; 3] = ["decode", "prefill", "router"];
const PORTS: [&str; 2] = ["http", "grpc"];

fn arb_pool() -> impl Strategy<Value = PoolState> {
    let ranges = prop::collection::vec((1u16..120, 0u16..25), 1..4);
    let band = prop_oneof![
        Just(StaticBand::Auto),
        Just(StaticBand::None),
        (0u32..40).prop_map(StaticBand::Count),
    ];
    (ranges, band).prop_map(|(ranges, band)| {
        let ports = PortSet::from_ranges(ranges.into_iter().map(|(first, extra)| PortRange {
            first,
            last: first + extra,
        }));
        PoolState::new(ports, band)
    })
}

/// Demands with distinct (role, port) pairs; requested ports are rare
/// and drawn from around the pool so they collide and fall outside.
fn arb_demands() -> impl Strategy<Value = Vec<PortDemand>> {
    let scope = prop_oneof![Just(Scope::RoleScoped), Just(Scope::PodScoped)];
    let requested = prop_oneof![6 => Just(None), 1 => (1u16..150).prop_map(Some)];
    let count = prop_oneof![4 => Just(1u32), 1 => 2u32..12];
    prop::collection::btree_map(
        (0..ROLES.len(), 0..PORTS.len()),
        (scope, 0u32..5, requested, count),
        0..5,
    )
    .prop_map(|map| {
        map.into_iter()
            .map(
                |((role, port), (scope, replicas, requested, count))| PortDemand {
                    role: ROLES[role].into(),
                    port: PORTS[port].into(),
                    scope,
                    replicas,
                    requested,
                    count,
                },
            )
            .collect()
    })
}

fn all_held(owners: &[Holdings]) -> Vec<u16> {
    owners.iter().flat_map(Holdings::ports).collect()
}

proptest! {
    #[test]
    fn many_owners_never_share_a_port(
        mut state in arb_pool(),
        steps in prop::collection::vec((0usize..4, arb_demands()), 1..16),
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut owners = vec![Holdings::new(); 4];
        for (owner, demands) in steps {
            let before = state.clone();
            let change = plan(&demands, &owners[owner]);
            match execute(&change, &mut state, &mut rng) {
                Ok(held) => {
                    // Planning again against the result is a no-op.
                    prop_assert!(plan(&demands, &held).is_noop());
                    // Released ports are free unless re-taken by this plan.
                    for port in change.release.iter().flat_map(|(_, b)| b.ports()) {
                        let retaken = held.ports().any(|p| p == port);
                        prop_assert_eq!(state.is_held(port), retaken);
                    }
                    // Every block is whole and inside the pool, and is
                    // contiguous ports of the pool (no gap or exclusion).
                    for (_, block) in held.iter() {
                        prop_assert!(block.ports().all(|p| state.contains(p)), "{} leaves the pool", block);
                    }
                    for (slot, want) in desired_slots(&demands) {
                        let block = held.block(&slot).unwrap();
                        prop_assert!(want.is_met_by(block), "{} holds {} for {:?}", slot, block, want);
                    }
                    owners[owner] = held;
                }
                Err(_) => prop_assert_eq!(&state, &before),
            }
            let held = all_held(&owners);
            let unique: BTreeSet<u16> = held.iter().copied().collect();
            prop_assert_eq!(unique.len(), held.len(), "a port is held twice: {:?}", owners);
            // The pool holds exactly the owners' ports, nothing leaked.
            prop_assert_eq!(state.held_ports().collect::<BTreeSet<_>>(), unique);
        }
    }

    #[test]
    fn a_failed_execute_leaves_the_pool_untouched(
        mut state in arb_pool(),
        first in arb_demands(),
        second in arb_demands(),
        squatters in prop::collection::vec(1u16..150, 0..30),
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let held = execute(&plan(&first, &Holdings::new()), &mut state, &mut rng)
            .unwrap_or_default();
        for port in squatters {
            let _ = state.take_requested(port);
        }
        let before = state.clone();
        if execute(&plan(&second, &held), &mut state, &mut rng).is_err() {
            prop_assert_eq!(state, before);
        }
    }

    #[test]
    fn a_full_pool_fails_without_changing_anything(
        mut state in arb_pool(),
        held_first in 1u32..6,
        extra in 1u32..5,
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        prop_assume!(state.size() >= held_first);
        let owned = execute(
            &plan(&[demand("decode", "http", Scope::PodScoped, held_first)], &Holdings::new()),
            &mut state,
            &mut rng,
        ).unwrap();
        // Give up the current ports and ask for more than the whole
        // remaining pool, including the ports being given up.
        let wanted = state.free_count() + held_first + extra;
        let change = plan(&[demand("prefill", "http", Scope::PodScoped, wanted)], &owned);
        prop_assert_eq!(change.release.len() as u32, held_first);
        let before = state.clone();
        let err = execute(&change, &mut state, &mut rng).unwrap_err();
        prop_assert_eq!(err, AllocError::PoolFull {
            size: before.size(),
            used: before.held_count() - held_first,
            needed: wanted,
            free: before.free_count() + held_first,
            runs: None,
        });
        prop_assert_eq!(state, before);
    }

    #[test]
    fn automatic_ports_use_the_static_band_only_once_the_dynamic_band_is_full(
        mut state in arb_pool(),
        replicas in 1u32..60,
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let dynamic_free = state.dynamic_usage().free();
        let change = plan(&[demand("a", "x", Scope::PodScoped, replicas)], &Holdings::new());
        if let Ok(held) = execute(&change, &mut state, &mut rng) {
            let in_static = held
                .ports()
                .filter(|&p| state.band_of(p) == Some(Band::Static))
                .count() as u32;
            prop_assert_eq!(in_static, replicas.saturating_sub(dynamic_free));
        } else {
            prop_assert!(replicas > state.size());
        }
    }

    #[test]
    fn scaling_down_releases_exactly_the_removed_indices(
        from in 1u32..10,
        to_fraction in 0u32..100,
        seed in any::<u64>(),
    ) {
        let to = from * to_fraction / 100;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut state = pool("5000-5099");
        let steady = demand("router", "http", Scope::RoleScoped, 1);
        let big = [steady.clone(), demand("decode", "http", Scope::PodScoped, from)];
        let held = execute(&plan(&big, &Holdings::new()), &mut state, &mut rng).unwrap();

        let small = [steady, demand("decode", "http", Scope::PodScoped, to)];
        let change = plan(&small, &held);
        prop_assert!(change.allocate.is_empty());
        let released: Vec<u32> = change.release.iter().map(|(s, _)| s.index).collect();
        prop_assert_eq!(released, (to..from).collect::<Vec<_>>());
        for (slot, block) in &change.release {
            prop_assert_eq!(slot.port.as_str(), "http");
            prop_assert_eq!(held.block(slot), Some(*block));
        }

        let after = execute(&change, &mut state, &mut rng).unwrap();
        prop_assert_eq!(after.len() as u32, 1 + to);
        for (slot, block) in after.iter() {
            prop_assert_eq!(held.block(slot), Some(block), "{} moved", slot);
            prop_assert!(state.is_held(block.first));
        }
        for (_, block) in &change.release {
            prop_assert!(!state.is_held(block.first));
        }
    }
}

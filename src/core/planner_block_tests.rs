//! The planner with blocks of contiguous ports (`PortDemand::count` > 1).

use super::super::band::{Band, StaticBand};
use super::super::fragmentation::RunSummary;
use super::super::range::{PortRange, PortSet};
use super::*;
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeSet;

fn blocks(role: &str, port: &str, scope: Scope, replicas: u32, count: u32) -> PortDemand {
    PortDemand {
        role: role.into(),
        port: port.into(),
        scope,
        replicas,
        requested: None,
        count,
    }
}

fn requested(mut demand: PortDemand, port: u16) -> PortDemand {
    demand.requested = Some(port);
    demand
}

fn slot(role: &str, port: &str, index: u32) -> SlotKey {
    SlotKey::new(role, port, index)
}

fn pool(ranges: &str, band: StaticBand) -> PoolState {
    PoolState::new(ranges.parse().unwrap(), band)
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(11)
}

fn run(
    demands: &[PortDemand],
    held: &Holdings,
    state: &mut PoolState,
) -> Result<Holdings, AllocError> {
    execute(&plan(demands, held), state, &mut rng())
}

#[test]
fn pod_scoped_blocks_are_disjoint_contiguous_runs_and_replanning_keeps_them() {
    let mut state = pool("30000-32767", StaticBand::Auto);
    let demands = [
        blocks("ray", "workers", Scope::PodScoped, 3, 8),
        blocks("ray", "head", Scope::RoleScoped, 3, 1),
    ];
    let held = run(&demands, &Holdings::new(), &mut state).unwrap();
    assert_eq!(held.len(), 4);
    assert_eq!(held.port_count(), 25);
    assert_eq!(state.held_count(), 25);
    let mut seen = BTreeSet::new();
    for index in 0..3 {
        let block = held.block(&slot("ray", "workers", index)).unwrap();
        assert_eq!(block.count, 8);
        for port in block.ports() {
            assert!(state.is_held(port));
            assert_eq!(state.band_of(port), Some(Band::Dynamic));
            assert!(seen.insert(port), "port {port} in two blocks");
        }
    }
    assert!(plan(&demands, &held).is_noop());
}

#[test]
fn blocks_of_one_size_in_an_empty_band_start_on_multiples_of_the_size() {
    // Dynamic band 100-227 (128 ports, static band none): 16 blocks of 8 tile it exactly.
    let mut state = pool("100-227", StaticBand::None);
    let held = run(
        &[blocks("a", "x", Scope::PodScoped, 16, 8)],
        &Holdings::new(),
        &mut state,
    )
    .unwrap();
    assert_eq!(state.free_count(), 0);
    for (_, block) in held.iter() {
        assert_eq!((block.first - 100) % 8, 0, "{block} is not aligned");
    }
}

#[test]
fn a_requested_block_takes_exactly_its_ports_or_is_refused_whole() {
    let mut state = pool("20000-20099", StaticBand::None);
    let one = [requested(blocks("a", "w", Scope::RoleScoped, 1, 8), 20010)];
    let held = run(&one, &Holdings::new(), &mut state).unwrap();
    assert_eq!(held.block(&slot("a", "w", 0)), PortBlock::new(20010, 8));
    assert_eq!(
        state.held_ports().collect::<Vec<_>>(),
        (20010..=20017).collect::<Vec<_>>()
    );

    let before = state.clone();
    let overlapping = [requested(blocks("b", "w", Scope::RoleScoped, 1, 4), 20016)];
    let err = run(&overlapping, &Holdings::new(), &mut state).unwrap_err();
    assert_eq!(
        err.to_string(),
        "port 20016 of the requested block 20016-20019 is already held: request a block of free ports, or leave the port unset to get a free block automatically"
    );
    assert_eq!(state, before);

    let outside = [requested(blocks("b", "w", Scope::RoleScoped, 1, 4), 20098)];
    let err = run(&outside, &Holdings::new(), &mut state).unwrap_err();
    assert!(
        matches!(err, AllocError::BlockNotInPool { port: 20100, .. }),
        "{err}"
    );
    assert_eq!(state, before);

    let past_the_end = [requested(blocks("b", "w", Scope::RoleScoped, 1, 8), 65530)];
    let err = run(&past_the_end, &Holdings::new(), &mut state).unwrap_err();
    assert_eq!(
        err,
        AllocError::BlockPastEnd {
            first: 65530,
            count: 8
        }
    );
    assert_eq!(state, before);
}

#[test]
fn an_exclusion_inside_a_requested_block_refuses_it() {
    let ports = PortSet::from_ranges([PortRange {
        first: 100,
        last: 199,
    }])
    .subtract(&PortSet::from_ports([105]));
    let mut state = PoolState::new(ports, StaticBand::None);
    let err = run(
        &[requested(blocks("a", "w", Scope::RoleScoped, 1, 8), 100)],
        &Holdings::new(),
        &mut state,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "ports 100-107 are not all in the pool's ranges 100-104,106-199: port 105 is not; request a block whose ports are all inside (none excluded), or leave the port unset to get a block automatically"
    );
    assert_eq!(state.held_count(), 0);
}

#[test]
fn two_requested_blocks_sharing_a_port_are_refused() {
    let mut state = pool("100-199", StaticBand::None);
    let demands = [
        requested(blocks("a", "w", Scope::RoleScoped, 1, 8), 100),
        requested(blocks("b", "w", Scope::RoleScoped, 1, 1), 107),
    ];
    let err = run(&demands, &Holdings::new(), &mut state).unwrap_err();
    assert!(
        matches!(&err, AllocError::DuplicateRequest { port: 107, slots } if slots.len() == 2),
        "{err}"
    );
}

#[test]
fn changing_a_count_moves_only_that_ports_slots() {
    let mut state = pool("30000-30999", StaticBand::Auto);
    let before = [
        blocks("ray", "workers", Scope::PodScoped, 2, 8),
        blocks("ray", "nixl", Scope::PodScoped, 2, 4),
    ];
    let held = run(&before, &Holdings::new(), &mut state).unwrap();
    let after = [
        blocks("ray", "workers", Scope::PodScoped, 2, 16),
        blocks("ray", "nixl", Scope::PodScoped, 2, 4),
    ];
    let change = plan(&after, &held);
    assert_eq!(change.release.len(), 2);
    assert!(
        change
            .release
            .iter()
            .all(|(s, b)| s.port == "workers" && b.count == 8)
    );
    assert_eq!(change.allocate.len(), 2);
    let moved = execute(&change, &mut state, &mut rng()).unwrap();
    for index in 0..2 {
        let nixl = slot("ray", "nixl", index);
        assert_eq!(moved.block(&nixl), held.block(&nixl));
        assert_eq!(
            moved.block(&slot("ray", "workers", index)).unwrap().count,
            16
        );
    }
    assert_eq!(state.held_count(), 2 * 16 + 2 * 4);
    assert!(plan(&after, &moved).is_noop());
}

#[test]
fn a_fragmented_pool_refuses_a_block_with_its_largest_run() {
    // 100 ports; every 10th held leaves nine runs of 9 (and 9 at the end).
    let mut state = pool("1000-1099", StaticBand::None);
    for port in (1000..1100).step_by(10) {
        state.take_requested(port).unwrap();
    }
    let before = state.clone();
    let err = run(
        &[blocks("ray", "workers", Scope::PodScoped, 1, 16)],
        &Holdings::new(),
        &mut state,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "no room for a block: ray.workers[0] needs a block of 16 contiguous ports; the largest free run is 9 (90 free in 10 runs); nothing was allocated. Lower the port's count, release blocks no longer in use, or add a range to the pool (`kubectl portalloc pool describe` shows its free runs)"
    );
    assert_eq!(state, before);

    // Blocks of 9 fit, one per run; a tenth block of 9 after them does not.
    let held = run(
        &[blocks("a", "w", Scope::PodScoped, 10, 9)],
        &Holdings::new(),
        &mut state,
    )
    .unwrap();
    assert_eq!(held.port_count(), 90);
    assert_eq!(state.free_count(), 0);
}

#[test]
fn a_gap_between_ranges_breaks_a_run() {
    let mut state = pool("100-104,106-110", StaticBand::None);
    let err = run(
        &[blocks("a", "w", Scope::RoleScoped, 1, 6)],
        &Holdings::new(),
        &mut state,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            AllocError::NoRun {
                count: 6,
                runs: RunSummary {
                    free: 10,
                    runs: 2,
                    largest: 5
                },
                longest_range: 5,
                ..
            }
        ),
        "{err}"
    );
    // No deletion can make a run of 6 in ranges of 5: the message says the pool must grow.
    assert!(
        err.to_string().contains(
            "The pool must grow: its longest range of contiguous ports is 5, so deleting \
             PortAllocations cannot make room; add a range of at least 6 ports"
        ),
        "{err}"
    );
    let held = run(
        &[blocks("a", "w", Scope::PodScoped, 2, 5)],
        &Holdings::new(),
        &mut state,
    )
    .unwrap();
    let firsts: BTreeSet<u16> = held.iter().map(|(_, b)| b.first).collect();
    assert_eq!(firsts, BTreeSet::from([100, 106]));
}

#[test]
fn a_full_pool_with_blocks_says_how_its_free_ports_lie() {
    let mut state = pool("100-119", StaticBand::None);
    state.take_requested(110).unwrap();
    let err = run(
        &[blocks("a", "w", Scope::PodScoped, 3, 8)],
        &Holdings::new(),
        &mut state,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool is full: it has 20 ports, 1 in use and 19 free, but this allocation needs 24 in blocks, and the largest free run is 10 ports (2 runs); nothing was allocated. Add ranges to the pool, lower replicas, or delete PortAllocations no longer in use"
    );
}

#[test]
fn a_block_reaches_into_the_static_band_only_when_the_dynamic_band_has_no_run() {
    // Static band 100-119; dynamic 120-199 with every 8th port held: runs of 7.
    let mut state = pool("100-199", StaticBand::Count(20));
    for port in (120..200).step_by(8) {
        state.take_requested(port).unwrap();
    }
    let held = run(
        &[blocks("a", "w", Scope::RoleScoped, 1, 7)],
        &Holdings::new(),
        &mut state,
    )
    .unwrap();
    let block = held.block(&slot("a", "w", 0)).unwrap();
    assert_eq!(state.band_of(block.first), Some(Band::Dynamic), "{block}");
    let held = run(
        &[blocks("b", "w", Scope::RoleScoped, 1, 10)],
        &Holdings::new(),
        &mut state,
    )
    .unwrap();
    let block = held.block(&slot("b", "w", 0)).unwrap();
    assert!(block.last() < 120 + 8, "{block} must use the static band");
    assert_eq!(state.band_of(block.first), Some(Band::Static));
}

fn arb_pool() -> impl Strategy<Value = PoolState> {
    let ranges = prop::collection::vec((1u16..300, 0u16..60), 1..4);
    let excluded = prop::collection::vec(1u16..360, 0..6);
    let band = prop_oneof![
        Just(StaticBand::Auto),
        Just(StaticBand::None),
        (0u32..40).prop_map(StaticBand::Count),
    ];
    (ranges, excluded, band).prop_map(|(ranges, excluded, band)| {
        let ports = PortSet::from_ranges(ranges.into_iter().map(|(first, extra)| PortRange {
            first,
            last: first + extra,
        }))
        .subtract(&PortSet::from_ports(excluded));
        PoolState::new(ports, band)
    })
}

/// Whether `len` free contiguous ports exist with every index inside `indices`.
fn has_run(state: &PoolState, indices: std::ops::Range<u32>, len: u32) -> bool {
    let ports: Vec<u16> = state.ports().iter().collect();
    indices.clone().any(|start| {
        let end = start + len;
        end <= indices.end
            && (start..end).all(|i| !state.is_held(ports[i as usize]))
            && (start + 1..end).all(|i| ports[i as usize] == ports[i as usize - 1] + 1)
    })
}

proptest! {
    #[test]
    fn blocks_fill_the_dynamic_band_first_and_never_overlap(
        mut state in arb_pool(),
        squatters in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
        sizes in prop::collection::vec(1u32..20, 1..25),
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut taken: BTreeSet<u16> = BTreeSet::new();
        for index in squatters {
            if state.size() == 0 { break; }
            let port = state.ports().nth(index.index(state.size() as usize) as u32).unwrap();
            if state.take_requested(port).is_ok() {
                taken.insert(port);
            }
        }
        for (i, size) in sizes.into_iter().enumerate() {
            let bands = state.bands();
            let dynamic_run = has_run(&state, bands.dynamic_indices(), size);
            let any_run = has_run(&state, 0..bands.total, size);
            let demand = [blocks("r", "p", Scope::RoleScoped, 1, size)];
            let owner = slot("r", "p", 0);
            let before = state.clone();
            match execute(&plan(&demand, &Holdings::new()), &mut state, &mut rng) {
                Ok(held) => {
                    let block = held.block(&owner).unwrap();
                    prop_assert_eq!(u32::from(block.count), size);
                    prop_assert!(any_run, "step {}: placed {} though no run existed", i, block);
                    for port in block.ports() {
                        prop_assert!(state.contains(port), "{} leaves the pool", block);
                        prop_assert!(taken.insert(port), "port {} held twice", port);
                    }
                    let in_dynamic = block.ports().all(|p| state.band_of(p) == Some(Band::Dynamic));
                    prop_assert_eq!(in_dynamic, dynamic_run, "{} vs dynamic run {}", block, dynamic_run);
                }
                Err(_) => {
                    prop_assert!(!any_run, "step {}: refused a block of {} that fits", i, size);
                    prop_assert_eq!(&state, &before);
                }
            }
            prop_assert_eq!(state.held_ports().collect::<BTreeSet<_>>(), taken.clone());
        }
    }

    #[test]
    fn fragmentation_matches_the_free_ports(
        mut state in arb_pool(),
        held in prop::collection::vec(any::<prop::sample::Index>(), 0..60),
    ) {
        for index in held {
            if state.size() == 0 { break; }
            let port = state.ports().nth(index.index(state.size() as usize) as u32).unwrap();
            let _ = state.take_requested(port);
        }
        let frag = state.fragmentation();
        prop_assert_eq!(frag.free(), state.free_count());
        let largest = frag.largest();
        prop_assert!(largest == 0 || has_run(&state, 0..state.size(), largest));
        prop_assert!(!has_run(&state, 0..state.size(), largest + 1));
    }
}

//! Micro-benchmarks of the pure allocation core (no I/O): `cargo bench --bench core`.
//!
//! - choose-next (`PoolState::take_next`) on a 65,535-port pool at 0%, 50% and 99% full;
//! - planning (and carrying out) one PortAllocation of 1,000 pods x 4 ports;
//! - encoding and decoding a full PortPoolShard (256 ports held), as the allocator does once per
//!   attempt: `ShardRecord::write` + JSON, and JSON + `load_shard`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use portalloc::api::{PortPool, PortPoolShard, PortPoolSpec, StaticBandSetting};
use portalloc::core::{
    Holdings, PoolState, PortDemand, PortSet, Scope, SlotKey, StaticBand, execute, plan,
};
use portalloc::ledger::{CopyRecord, PoolSnapshot, ShardKey, ShardRecord, load_shard, new_shard};

const FULL_RANGE: &str = "1-65535";

fn rng() -> StdRng {
    StdRng::seed_from_u64(0x5eed)
}

fn full_pool() -> PoolState {
    PoolState::new(FULL_RANGE.parse::<PortSet>().unwrap(), StaticBand::Auto)
}

/// A 65,535-port pool with `percent`% of its ports held at uniformly random places.
fn pool_filled_randomly(percent: u32) -> PoolState {
    let mut state = full_pool();
    let mut ports: Vec<u16> = (1..=65535).collect();
    ports.shuffle(&mut rng());
    let held = ports.len() * percent as usize / 100;
    for &port in &ports[..held] {
        state.mark_held(port).unwrap();
    }
    state
}

/// 99% full with every free port in one block at the top: a scan from a random start crosses
/// up to the whole bitmap (1,024 words) before it finds one, the worst case for a choice.
fn pool_filled_with_one_gap() -> PoolState {
    let mut state = full_pool();
    let free = 65535 / 100;
    for port in 1..=(65535 - free) as u16 {
        state.mark_held(port).unwrap();
    }
    state
}

fn choose_next(c: &mut Criterion) {
    let mut group = c.benchmark_group("choose_next_65535");
    let cases = [
        ("0pct", full_pool()),
        ("50pct", pool_filled_randomly(50)),
        ("99pct", pool_filled_randomly(99)),
        ("99pct_one_gap", pool_filled_with_one_gap()),
    ];
    for (name, state) in cases {
        let mut rng = rng();
        group.bench_function(name, |b| {
            b.iter_batched_ref(
                || state.clone(),
                |state| black_box(state.take_next(&mut rng)),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// One role of 1,000 pods with 4 PodScoped ports each: 4,000 slots.
fn demands_1000x4() -> Vec<PortDemand> {
    ["http", "rpc", "bootstrap", "metrics"]
        .into_iter()
        .map(|port| PortDemand {
            role: "worker".into(),
            port: port.into(),
            scope: Scope::PodScoped,
            replicas: 1000,
            requested: None,
            count: 1,
        })
        .collect()
}

fn planning(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_1000_pods_x_4_ports");
    let demands = demands_1000x4();
    let empty = Holdings::new();
    let pool = full_pool();
    let held = execute(&plan(&demands, &empty), &mut pool.clone(), &mut rng()).unwrap();
    assert_eq!(held.len(), 4000);
    group.throughput(Throughput::Elements(4000));
    group.bench_function("plan", |b| {
        b.iter(|| black_box(plan(black_box(&demands), &empty)))
    });
    let mut rng = rng();
    group.bench_function("plan_and_execute", |b| {
        b.iter_batched_ref(
            || pool.clone(),
            |state| black_box(execute(&plan(&demands, &empty), state, &mut rng).unwrap()),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("replan_unchanged", |b| {
        b.iter(|| black_box(plan(black_box(&demands), &held).is_noop()))
    });
    group.finish();
}

/// Window 1 (256-511) of pool `bench` as a shard listing `256 / ports_each` PortAllocations
/// (the most one shard holds), each holding `ports_each` ports of one pod (`worker.p0=..`), with
/// real-looking UIDs and owners.
fn full_shard(ports_each: u32) -> (PoolSnapshot, PortPoolShard) {
    let mut pool = PortPool::new(
        "bench",
        PortPoolSpec {
            ranges: vec!["256-511".into()],
            exclude: vec![],
            protocol: Default::default(),
            static_band: StaticBandSetting::None,
            node_reuse: None,
            follow_nodes: None,
            guard: None,
            allow_overlap: false,
        },
    );
    pool.metadata.uid = Some("5f0c8c2e-0000-4000-8000-000000000001".into());
    pool.metadata.generation = Some(1);
    let copy = PoolSnapshot::of_pool(&pool);
    let mut ports: Vec<u16> = (256..=511).collect();
    ports.shuffle(&mut rng());
    let mut next = ports.into_iter();
    let mut sharded = CopyRecord::load(copy.clone(), vec![]).unwrap();
    for i in 0..256 / ports_each {
        let holdings: Holdings = (0..ports_each)
            .map(|p| {
                (
                    SlotKey::new("worker", format!("p{p}"), 0),
                    next.next().unwrap(),
                )
            })
            .collect();
        let uid = format!("{:08x}-7c1e-4f2a-9b3d-{:012x}", i, u64::from(i) * 7919);
        sharded.set(&uid, &format!("team-{:02}/job-{i:05}", i % 50), &holdings);
    }
    let write = sharded.writes(false).remove(0);
    let mut shard = new_shard(&copy, ShardKey::first(1));
    shard.metadata.resource_version = Some("123456".into());
    shard.status = Some(write.status);
    (copy, shard)
}

fn shard_status(c: &mut Criterion) {
    let mut group = c.benchmark_group("full_shard_status");
    for ports_each in [1, 4] {
        let (copy, shard) = full_shard(ports_each);
        let object_json = serde_json::to_vec(&shard).unwrap();
        eprintln!(
            "a full shard, {} holders x {ports_each} port(s): {} bytes of JSON",
            256 / ports_each,
            object_json.len()
        );
        group.throughput(Throughput::Bytes(object_json.len() as u64));
        let layout = copy.layout().unwrap();

        // What a write does: change one holder of what was read, re-encode, serialize.
        let record = load_shard(&copy, &layout, 1, shard.clone());
        let uid = record.entries()[0].uid.clone();
        let mine = record.holdings_of(&uid);
        group.bench_function(format!("encode_{ports_each}_port_each"), |b| {
            b.iter(|| {
                let mut changed = ShardRecord::new(ShardKey::first(1), record.clone());
                changed.set(&uid, "ns/new", &mine);
                let mut updated = shard.clone();
                updated.status = Some(changed.write(&copy, false).status);
                black_box(serde_json::to_vec(&updated).unwrap())
            })
        });
        // What a read does: parse the object and rebuild the bitmap and every holder's holdings.
        group.bench_function(format!("decode_{ports_each}_port_each"), |b| {
            b.iter(|| {
                let shard: PortPoolShard = serde_json::from_slice(black_box(&object_json)).unwrap();
                black_box(load_shard(&copy, &layout, 1, shard))
            })
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = choose_next, planning, shard_status
}
criterion_main!(benches);

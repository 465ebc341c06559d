//! How full a pool gets before it refuses, under each placement, replaying allocations and
//! deletions through the planner (no API server): `cargo bench --bench placement`
//! (`-- --quick` or `PORTALLOC_BENCH_QUICK=1` for 20 seeds instead of 200, `-- --seeds N` for N).
//!
//! - vLLM-Ray: copies of `examples/vllm-ray-lws.yaml`'s PortAllocation (428 ports, six blocks of
//!   64) into its pool (3,998 ports) until one is refused; then rounds of "delete 3 random
//!   copies, create 3".
//! - Random mix: PortAllocations of 1-12 single ports and 0-3 blocks of 8, 16, 32 or 64 into an
//!   empty 4,096-port pool until one is refused; delete a random half, refill until refused.
//! - Random mix through the shards: the same, decided as a cluster decides it (the ledger's
//!   whole decision over a 4,096-port pool's 256-port windows: home window first, the whole pool
//!   when it cannot take an object or would put a block of 16 or more into a loose run; blocks
//!   of 128 or more toward the pool's high end, the rest toward its low end), packed placement
//!   only.
//! - Large blocks through the shards: one block of 16-256 ports per object (powers of two, or
//!   uniform), and 1-12 single ports with 0-3 such blocks, into the same 4,096-port pool; and
//!   the one-block mixes into one record without windows, the packer's own limit (reference).
//!   Also how many one-block objects were refused while a free run of the pool held them
//!   (the refusal rule says none); and, for each mix through the shards, the most any
//!   placement of the same objects could reach in the empty pool, and any placement of the
//!   refill from the holes the deletions left (holders never move: see `refill_bound`), so a
//!   seed under 90 % shows whether its placement or its objects and holes are to blame; and
//!   how many static-band ports are still free at the refill's refusal (the bound counts them
//!   as any port, placement may use them only when the dynamic band has no run, KEP-3668).
//! - Collisions: at ~50 % occupancy (random mix, reached with that placement), the chance that
//!   two clients planning the same PortAllocation from one read, each with its own random
//!   generator, choose overlapping ports.

use std::collections::BTreeSet;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::Deserialize;

use portalloc::api::{
    PortAllocation, PortAllocationSpec, PortPool, PortPoolSpec, PortRequest, PortScope as ApiScope,
    Role, StaticBandSetting,
};
use portalloc::core::{
    Holdings, Placement, PoolState, PortDemand, Scope, StaticBand, execute, plan,
};
use portalloc::ledger::{
    BatchItem, ItemOutcome, Operation, PoolRecord, PoolSnapshot, ShardKey, home_shard, owner_of,
    preview,
};

const PLACEMENTS: [(&str, Placement); 2] = [
    ("old (scattered)", Placement::Scattered),
    ("new (packed)", Placement::Packed),
];
/// Draws one PortAllocation of a mix, named `name`.
type MakeAllocation = fn(&mut StdRng, &str) -> PortAllocation;

const CHURN_ROUNDS: usize = 5;
/// Refusals, through the shards, of a one-block object that a free run of the pool could hold.
static ROOMY_REFUSALS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const PAIRS_PER_SEED: u64 = 50;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("PORTALLOC_BENCH_QUICK").is_ok_and(|v| v == "1");
    let seeds: u64 = args
        .iter()
        .position(|a| a == "--seeds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(if quick { 20 } else { 200 });
    let started = Instant::now();
    let (pool, copy) = vllm_example();
    println!(
        "placement benchmark: {seeds} seeds{}; vLLM-Ray copy = {} ports into {} ports; random mix into 4096 ports",
        if quick { " (quick)" } else { "" },
        ports_of(&copy),
        pool.size()
    );
    println!();
    println!(
        "| scenario | placement | first refusal: min / median occupancy | after churn: min / median occupancy |"
    );
    println!("|---|---|---|---|");
    for (name, placement) in PLACEMENTS {
        let runs: Vec<Vllm> = (0..seeds)
            .map(|seed| vllm_run(&pool, &copy, placement, seed))
            .collect();
        let copies: Vec<f64> = runs.iter().map(|r| r.copies as f64).collect();
        let first: Vec<f64> = runs.iter().map(|r| r.occupancy).collect();
        let refits = runs.iter().map(|r| r.refits).sum::<usize>();
        println!(
            "| vLLM-Ray | {name} | {} (copies {:.0} / {:.0}) | delete 3, create 3: {refits} of {} rounds fit |",
            min_median(&first),
            min(&copies),
            median(&copies),
            runs.len() * CHURN_ROUNDS
        );
    }
    for (name, placement) in PLACEMENTS {
        let runs: Vec<(f64, f64)> = (0..seeds).map(|seed| mix_run(placement, seed)).collect();
        let first: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let again: Vec<f64> = runs.iter().map(|r| r.1).collect();
        println!(
            "| random mix | {name} | {} | delete half, refill: {} |",
            min_median_bar(&first),
            min_median_bar(&again)
        );
    }
    let shapes: [(&str, &str, MakeAllocation); 4] = [
        (
            "random mix",
            "new (packed): home window first (blocks only into a tight run there; blocks of 128+ toward the high end, the rest toward the low end), else the tightest fit of the whole pool",
            mix_allocation,
        ),
        (
            "one block per object, blocks of 16, 32, 64, 128 or 256",
            "new (packed)",
            power_of_two_block,
        ),
        (
            "one block per object, blocks of 16-256 (uniform)",
            "new (packed)",
            uniform_block,
        ),
        (
            "1-12 single ports and 0-3 blocks of 16-256 per object",
            "new (packed)",
            singles_and_large_blocks,
        ),
    ];
    for (shape, placement, make) in shapes {
        let runs: Vec<Sharded> = (0..seeds).map(|seed| sharded_run(seed, make)).collect();
        let first: Vec<f64> = runs.iter().map(|r| r.first).collect();
        let again: Vec<f64> = runs.iter().map(|r| r.again).collect();
        let first_bound: Vec<f64> = runs.iter().map(|r| r.first_bound).collect();
        let bound: Vec<f64> = runs.iter().map(|r| r.bound).collect();
        let static_free = runs.iter().map(|r| f64::from(r.static_free)).sum::<f64>() / seeds as f64;
        let rescued = runs
            .iter()
            .filter(|r| r.again < 90.0 && r.again + r.static_free_pct >= 90.0)
            .count();
        println!(
            "| {shape}, through the 256-port shards | {placement} | {} (no placement beyond {}) | delete half, refill: {} (no refill from the same holes beyond {}; static band free at the refusal: {static_free:.0} of {} ports on average, and in {rescued} of the seeds under 90 % those free ports alone are the difference) |",
            min_median_bar(&first),
            min_median_bar(&first_bound),
            min_median_bar(&again),
            min_median_bar(&bound),
            runs.first().map_or(0, |r| r.static_size),
        );
    }
    // The packer alone, over one 4,096-port record with no windows: what the shards are held to.
    for (shape, pow2) in [
        ("16, 32, 64, 128 or 256", true),
        ("16-256 (uniform)", false),
    ] {
        let runs: Vec<(f64, f64)> = (0..seeds)
            .map(|seed| one_record_blocks(seed, pow2))
            .collect();
        let first: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let again: Vec<f64> = runs.iter().map(|r| r.1).collect();
        println!(
            "| one block per object, blocks of {shape}, one record without windows (reference) | new (packed) | {} | delete half, refill: {} |",
            min_median_bar(&first),
            min_median_bar(&again)
        );
    }
    println!();
    println!(
        "one-block objects refused through the shards while a free run of the pool could hold them: {}",
        ROOMY_REFUSALS.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!();
    println!(
        "| two clients, one read of a ~50 % pool | placement | same single port | overlapping blocks of 8 | of 64 | overlapping random-mix allocations |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, placement) in PLACEMENTS {
        let (p, at) = collisions(placement, seeds);
        let p = p.map(|p| p * 100.0);
        println!(
            "| collision chance (pool {at:.0} % full) | {name} | {:.2} % | {:.2} % | {:.2} % | {:.2} % |",
            p[0], p[1], p[2], p[3]
        );
    }
    println!();
    println!("took {:.1} s", started.elapsed().as_secs_f64());
}

/// The example's pool and one copy's demands, read from the example itself.
fn vllm_example() -> (PoolState, Vec<PortDemand>) {
    let text = include_str!("../examples/vllm-ray-lws.yaml");
    let mut pool = None;
    let mut copy = None;
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(doc).unwrap();
        match value.get("kind").and_then(|k| k.as_str()) {
            Some("PortPool") => pool = Some(serde_yaml::from_value::<PortPool>(value).unwrap()),
            Some("PortAllocation") => {
                let pa = serde_yaml::from_value::<PortAllocation>(value).unwrap();
                copy = Some(pa.spec.demands().unwrap());
            }
            _ => {}
        }
    }
    let spec = pool.unwrap().spec;
    let state = PoolState::new(spec.port_set().unwrap(), spec.core_static_band());
    (state, copy.unwrap())
}

fn ports_of(demands: &[PortDemand]) -> u32 {
    demands
        .iter()
        .map(|d| d.slot_count() * d.count.max(1))
        .sum()
}

fn add(state: &mut PoolState, demands: &[PortDemand], rng: &mut StdRng) -> Option<Holdings> {
    execute(&plan(demands, &Holdings::new()), state, rng).ok()
}

fn remove(state: &mut PoolState, holdings: &Holdings) {
    for (_, block) in holdings.iter() {
        state.release_block(block);
    }
}

fn occupancy(state: &PoolState) -> f64 {
    f64::from(state.held_count()) * 100.0 / f64::from(state.size())
}

struct Vllm {
    copies: usize,
    occupancy: f64,
    refits: usize,
}

fn vllm_run(pool: &PoolState, copy: &[PortDemand], placement: Placement, seed: u64) -> Vllm {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut state = pool.clone().with_placement(placement);
    let mut copies = Vec::new();
    while let Some(held) = add(&mut state, copy, &mut rng) {
        copies.push(held);
    }
    let (count, at) = (copies.len(), occupancy(&state));
    let mut refits = 0;
    for _ in 0..CHURN_ROUNDS {
        copies.shuffle(&mut rng);
        for gone in copies.split_off(copies.len().saturating_sub(3)) {
            remove(&mut state, &gone);
        }
        let new: Vec<Holdings> = (0..3)
            .filter_map(|_| add(&mut state, copy, &mut rng))
            .collect();
        refits += usize::from(new.len() == 3);
        copies.extend(new);
    }
    Vllm {
        copies: count,
        occupancy: at,
        refits,
    }
}

fn mix_pool(placement: Placement) -> PoolState {
    PoolState::new("30000-34095".parse().unwrap(), StaticBand::Auto).with_placement(placement)
}

/// One PortAllocation of the random mix: 1-12 single ports, 0-3 blocks of 8, 16, 32 or 64.
fn random_mix(rng: &mut StdRng) -> Vec<PortDemand> {
    let singles = rng.random_range(1..=12);
    let blocks = rng.random_range(0..=3);
    let mut demands: Vec<PortDemand> = (0..singles).map(|i| demand(format!("s{i}"), 1)).collect();
    for i in 0..blocks {
        let count = *[8, 16, 32, 64].choose(rng).unwrap();
        demands.push(demand(format!("b{i}"), count));
    }
    demands
}

/// Adds random-mix allocations until the first refusal.
fn fill(state: &mut PoolState, owners: &mut Vec<Holdings>, rng: &mut StdRng) {
    while let Some(held) = add(state, &random_mix(rng), rng) {
        owners.push(held);
    }
}

/// Occupancy at the first refusal, and again after deleting a random half and refilling.
fn mix_run(placement: Placement, seed: u64) -> (f64, f64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut state = mix_pool(placement);
    let mut owners = Vec::new();
    fill(&mut state, &mut owners, &mut rng);
    let first = occupancy(&state);
    owners.shuffle(&mut rng);
    for gone in owners.split_off(owners.len() / 2) {
        remove(&mut state, &gone);
    }
    fill(&mut state, &mut owners, &mut rng);
    (first, occupancy(&state))
}

/// Chances that two clients, each with its own random generator, planning from one read of a
/// ~50 % full pool (or the first refusal, if earlier), choose overlapping ports: for a
/// PortAllocation of one single port, of one block of 8, of one block of 64, and of one
/// random-mix PortAllocation. Also the mean occupancy they were measured at.
fn collisions(placement: Placement, seeds: u64) -> ([f64; 4], f64) {
    let mut hits = [0u64; 4];
    let mut at = 0.0;
    for seed in 0..seeds {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut state = mix_pool(placement);
        while occupancy(&state) < 50.0 {
            if add(&mut state, &random_mix(&mut rng), &mut rng).is_none() {
                break;
            }
        }
        at += occupancy(&state) / seeds as f64;
        let shapes = [1, 8, 64].map(|count| vec![demand("p".into(), count)]);
        let shapes = shapes.into_iter().chain([random_mix(&mut rng)]);
        for (i, demands) in shapes.enumerate() {
            for pair in 0..PAIRS_PER_SEED {
                let mut a = StdRng::seed_from_u64(seed << 32 | pair << 1);
                let mut b = StdRng::seed_from_u64(seed << 32 | pair << 1 | 1);
                let x = add(&mut state.clone(), &demands, &mut a);
                let y = add(&mut state.clone(), &demands, &mut b);
                if let (Some(x), Some(y)) = (x, y) {
                    let theirs: BTreeSet<u16> = y.ports().collect();
                    hits[i] += u64::from(x.ports().any(|p| theirs.contains(&p)));
                }
            }
        }
    }
    (hits.map(|h| h as f64 / (seeds * PAIRS_PER_SEED) as f64), at)
}

/// One automatic block of `count` ports (a single port when 1) named `port`.
fn demand(port: String, count: u32) -> PortDemand {
    PortDemand {
        role: "app".into(),
        port,
        scope: Scope::RoleScoped,
        replicas: 1,
        requested: None,
        count,
    }
}

fn min(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// "95.9 % / 99.2 %".
fn min_median(values: &[f64]) -> String {
    format!("{:.1} % / {:.1} %", min(values), median(values))
}

/// "95.9 % / 99.2 %", and how many seeds stopped under 90 % (the bar).
fn min_median_bar(values: &[f64]) -> String {
    let under = values.iter().filter(|&&v| v < 90.0).count();
    format!("{}, {under} under 90 %", min_median(values))
}

/// One random-mix PortAllocation (its demands as RoleScoped ports of one role), for the ledger.
fn mix_allocation(rng: &mut StdRng, name: &str) -> PortAllocation {
    let ports = random_mix(rng)
        .into_iter()
        .map(|d| PortRequest {
            env: d.port.to_uppercase(),
            name: d.port,
            scope: ApiScope::RoleScoped,
            count: (d.count > 1).then_some(d.count as i32),
            ..Default::default()
        })
        .collect();
    allocation(name, ports)
}

/// PortAllocation `mix/<name>` (UID `name`) of one role with `ports`, in pool `mix`.
fn allocation(name: &str, ports: Vec<PortRequest>) -> PortAllocation {
    let mut pa = PortAllocation::new(
        name,
        PortAllocationSpec {
            pool: "mix".into(),
            roles: vec![Role {
                name: "app".into(),
                replicas: 1,
                ports,
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    pa.metadata.namespace = Some("mix".into());
    pa.metadata.uid = Some(name.into());
    pa
}

/// One PortAllocation asking for one automatic block of `count` ports.
fn block_allocation(name: &str, count: u32) -> PortAllocation {
    let port = PortRequest {
        name: "block".into(),
        env: "BLOCK".into(),
        scope: ApiScope::RoleScoped,
        count: Some(count as i32),
        ..Default::default()
    };
    allocation(name, vec![port])
}

/// Block sizes of the block mix: the five powers of two from 16 to 256, each as likely (what
/// workloads ask for: 16 GPUs' worth of NCCL ports, 64 Ray worker ports, ...).
fn power_of_two_block(rng: &mut StdRng, name: &str) -> PortAllocation {
    block_allocation(name, *[16, 32, 64, 128, 256].choose(rng).unwrap())
}

/// Block sizes of the block mix: any size from 16 to 256, each as likely.
fn uniform_block(rng: &mut StdRng, name: &str) -> PortAllocation {
    block_allocation(name, rng.random_range(16..=256))
}

/// Objects from `make` into an empty 4,096-port pool (KEP-3668 static band) until the first
/// refusal, through the ledger's per-window decisions (each object decided as `create -f`
/// decides it: its home window, else elsewhere; deletions as `delete` does); then a random half
/// deleted and a refill until the next refusal. The occupancy at both refusals.
fn sharded_run(seed: u64, make: MakeAllocation) -> Sharded {
    let mut pool = PortPool::new(
        "mix",
        PortPoolSpec {
            ranges: vec!["30000-34095".into()],
            exclude: Vec::new(),
            protocol: Default::default(),
            // As mix_pool: the KEP-3668 split, automatic ports in the upper band first.
            static_band: StaticBandSetting::Auto,
            node_reuse: None,
            follow_nodes: None,
            guard: None,
            allow_overlap: false,
        },
    );
    pool.metadata.uid = Some("mix-uid".into());
    pool.metadata.generation = Some(1);
    let mut record = PoolRecord::load(PoolSnapshot::of_pool(&pool), Vec::new()).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut live: Vec<String> = Vec::new();
    let mut next = 0;
    // The blocks of each object drawn, in order.
    let mut drawn: Vec<Vec<u32>> = Vec::new();
    let mut fill = |record: &mut PoolRecord,
                    rng: &mut StdRng,
                    live: &mut Vec<String>,
                    drawn: &mut Vec<Vec<u32>>| loop {
        let name = format!("mix-{next}");
        next += 1;
        let pa = make(rng, &name);
        drawn.push(block_counts(&pa));
        let owner = owner_of(&pa);
        let item = BatchItem {
            known: home_shard(&record.layout, &owner)
                .map(ShardKey::first)
                .into_iter()
                .collect(),
            uid: name.clone(),
            owner,
            operation: Operation::sync_of(&pa),
        };
        let out = preview(record, &item, rng);
        if matches!(out.outcome, ItemOutcome::Refused { .. }) {
            let state = record.first().union_record().state;
            // An object of one block refused while a free run of the pool holds it.
            if let [only] = &pa.spec.roles[0].ports[..] {
                let count = only.count.unwrap_or(1) as u32;
                if state.fragmentation().largest() >= count {
                    ROOMY_REFUSALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            return f64::from(state.held_count()) / f64::from(state.size()) * 100.0;
        }
        live.push(name);
    };
    let empty = record.first().union_record().state;
    let first = fill(&mut record, &mut rng, &mut live, &mut drawn);
    let first_count = drawn.len();
    // The same objects, then more drawn from a copy of the generator (the run goes on as if
    // no bound were worked out).
    let mut filled = drawn.clone();
    let mut more = rng.clone();
    filled.extend(more_objects(make, &mut more));
    let first_bound = refill_bound(&empty, &filled);
    live.shuffle(&mut rng);
    for gone in live.split_off(live.len() / 2) {
        let item = BatchItem {
            owner: format!("mix/{gone}"),
            uid: gone,
            operation: Ok(Operation::Remove),
            known: Default::default(),
        };
        preview(&mut record, &item, &mut rng);
    }
    let holes = record.first().union_record().state;
    let again = fill(&mut record, &mut rng, &mut live, &mut drawn);
    let at_refusal = record.first().union_record().state;
    let statics = at_refusal.static_usage();
    let mut refill = drawn.split_off(first_count);
    refill.extend(more_objects(make, &mut rng));
    Sharded {
        first,
        first_bound,
        again,
        bound: refill_bound(&holes, &refill),
        static_free: statics.free(),
        static_free_pct: f64::from(statics.free()) * 100.0 / f64::from(at_refusal.size()),
        static_size: statics.size,
    }
}

/// The blocks of 1,000 more objects from `make`, for a bound to look past a refusal.
fn more_objects(make: MakeAllocation, rng: &mut StdRng) -> Vec<Vec<u32>> {
    (0..1000)
        .map(|i| block_counts(&make(rng, &format!("more-{i}"))))
        .collect()
}

/// Occupancy at the first refusal and the most any placement of the same objects into the
/// empty pool could reach; at the refill's refusal, and the most any refill from the same
/// holes could reach ([`refill_bound`]); the static band's free ports then.
struct Sharded {
    first: f64,
    first_bound: f64,
    again: f64,
    bound: f64,
    /// Static-band ports free at the refill's refusal (automatic blocks take them only when
    /// the dynamic band has no run for them, KEP-3668; the bound counts them as any), in ports
    /// and in % of the pool, and the band's size.
    static_free: u32,
    static_free_pct: f64,
    static_size: u32,
}

/// The blocks one object asks for (a single port counts as a block of one).
fn block_counts(pa: &PortAllocation) -> Vec<u32> {
    let ports = pa.spec.roles.iter().flat_map(|role| &role.ports);
    ports.map(|p| p.count.unwrap_or(1).max(1) as u32).collect()
}

/// The highest occupancy any placement of the refill could reach from the holes churn left in
/// `holes`, objects arriving as `refill`: holders never move, and a block of `s` ports or more
/// takes at least one of the `fits(s)` places for `s` ports the holes offer, so the refill
/// stops at the first object whose blocks of `s` or more outnumber them, for some `s` (or
/// that outgrows the free ports).
fn refill_bound(holes: &PoolState, refill: &[Vec<u32>]) -> f64 {
    let runs = holes.fragmentation();
    let mut held = holes.held_count();
    let mut blocks: Vec<u32> = Vec::new();
    for object in refill {
        blocks.extend(object.iter().copied().filter(|&c| c > 1));
        let over = blocks.iter().any(|&size| {
            let longer = blocks.iter().filter(|&&c| c >= size).count() as u32;
            longer > runs.fits(size)
        });
        if over || held + object.iter().sum::<u32>() > holes.size() {
            break;
        }
        held += object.iter().sum::<u32>();
    }
    f64::from(held) * 100.0 / f64::from(holes.size())
}

/// One automatic block per object (16-256 ports: powers of two, or uniform) into one 4,096-port
/// record through the planner, until refused; then a random half deleted and a refill.
fn one_record_blocks(seed: u64, pow2: bool) -> (f64, f64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut state = mix_pool(Placement::Packed);
    let mut owners = Vec::new();
    let size = |rng: &mut StdRng| {
        if pow2 {
            *[16, 32, 64, 128, 256].choose(rng).unwrap()
        } else {
            rng.random_range(16..=256)
        }
    };
    loop {
        let d = vec![demand("b".into(), size(&mut rng))];
        match add(&mut state, &d, &mut rng) {
            Some(h) => owners.push(h),
            None => break,
        }
    }
    let first = occupancy(&state);
    owners.shuffle(&mut rng);
    for gone in owners.split_off(owners.len() / 2) {
        remove(&mut state, &gone);
    }
    loop {
        let d = vec![demand("b".into(), size(&mut rng))];
        match add(&mut state, &d, &mut rng) {
            Some(h) => owners.push(h),
            None => break,
        }
    }
    (first, occupancy(&state))
}

/// 1-12 single ports and 0-3 blocks of 16, 32, 64, 128 or 256 ports, in one role.
fn singles_and_large_blocks(rng: &mut StdRng, name: &str) -> PortAllocation {
    let singles = rng.random_range(1..=12);
    let blocks = rng.random_range(0..=3);
    let mut ports: Vec<PortRequest> = (0..singles)
        .map(|i| PortRequest {
            env: format!("S{i}"),
            name: format!("s{i}"),
            scope: ApiScope::RoleScoped,
            ..Default::default()
        })
        .collect();
    for i in 0..blocks {
        let count = *[16, 32, 64, 128, 256].choose(rng).unwrap();
        ports.push(PortRequest {
            env: format!("B{i}"),
            name: format!("b{i}"),
            scope: ApiScope::RoleScoped,
            count: Some(count),
            ..Default::default()
        });
    }
    allocation(name, ports)
}

//! The group commit's decision at the envelope, with no API server: `cargo bench --bench decision`
//! (`-- --owners N` for another count). 15,000 PortAllocations × one role of 10 replicas × 5
//! PodScoped ports into an empty 27,000-port pool with `nodeReuse: 32`, decided as
//! `sync --all -A` decides them (cell 2s): pass 1 within each owner's known shards, its writes
//! taken as committed, then pass 2 for the rest. Prints each pass's time, its writes and the
//! statuses it widens, so a change to the decision shows its cost on one thread.

use std::time::Instant;

// The CLI's own allocator (jemalloc, pages handed back at once): the decision's churn of small
// strings and maps costs what it costs in `kubectl portalloc`, not what glibc's malloc would.
#[cfg(target_os = "linux")]
#[path = "../src/allocator.rs"]
mod allocator;

use rand::SeedableRng;
use rand::rngs::StdRng;

use portalloc::api::{
    PortAllocation, PortAllocationSpec, PortPool, PortPoolShard, PortPoolSpec, PortRequest,
    PortScope, Role, StaticBandSetting,
};
use portalloc::ledger::{
    BatchItem, BatchSteps, Operation, Pass, PoolRecord, PoolSnapshot, ShardWrite,
    decide_pool_batch, known_shards, new_shard, owner_of, step_ends,
};

const REPLICAS: i32 = 10;
const PORTS_PER_POD: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let owners = args
        .iter()
        .position(|a| a == "--owners")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(15_000usize);
    let pool = reuse_pool();
    let snapshot = PoolSnapshot::of_pool(&pool);
    let mut record = PoolRecord::load(snapshot, vec![]).expect("a valid pool");
    let allocations: Vec<PortAllocation> = (0..owners).map(allocation).collect();
    let items: Vec<BatchItem> = allocations
        .iter()
        .map(|pa| {
            let owner = owner_of(pa);
            BatchItem {
                uid: pa.metadata.uid.clone().unwrap_or_default(),
                known: known_shards(None, &record.layout, &owner),
                owner,
                operation: Operation::sync_of(pa),
            }
        })
        .collect();
    println!(
        "decision: {owners} PortAllocations x {REPLICAS} pods x {PORTS_PER_POD} PodScoped ports, \
         27,000-port pool, nodeReuse 32"
    );
    let mut rng = StdRng::seed_from_u64(45);
    let started = Instant::now();
    let first = decide_pool_batch(&record, &items, Pass::WithinKnown, true, &mut rng);
    let first_time = started.elapsed();
    let mut version = 0;
    commit(&mut record, &first.writes, &mut version);
    let rest: Vec<BatchItem> = first
        .outcomes
        .iter()
        .zip(&items)
        .filter(|(outcome, _)| outcome.is_none())
        .map(|(_, item)| item.clone())
        .collect();
    let started = Instant::now();
    let second = decide_pool_batch(&record, &rest, Pass::Anywhere, false, &mut rng);
    let second_time = started.elapsed();
    let decided = second.outcomes.iter().filter(|o| o.is_some()).count();
    println!(
        "pass 1: {:.2} s, {} decided, {} shard writes",
        first_time.as_secs_f64(),
        items.len() - rest.len(),
        first.writes.len()
    );
    println!(
        "pass 2: {:.2} s, {decided} of {} decided, {} widened, {} shard writes",
        second_time.as_secs_f64(),
        rest.len(),
        second.widen.len(),
        second.writes.len()
    );

    // The same pass 2 in steps, as `sync --all` commits it: each step's writes can go while
    // the next is decided, at the price of writing again a shard two steps change.
    let mut rng = StdRng::seed_from_u64(45);
    let started = Instant::now();
    let homes = vec![None; rest.len()];
    let mut steps = BatchSteps::new(&record, &rest, (Pass::Anywhere, &homes));
    let (mut first_step, mut writes, mut count) = (None, 0, 0);
    for end in step_ends(rest.len()) {
        steps.decide_to(end, &mut rng, |_, _| {});
        writes += steps.step(false).writes.len();
        count += 1;
        first_step.get_or_insert(started.elapsed());
    }
    println!(
        "pass 2 in {count} steps: {:.2} s, the first step's writes ready after {:.2} s, {writes} \
         shard writes",
        started.elapsed().as_secs_f64(),
        first_step.unwrap_or_default().as_secs_f64(),
    );
}

/// `writes` as the API server would return them: each shard at a new version.
fn commit(record: &mut PoolRecord, writes: &[ShardWrite], version: &mut u64) {
    for write in writes {
        let mut shard: PortPoolShard = new_shard(&record.pool, write.key);
        *version += 1;
        shard.metadata.name = Some(write.name.clone());
        shard.metadata.resource_version = Some(format!("w{version}"));
        shard.status = Some(write.status.clone());
        record.replace(shard);
    }
}

fn reuse_pool() -> PortPool {
    let mut pool = PortPool::new(
        "envelope",
        PortPoolSpec {
            ranges: vec!["10000-36999".into()],
            exclude: vec![],
            protocol: Default::default(),
            static_band: StaticBandSetting::Auto,
            node_reuse: Some(32),
            guard: None,
            allow_overlap: false,
            follow_nodes: None,
        },
    );
    pool.metadata.uid = Some("pool-uid".into());
    pool.metadata.generation = Some(1);
    pool
}

/// PortAllocation `job-NNNNN` in namespace `envelope`: one role of 10 pods, 5 PodScoped ports.
fn allocation(i: usize) -> PortAllocation {
    let name = format!("job-{i:05}");
    let ports = (0..PORTS_PER_POD)
        .map(|p| PortRequest {
            name: format!("port-{p}"),
            scope: PortScope::PodScoped,
            env: format!("PORT_{p}"),
            port: None,
            count: None,
            ..Default::default()
        })
        .collect();
    let mut pa = PortAllocation::new(
        &name,
        PortAllocationSpec {
            pool: "envelope".into(),
            roles: vec![Role {
                name: "worker".into(),
                replicas: REPLICAS,
                ports,
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    pa.metadata.namespace = Some("envelope".into());
    pa.metadata.uid = Some(name);
    pa.metadata.generation = Some(1);
    pa
}

//! 2k: one pool holding every port of 1-65535, each by its own one-port holder.
//!
//! The holders are written as the ledger cuts them into shards (`CopyRecord::set`, one write
//! per window), then measured as served: bytes per held port, the largest shard.
//! Then one more allocation, through the library as `create` does it: refused while every port
//! is held, and placed once one port per shard is freed (each new owner's home shard then has
//! a free port, the case every allocation meets in a pool that is not full).

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use futures::{StreamExt, stream};
use kube::Client;
use kube::api::{Api, PostParams};
use portalloc::api::{PoolHolder, PortAllocation, PortPool};
use portalloc::core::Holdings;
use portalloc::k8s::{Allocator, ShardStore};
use portalloc::ledger::{CopyRecord, PoolSnapshot};

use super::{Row, dash, workload};

const POOL: &str = "full-1-65535";
const NS: &str = "full-pool";

fn holder(port: u32) -> PoolHolder {
    PoolHolder {
        uid: format!("{port:08x}-7c1e-4f2a-9b3d-{:012x}", u64::from(port) * 7919),
        owner: format!("team-{:02}/job-{port:05}", port % 50),
        ports: format!("worker.p0={port}"),
    }
}

/// Write the shards of `pool` as its record would be with exactly `holders`, 16 at a time.
async fn write_shards(
    store: &ShardStore,
    pool: &PortPool,
    holders: Vec<PoolHolder>,
) -> anyhow::Result<()> {
    let copy = PoolSnapshot::of_pool(pool);
    let existing = store.list(POOL).await.map_err(|(e, _)| e)?;
    let mut record = CopyRecord::load(copy.clone(), existing)?;
    let kept: std::collections::BTreeSet<&str> = holders.iter().map(|h| h.uid.as_str()).collect();
    let gone: Vec<(String, String)> = record
        .shards
        .values()
        .flat_map(|s| s.record.holders.iter())
        .filter(|(uid, _)| !kept.contains(uid.as_str()))
        .map(|(uid, entry)| (uid.clone(), entry.owner.clone()))
        .collect();
    for (uid, owner) in gone {
        record.set(&uid, &owner, &Holdings::new());
    }
    for holder in &holders {
        record.set(
            &holder.uid,
            &holder.owner,
            &Holdings::decode(&holder.ports)?,
        );
    }
    let writes = record.writes(false);
    let commits: Vec<_> = writes
        .into_iter()
        .map(|write| {
            let (store, copy) = (store.clone(), copy.clone());
            async move {
                store
                    .commit(&copy, &write)
                    .await
                    .map(|_| ())
                    .map_err(|(e, _)| anyhow::anyhow!("shard {}: {e}", write.name))
            }
        })
        .collect();
    let results: Vec<anyhow::Result<()>> =
        stream::iter(commits).buffer_unordered(16).collect().await;
    results.into_iter().collect()
}

/// One 1-port allocation as `create` makes it: the object, then the allocator.
async fn allocate_one(
    allocator: &Allocator,
    api: &Api<PortAllocation>,
    name: &str,
) -> (Duration, Result<(), String>) {
    let pa = workload::allocation(name, NS, POOL, 1, 1);
    let started = Instant::now();
    let result = match api.create(&PostParams::default(), &pa).await {
        Ok(created) => allocator
            .sync(created)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    (started.elapsed(), result)
}

pub async fn measure(admin: &Client, quick: bool) -> anyhow::Result<Vec<Row>> {
    let last: u32 = if quick { 4_095 } else { 65_535 };
    workload::create_namespace(admin, NS).await?;
    let pool = PortPool::new(
        POOL,
        portalloc::api::PortPoolSpec {
            ranges: vec![format!("1-{last}").as_str().into()],
            exclude: vec![],
            protocol: Default::default(),
            static_band: portalloc::api::StaticBandSetting::None,
            node_reuse: None,
            follow_nodes: None,
            guard: None,
            allow_overlap: false,
        },
    );
    let pool = portalloc::k8s::create_pool(admin, pool, true).await?;
    let store = ShardStore::new(admin.clone());

    let started = Instant::now();
    write_shards(&store, &pool, (1..=last).map(holder).collect()).await?;
    let fill = started.elapsed();
    let shards = store.list(POOL).await.map_err(|(e, _)| e)?;
    let sizes: Vec<usize> = shards
        .iter()
        .map(|s| serde_json::to_vec(s).map(|v| v.len()).unwrap_or(0))
        .collect();
    let total: usize = sizes.iter().sum();
    let held: i32 = shards
        .iter()
        .filter_map(|s| s.status.as_ref())
        .map(|s| s.allocated)
        .sum();
    ensure!(
        held as u32 == last,
        "{held} of {last} ports held after the fill"
    );

    let allocator = Allocator::new(admin.clone());
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), NS);
    let (refused_in, refused) = allocate_one(&allocator, &api, "one-more-full").await;
    ensure!(refused.is_err(), "an allocation into a full pool succeeded");

    // One port free in every shard: drop the holder of each window's last port.
    let freed = |port: u32| port % 256 == 255 || port == last;
    write_shards(
        &store,
        &pool,
        (1..=last).filter(|&p| !freed(p)).map(holder).collect(),
    )
    .await
    .context("free one port per shard")?;
    let mut placed = Vec::new();
    let mut failures = Vec::new();
    let tries = if quick { 4 } else { 20 };
    for i in 0..tries {
        let (took, result) = allocate_one(&allocator, &api, &format!("one-more-{i}")).await;
        match result {
            Ok(()) => placed.push(took),
            Err(e) => failures.push(e),
        }
    }
    placed.sort();
    let median = placed.get(placed.len() / 2).copied().unwrap_or_default();
    let best = placed.first().copied().unwrap_or_default();
    let worst = placed.last().copied().unwrap_or_default();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(vec![
        Row {
            id: "2k",
            what: format!(
                "one pool, 1-{last}, every port held by its own holder ({last} holders in {} shards): bytes as served",
                shards.len()
            ),
            ours: format!(
                "works: {:.2} MB in all, **{:.1} bytes per held port**, largest shard {:.1} kB (etcd's limit 1,572,864 bytes per object); written in {:.1} s",
                total as f64 / 1e6,
                total as f64 / f64::from(last),
                *sizes.iter().max().unwrap_or(&0) as f64 / 1e3,
                fill.as_secs_f64()
            ),
            anchor: dash(),
            ratio: dash(),
            target: "works".into(),
            met: super::yes_no(true),
        },
        Row {
            id: "2k",
            what: format!(
                "one more 1-port allocation (create + allocate) into it: refused while full; placed with one port free per shard (median of {tries}, best / worst)"
            ),
            ours: format!(
                "refused (pool full) in {:.0} ms; placed in **{:.1} ms** ({:.1} / {:.1} ms){}",
                ms(refused_in),
                ms(median),
                ms(best),
                ms(worst),
                if failures.is_empty() {
                    String::new()
                } else {
                    format!("; {} failed: {}", failures.len(), failures[0])
                }
            ),
            anchor: dash(),
            ratio: dash(),
            target: "≤ 50 ms".into(),
            met: super::yes_no(failures.is_empty() && ms(median) <= 50.0),
        },
    ])
}

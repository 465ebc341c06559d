//! Allocation into a pool of several shards (PortPoolShards, one per 256-port window).

use std::collections::BTreeMap;

use kube::api::Api;
use kube::{Client, ResourceExt};
use portalloc::api::{PortAllocation, PortPool};
use portalloc::k8s::ShardStore;
use portalloc::ledger::{CopyRecord, PoolSnapshot, WindowLayout, home_shard};

use crate::support::invariants::{allocations_of, assert_consistent};
use crate::support::{self, cli};

async fn copy_record(client: &Client, pool: &str) -> CopyRecord {
    let pools: Api<PortPool> = Api::all(client.clone());
    let object = pools.get(pool).await.unwrap();
    let shards = ShardStore::new(client.clone()).list(pool).await.unwrap();
    CopyRecord::load(PoolSnapshot::of_pool(&object), shards).unwrap()
}

/// Each shard's name and resourceVersion: what a write would change.
async fn shard_versions(client: &Client, pool: &str) -> BTreeMap<String, String> {
    let shards = ShardStore::new(client.clone()).list(pool).await.unwrap();
    shards
        .iter()
        .map(|s| (s.name_any(), s.resource_version().unwrap()))
        .collect()
}

fn apply(ns: &str, manifest: &str) {
    let run = cli::run_stdin(&["create", "-f", "-", "-n", ns], manifest);
    assert!(run.ok(), "{run}");
}

/// 12 owners of 4 ports each land in their home shards (one shard each, named in
/// `status.shards`), their entries match their statuses, and `sync --all` writes nothing.
#[tokio::test]
async fn owners_live_in_their_home_shard_and_a_resync_writes_nothing() {
    let client = support::client().await;
    let ns = support::namespace(&client, "home").await;
    let pool = support::unique_name("home");
    support::create_pool(&pool, "30000-32767");
    for i in 0..12 {
        apply(
            &ns,
            &support::simple_allocation(&format!("svc-{i}"), &pool, "web", 2, &["http", "rpc"]),
        );
    }
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings.len(), 12);
    assert!(holdings.values().all(|h| h.len() == 4));

    let record = copy_record(&client, &pool).await;
    let layout = WindowLayout::new(&record.ports, record.pool.spec.core_static_band());
    for (uid, pa) in allocations_of(&client, &pool).await {
        let owner = format!("{}/{}", pa.namespace().unwrap(), pa.name_any());
        let home = home_shard(&layout, &owner).unwrap();
        assert_eq!(
            record.shards_of(&uid),
            vec![home],
            "{} not home",
            pa.name_any()
        );
        assert_eq!(pa.status.unwrap().shards, vec![i32::from(home)]);
    }

    let before = shard_versions(&client, &pool).await;
    let run = cli::run(&["sync", "--all", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert_eq!(
        shard_versions(&client, &pool).await,
        before,
        "a resync wrote a shard"
    );
}

/// 300 ports for one owner do not fit a 256-port shard: it spans shards, every part is listed
/// in `status.shards`, a resync keeps every port, and a release frees every shard.
#[tokio::test]
async fn an_owner_larger_than_a_shard_spans_shards_and_releases_whole() {
    let client = support::client().await;
    let ns = support::namespace(&client, "span").await;
    let pool = support::unique_name("span");
    // Windows 117-121.
    support::create_pool(&pool, "30000-31199");
    apply(
        &ns,
        &support::simple_allocation("big", &pool, "worker", 300, &["rpc"]),
    );
    let held = assert_consistent(&client, &pool).await;
    assert_eq!(held.values().map(|h| h.len()).sum::<usize>(), 300);
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let pa = api.get("big").await.unwrap();
    let uid = pa.uid().unwrap();
    let record = copy_record(&client, &pool).await;
    let parts = record.shards_of(&uid);
    assert!(parts.len() >= 2, "300 ports in {parts:?}");
    let listed: Vec<u16> = pa
        .status
        .as_ref()
        .unwrap()
        .shards
        .iter()
        .map(|&k| k as u16)
        .collect();
    assert_eq!(listed, parts, "status.shards names exactly the parts");

    let before = shard_versions(&client, &pool).await;
    let run = cli::run(&["sync", "big", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert_eq!(shard_versions(&client, &pool).await, before);
    assert_eq!(
        assert_consistent(&client, &pool).await,
        held,
        "a resync moved a port"
    );

    let run = cli::run(&["release", "big", "-n", &ns]);
    assert!(run.ok(), "{run}");
    let record = copy_record(&client, &pool).await;
    assert!(record.shards_of(&uid).is_empty(), "release left entries");
    assert!(record.holdings_of(&uid).is_empty());
    assert_consistent(&client, &pool).await;
}

/// Deleting a PortAllocation removes its entries from every shard.
#[tokio::test]
async fn delete_frees_every_shard() {
    let client = support::client().await;
    let ns = support::namespace(&client, "spandel").await;
    let pool = support::unique_name("spandel");
    support::create_pool(&pool, "30000-31199");
    apply(
        &ns,
        &support::simple_allocation("big", &pool, "worker", 270, &["rpc"]),
    );
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let uid = api.get("big").await.unwrap().uid().unwrap();
    assert!(copy_record(&client, &pool).await.shards_of(&uid).len() >= 2);
    let run = cli::run(&["delete", "big", "-n", &ns]);
    assert!(run.ok(), "{run}");
    let record = copy_record(&client, &pool).await;
    assert!(record.shards_of(&uid).is_empty(), "delete left entries");
    assert_eq!(record.union_record().state.held_count(), 0);
}

/// `PUT .../portpoolshards/<name>/status` lines of a `-v 2` request log.
fn shard_writes(stderr: &str, pool: &str) -> usize {
    let put = format!("PUT /apis/portalloc.dev/v1alpha1/portpoolshards/{pool}-");
    stderr
        .lines()
        .filter(|l| l.contains(&put) && (l.contains("/status ") || l.contains("/status?")))
        .count()
}

/// `sync --all` of 120 fresh PortAllocations into an 11-shard pool writes each shard at most
/// once for all the owners that live in it; one owner of 300 ports (more than a shard) goes
/// its own way across shards. A second run writes nothing.
#[tokio::test]
async fn sync_all_writes_each_shard_once_for_its_owners() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shardbatch").await;
    let pool = support::unique_name("shardbatch");
    support::create_pool(&pool, "30000-32767");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let mut yamls: Vec<String> = (0..120)
        .map(|i| {
            support::simple_allocation(&format!("job-{i:03}"), &pool, "w", 1, &["http", "rpc"])
        })
        .collect();
    yamls.push(support::simple_allocation("big", &pool, "w", 300, &["rpc"]));
    for yaml in &yamls {
        let pa: PortAllocation = serde_yaml::from_str(yaml).unwrap();
        api.create(&Default::default(), &pa).await.unwrap();
    }
    let run = cli::run(&["sync", "--all", "-n", &ns, "-v", "2"]);
    assert!(run.ok(), "{run}");
    let writes = shard_writes(&run.stderr, &pool);
    let held = assert_consistent(&client, &pool).await;
    assert_eq!(held.len(), 121);
    assert_eq!(held.values().map(|h| h.len()).sum::<usize>(), 120 * 2 + 300);
    eprintln!("sync --all of 121 into 11 shards: {writes} shard writes");
    // Each of the 11 shards once for the batch, plus the spanning owner's parts (at most 3
    // windows for 300 ports, 2 writes each if a retry is needed).
    assert!(writes <= 11 + 6, "{writes} shard writes:\n{}", run.stderr);

    let before = shard_versions(&client, &pool).await;
    let again = cli::run(&["sync", "--all", "-n", &ns, "-v", "2"]);
    assert!(again.ok(), "{again}");
    assert_eq!(shard_writes(&again.stderr, &pool), 0);
    assert_eq!(shard_versions(&client, &pool).await, before);
}

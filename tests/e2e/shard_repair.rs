//! `repair`, `pool describe|get|delete` of pools across several shards against the real API
//! server. Holdings are placed in shards with the same per-shard writes the allocator commits
//! (`CopyRecord::writes_for`, `ShardStore::commit`), recorded in the owners' statuses.

use std::collections::BTreeMap;

use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use portalloc::api::{PortAllocation, PortPool, PortPoolShard};
use portalloc::core::{Holdings, SlotKey};
use portalloc::k8s::{Allocator, FollowUp, PoolRepair, Repairer, ShardStore};
use portalloc::ledger::{CopyRecord, Outcome, PoolSnapshot, allocation_status, window_of};

use crate::support::{self, cli};

/// 45000-45599: windows 175 (45000-45055), 176, 177 and 178 (45568-45599).
const RANGE: &str = "45000-45599";

/// `pool create` makes every shard of a pool's layout, empty; without `eager`, remove them, as
/// for a pool applied with kubectl, whose shards come with its first allocations.
async fn make_sharded(client: &Client, pool: &str, eager: bool) {
    if eager {
        return;
    }
    let uid = Api::<PortPool>::all(client.clone())
        .get(pool)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let store = ShardStore::new(client.clone());
    for shard in store.list(pool).await.unwrap() {
        // Only this pool object's: an earlier one's shards are what some tests are about.
        if shard.spec.pool_uid == uid {
            store.delete(&shard.name_any()).await.unwrap();
        }
    }
}

/// A PortAllocation `name` with role web of `ports.len()` pods (PodScoped http), created with no
/// allocation; `place` gives it ports.
pub(crate) async fn create_allocation(
    client: &Client,
    ns: &str,
    name: &str,
    pool: &str,
    pods: u32,
) -> PortAllocation {
    let text = support::simple_allocation(name, pool, "web", pods, &["http"]);
    let mut pa: PortAllocation = serde_yaml::from_str(&text).unwrap();
    pa.metadata.namespace = Some(ns.to_string());
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &pa).await.unwrap()
}

pub(crate) fn web(ports: &[u16]) -> Holdings {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| (SlotKey::new("web", "http", i as u32), *p))
        .collect()
}

/// Give `pa` the ports `holdings` in the shards of `pool` (one CAS per shard, as the allocator
/// commits a spanning owner) and record them in its status.
pub(crate) async fn place(client: &Client, pool: &str, pa: &PortAllocation, holdings: &Holdings) {
    let pools: Api<PortPool> = Api::all(client.clone());
    let object = pools.get(pool).await.unwrap();
    let store = ShardStore::new(client.clone());
    let sharded = CopyRecord::load(
        PoolSnapshot::of_pool(&object),
        store.list(pool).await.unwrap(),
    )
    .unwrap();
    let owner = format!("{}/{}", pa.namespace().unwrap(), pa.name_any());
    let uid = pa.uid().unwrap();
    for write in sharded.writes_for(&uid, &owner, holdings) {
        store
            .commit(&PoolSnapshot::of_pool(&object), &write)
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let mut status = allocation_status(pa, holdings, object.uid().as_deref(), Outcome::Converged);
    let mut windows: Vec<i32> = holdings.ports().map(|p| i32::from(window_of(p))).collect();
    windows.dedup();
    status.shards = windows;
    let mut updated = pa.clone();
    updated.status = Some(status);
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &pa.namespace().unwrap());
    api.replace_status(&pa.name_any(), &PostParams::default(), &updated)
        .await
        .unwrap();
}

/// Every shard object of `pool`, by name.
async fn shards_of(client: &Client, pool: &str) -> BTreeMap<String, PortPoolShard> {
    ShardStore::new(client.clone())
        .list(pool)
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.name_any(), s))
        .collect()
}

/// What each UID holds in the shards that name the current pool object, pieces joined.
pub(crate) async fn holdings_in_shards(client: &Client, pool: &str) -> BTreeMap<String, Holdings> {
    let pools: Api<PortPool> = Api::all(client.clone());
    let object = pools.get(pool).await.unwrap();
    let listed: Vec<PortPoolShard> = shards_of(client, pool).await.into_values().collect();
    let sharded = CopyRecord::load(PoolSnapshot::of_pool(&object), listed).unwrap();
    assert!(sharded.anomalies.is_empty(), "{:?}", sharded.anomalies);
    let uids: Vec<String> = sharded
        .shards
        .values()
        .flat_map(|s| s.record.holders.keys().cloned())
        .collect();
    uids.into_iter()
        .map(|uid| {
            let held = sharded.holdings_of(&uid);
            (uid, held)
        })
        .collect()
}

/// `place`, reading again after a conflict on any shard (parts committed before it are then
/// part of what is read).
async fn place_retrying(client: &Client, pool: &str, pa: &PortAllocation, holdings: &Holdings) {
    let pools: Api<PortPool> = Api::all(client.clone());
    let object = pools.get(pool).await.unwrap();
    let store = ShardStore::new(client.clone());
    let owner = format!("{}/{}", pa.namespace().unwrap(), pa.name_any());
    let uid = pa.uid().unwrap();
    'read: loop {
        let sharded = CopyRecord::load(
            PoolSnapshot::of_pool(&object),
            store.list(pool).await.unwrap(),
        )
        .unwrap();
        for write in sharded.writes_for(&uid, &owner, holdings) {
            match store.commit(&PoolSnapshot::of_pool(&object), &write).await {
                Ok(_) => {}
                Err((kube::Error::Api(s), _)) if s.code == 409 => continue 'read,
                Err((e, target)) => panic!("{target:?}: {e}"),
            }
        }
        break;
    }
    place(client, pool, pa, holdings).await;
}

async fn repair(client: &Client, pool: &str, apply: bool) -> PoolRepair {
    let repairer = Repairer::new(client.clone(), Allocator::new(client.clone()));
    let mut out = Vec::new();
    let count = repairer
        .repair(Some(pool), apply, |r| out.push(r))
        .await
        .unwrap();
    assert_eq!(count, 1);
    out.pop().unwrap()
}

fn versions(shards: &BTreeMap<String, PortPoolShard>) -> BTreeMap<String, Option<String>> {
    shards
        .iter()
        .map(|(name, s)| (name.clone(), s.resource_version()))
        .collect()
}

async fn delete_allocation(client: &Client, ns: &str, name: &str) {
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), ns);
    api.delete(name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn a_deleted_owners_entries_are_freed_in_every_shard_and_live_ones_kept() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-repair-leak").await;
    let pool = support::unique_name("shard-repair-leak");
    support::create_pool(&pool, RANGE);
    make_sharded(&client, &pool, true).await;
    let a = create_allocation(&client, &ns, "a", &pool, 2).await;
    let gone = create_allocation(&client, &ns, "gone", &pool, 2).await;
    // Both span windows 175 and 176.
    place(&client, &pool, &a, &web(&[45050, 45100])).await;
    place(&client, &pool, &gone, &web(&[45051, 45101])).await;
    delete_allocation(&client, &ns, "gone").await;

    let run = cli::run(&["repair", "--pool", &pool]);
    assert_eq!(run.code, 10, "{run}");
    assert_eq!(run.stdout.matches("free     pool/").count(), 2, "{run}");
    assert!(!run.stdout.contains("warning"), "{run}");

    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("applied 2 changes"), "{run}");
    let held = holdings_in_shards(&client, &pool).await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[&a.uid().unwrap()], web(&[45050, 45100]));
    let shards = shards_of(&client, &pool).await;
    let w175 = shards[&format!("{pool}-175")].status.clone().unwrap();
    assert_eq!((w175.allocated, w175.holder_count, w175.size), (1, 1, 56));

    // A second repair writes nothing.
    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout.contains("consistent (1 holders, 2 ports held)"),
        "{run}"
    );
    assert_eq!(
        versions(&shards_of(&client, &pool).await),
        versions(&shards)
    );
}

#[tokio::test]
async fn a_pool_deleted_and_created_again_gets_every_holding_back_in_its_shards() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-repair-recreate").await;
    let pool = support::unique_name("shard-repair-recreate");
    support::create_pool(&pool, RANGE);
    make_sharded(&client, &pool, true).await;
    let a = create_allocation(&client, &ns, "a", &pool, 2).await;
    let b = create_allocation(&client, &ns, "b", &pool, 1).await;
    place(&client, &pool, &a, &web(&[45050, 45100])).await;
    place(&client, &pool, &b, &web(&[45570])).await;
    let before = holdings_in_shards(&client, &pool).await;
    assert_eq!(before.len(), 2);

    // Deleted behind the plugin's back: no garbage collector removes the old shards.
    let pools: Api<PortPool> = Api::all(client.clone());
    pools.delete(&pool, &DeleteParams::default()).await.unwrap();
    support::create_pool(&pool, RANGE);
    // No shards of its own (the old ones hold their names).
    make_sharded(&client, &pool, false).await;
    let old = shards_of(&client, &pool).await;
    assert_eq!(old.len(), 4);

    let run = cli::run(&["repair", "--pool", &pool]);
    assert_eq!(run.code, 10, "{run}");
    // a is restored into two shards, b into one; the old pool's four shards are removed.
    assert_eq!(run.stdout.matches("restore  pool/").count(), 3, "{run}");
    assert_eq!(run.stdout.matches("remove   pool/").count(), 4, "{run}");
    assert_eq!(versions(&shards_of(&client, &pool).await), versions(&old));

    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("applied 7 changes"), "{run}");
    // Each restored PortAllocation is synced, and nothing moves.
    assert_eq!(run.stdout.matches("(unchanged)").count(), 2, "{run}");
    assert_eq!(holdings_in_shards(&client, &pool).await, before);
    let new_uid = pools.get(&pool).await.unwrap().uid().unwrap();
    let shards = shards_of(&client, &pool).await;
    let names: Vec<&str> = shards.keys().map(String::as_str).collect();
    let expected = [175, 176, 178].map(|k| format!("{pool}-{k}"));
    assert_eq!(
        names,
        expected.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert!(shards.values().all(|s| s.spec.pool_uid == new_uid));
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    for name in ["a", "b"] {
        let status = api.get(name).await.unwrap().status.unwrap();
        assert_eq!(status.pool_uid.as_deref(), Some(new_uid.as_str()), "{name}");
    }

    let run = cli::run(&["repair", "--pool", &pool]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout.contains("consistent (2 holders, 3 ports held)"),
        "{run}"
    );
    assert_eq!(
        versions(&shards_of(&client, &pool).await),
        versions(&shards)
    );
}

#[tokio::test]
async fn a_deleted_shard_is_recreated_with_its_holdings() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-repair-lost").await;
    let pool = support::unique_name("shard-repair-lost");
    support::create_pool(&pool, RANGE);
    make_sharded(&client, &pool, true).await;
    let a = create_allocation(&client, &ns, "a", &pool, 2).await;
    let b = create_allocation(&client, &ns, "b", &pool, 1).await;
    let c = create_allocation(&client, &ns, "c", &pool, 1).await;
    place(&client, &pool, &a, &web(&[45050, 45100])).await;
    place(&client, &pool, &b, &web(&[45101])).await;
    place(&client, &pool, &c, &web(&[45400])).await;
    let before = holdings_in_shards(&client, &pool).await;

    let lost = format!("{pool}-176");
    ShardStore::new(client.clone()).delete(&lost).await.unwrap();
    assert!(!shards_of(&client, &pool).await.contains_key(&lost));

    let repaired = repair(&client, &pool, true).await;
    assert!(repaired.applied, "{:?}", repaired.plan);
    let restored: Vec<&str> = repaired
        .plan
        .restored
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(restored, vec!["a", "b"]);
    assert!(
        repaired.plan.findings.is_empty(),
        "{:?}",
        repaired.plan.findings
    );
    // Their follow-up sync finds every port where the status says.
    for follow_up in &repaired.follow_ups {
        match follow_up {
            FollowUp::Synced(report) => {
                assert_eq!((report.allocated, report.released), (0, 0), "{report:?}")
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(holdings_in_shards(&client, &pool).await, before);
    let shards = shards_of(&client, &pool).await;
    let recreated = shards[&lost].status.clone().unwrap();
    assert_eq!((recreated.allocated, recreated.holder_count), (2, 2));

    let again = repair(&client, &pool, true).await;
    assert!(again.plan.is_clean(), "{:?}", again.plan);
    assert_eq!(
        versions(&shards_of(&client, &pool).await),
        versions(&shards)
    );
}

#[tokio::test]
async fn describe_sums_the_shards_and_delete_refuses_while_held() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-describe").await;
    let pool = support::unique_name("shard-describe");
    support::create_pool(&pool, RANGE);
    make_sharded(&client, &pool, true).await;
    let a = create_allocation(&client, &ns, "a", &pool, 2).await;
    let b = create_allocation(&client, &ns, "b", &pool, 1).await;
    place(&client, &pool, &a, &web(&[45050, 45100])).await;
    place(&client, &pool, &b, &web(&[45570])).await;

    let run = cli::run(&["pool", "describe", &pool]);
    assert!(run.ok(), "{run}");
    for line in [
        "Record:       4 shards\n",
        "Size:         600 ports\n",
        "Free:         597\n",
        "Holders:      2\n",
        "    web.http=45050,45100\n",
    ] {
        assert!(run.stdout.contains(line), "{line:?} in {run}");
    }
    assert!(run.stdout.contains("Allocated:    3 "), "{run}");
    // No anomaly (the range's only warning is the ephemeral-port hazard).
    assert!(
        !run.stdout.contains("run `kubectl portalloc repair`"),
        "{run}"
    );
    assert!(
        run.stdout.contains(&format!("  {ns}/a  (2 ports, uid ")),
        "{run}"
    );

    let run = cli::run(&["pool", "get", &pool]);
    assert!(run.ok(), "{run}");
    let row: Vec<&str> = run
        .stdout
        .lines()
        .find(|l| l.contains(&pool))
        .unwrap()
        .split_whitespace()
        .collect();
    // NAME PROTOCOL RANGES SIZE ALLOCATED FREE HOLDERS AGE
    assert_eq!(&row[3..7], &["600", "3", "597", "2"], "{run}");

    // A small pool is one shard.
    let plain = support::unique_name("shard-describe-plain");
    support::create_pool(&plain, "45700-45709");
    let run = cli::run(&["pool", "describe", &plain]);
    assert!(run.stdout.contains("Record:       1 shard\n"), "{run}");

    let run = cli::run(&["pool", "delete", &pool]);
    assert!(!run.ok(), "{run}");
    assert!(run.stderr.contains("still has 2 holders"), "{run}");
    assert!(run.stderr.contains(&format!("{ns}/a (2 ports)")), "{run}");
    assert_eq!(shards_of(&client, &pool).await.len(), 4);

    delete_allocation(&client, &ns, "a").await;
    delete_allocation(&client, &ns, "b").await;
    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    let run = cli::run(&["pool", "delete", &pool]);
    assert!(run.ok(), "{run}");
    assert!(shards_of(&client, &pool).await.is_empty());
    let pools: Api<PortPool> = Api::all(client.clone());
    assert!(pools.get_opt(&pool).await.unwrap().is_none());
    let run = cli::run(&["pool", "delete", &plain]);
    assert!(run.ok(), "{run}");
}

#[tokio::test]
async fn repairs_racing_placements_never_take_their_ports() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-repair-race").await;
    let pool = support::unique_name("shard-repair-race");
    support::create_pool(&pool, RANGE);
    make_sharded(&client, &pool, true).await;
    let mut live = Vec::new();
    for i in 0..12u16 {
        live.push(create_allocation(&client, &ns, &format!("live-{i}"), &pool, 2).await);
    }
    // Each placement is followed by a leak in both windows, so repair passes keep having
    // shard writes to race with.
    let placer = {
        let (client, pool, ns, live) = (client.clone(), pool.clone(), ns.clone(), live.clone());
        tokio::spawn(async move {
            for (i, pa) in live.iter().enumerate() {
                let i = i as u16;
                place_retrying(&client, &pool, pa, &web(&[45030 + i, 45230 + i])).await;
                let name = format!("gone-{i}");
                let gone = create_allocation(&client, &ns, &name, &pool, 2).await;
                place_retrying(&client, &pool, &gone, &web(&[45010 + i, 45210 + i])).await;
                delete_allocation(&client, &ns, &name).await;
            }
        })
    };
    let repairer = Repairer::new(client.clone(), Allocator::new(client.clone()));
    let (mut passes, mut writing, mut conflicts) = (0, 0, 0);
    while !placer.is_finished() || passes == 0 {
        // Exhausted retries under contention are a legitimate outcome; anything else is not.
        let outcome = repairer
            .repair(Some(&pool), true, |r| {
                writing += usize::from(r.applied);
                conflicts += r.conflicts;
            })
            .await;
        match outcome {
            Ok(_) | Err(portalloc::k8s::RepairError::Exhausted { .. }) => {}
            Err(e) => panic!("repair: {e}"),
        }
        passes += 1;
    }
    // How much racing happened depends on timing; what is asserted below does not.
    eprintln!("{passes} repair passes, {writing} wrote shards, {conflicts} conflicts");
    placer.await.unwrap();
    let final_pass = repair(&client, &pool, true).await;
    assert!(
        final_pass.plan.findings.is_empty(),
        "{:?}",
        final_pass.plan.findings
    );

    let held = holdings_in_shards(&client, &pool).await;
    let expected: BTreeMap<String, Holdings> = live
        .iter()
        .enumerate()
        .map(|(i, pa)| {
            let i = i as u16;
            (pa.uid().unwrap(), web(&[45030 + i, 45230 + i]))
        })
        .collect();
    assert_eq!(held, expected, "after {passes} repair passes");
}

#[tokio::test]
async fn a_forced_delete_removes_the_shards_and_repair_brings_the_holdings_back() {
    let client = support::client().await;
    let ns = support::namespace(&client, "shard-force").await;
    let pool = support::unique_name("shard-force");
    support::create_pool(&pool, RANGE);
    make_sharded(&client, &pool, true).await;
    let a = create_allocation(&client, &ns, "a", &pool, 2).await;
    place(&client, &pool, &a, &web(&[45050, 45100])).await;
    let before = holdings_in_shards(&client, &pool).await;

    let run = cli::run(&["pool", "delete", &pool, "--force"]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stderr.contains("1 PortAllocations still record ports"),
        "{run}"
    );
    assert!(shards_of(&client, &pool).await.is_empty());

    support::create_pool(&pool, RANGE);
    make_sharded(&client, &pool, false).await;
    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    assert_eq!(run.stdout.matches("restore  pool/").count(), 2, "{run}");
    assert_eq!(holdings_in_shards(&client, &pool).await, before);
}

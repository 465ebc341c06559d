//! Upgrading a pool in place to PortPoolShards (`pool upgrade`) and creating one sharded
//! (`pool create --sharded`), against the real API server: the shards hold exactly the old list,
//! an interrupted upgrade resumes to the same result, and the CRD's transition rules refuse
//! what old clients would write.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};
use portalloc::api::{
    FORMAT_KEPT_MESSAGE, FROZEN_WHILE_MIGRATING_MESSAGE, PoolHolder, PortAllocation, PortPool,
    PortPoolShard, RecordFormat,
};
use portalloc::core::Holdings;
use portalloc::k8s::{ShardStore, UpgradeStart, upgrade_pool};
use portalloc::ledger::{
    Anomaly, PoolRecord, ShardAnomaly, ShardWrite, ShardedRecord, new_shard, shard_name,
    upgrade_plan, window,
};

use crate::support::private_cluster::PrivateCluster;
use crate::support::{self, cli};

pub(crate) const RANGES: &str = "30000-32767";
/// Windows 117 (29952-30207) to 127 (32512-32767).
const WINDOWS: std::ops::RangeInclusive<u16> = 117..=127;

fn holder(uid: &str, ports: &str) -> PoolHolder {
    PoolHolder {
        uid: uid.into(),
        owner: format!("team/{uid}"),
        ports: ports.into(),
    }
}

/// The list a pool in today's format might hold: several owners, a block, an entry spanning
/// two windows (a block across the 30207/30208 edge), one spanning two far windows, and an
/// entry no client can decode.
pub(crate) fn old_holders() -> Vec<PoolHolder> {
    vec![
        holder("uid-a", "web.http=30001 web.metrics=30002"),
        holder("uid-b", "ray.workers=30100-30115"),
        holder("uid-c", "big.blk=30200-30215"),
        holder("uid-d", "x.y=31000 z.w=32000"),
        holder("uid-bad", "this is not a holdings text"),
        holder("uid-e", "web.http=32767"),
    ]
}

/// A pool created by the plugin in today's format, whose status then gets `holders` written
/// raw (counts recomputed, as any client's write does). Returns the pool as written.
pub(crate) async fn old_format_pool(
    client: &Client,
    prefix: &str,
    holders: Vec<PoolHolder>,
) -> PortPool {
    let name = support::unique_name(prefix);
    support::create_pool(&name, RANGES);
    let pools: Api<PortPool> = Api::all(client.clone());
    let mut object = pools.get(&name).await.unwrap();
    assert_eq!(object.status.as_ref().unwrap().format, None);
    object.status.get_or_insert_with(Default::default).holders = holders;
    object.status = Some(PoolRecord::load(object.clone()).unwrap().current_status());
    pools
        .replace_status(&name, &PostParams::default(), &object)
        .await
        .unwrap()
}

/// Set `format: Migrating` by hand: what an upgrader killed right after its freeze leaves.
async fn freeze_by_hand(client: &Client, pool: &PortPool) -> PortPool {
    let pools: Api<PortPool> = Api::all(client.clone());
    let mut frozen = pool.clone();
    frozen.status.as_mut().unwrap().format = Some(RecordFormat::Migrating);
    pools
        .replace_status(&pool.name_any(), &PostParams::default(), &frozen)
        .await
        .unwrap()
}

pub(crate) async fn shards_of(client: &Client, pool: &str) -> Vec<PortPoolShard> {
    let mut shards = ShardStore::new(client.clone()).list(pool).await.unwrap();
    shards.sort_by_key(|s| s.spec.index);
    shards
}

/// resourceVersions of the pool and of each of its shards.
async fn versions(client: &Client, pool: &str) -> BTreeMap<String, String> {
    let pools: Api<PortPool> = Api::all(client.clone());
    let mut all = BTreeMap::new();
    let object = pools.get(pool).await.unwrap();
    all.insert(pool.to_string(), object.resource_version().unwrap());
    for shard in shards_of(client, pool).await {
        all.insert(shard.name_any(), shard.resource_version().unwrap());
    }
    all
}

/// The pool `before` (today's format) is now sharded, and its shards hold exactly its list.
pub(crate) async fn assert_upgraded(client: &Client, before: &PortPool) {
    let name = before.name_any();
    let pools: Api<PortPool> = Api::all(client.clone());
    let pool = pools.get(&name).await.unwrap();
    let status = pool.status.clone().unwrap();
    let old = before.status.clone().unwrap();
    assert_eq!(status.format, Some(RecordFormat::Sharded));
    assert!(status.holders.is_empty(), "{:?}", status.holders);
    assert_eq!(
        (
            status.size,
            status.allocated,
            status.available,
            status.holder_count
        ),
        (old.size, old.allocated, old.available, old.holder_count),
        "the counts are kept"
    );

    let shards = shards_of(client, &name).await;
    let indices: Vec<u16> = shards.iter().map(|s| s.spec.index as u16).collect();
    assert_eq!(indices, WINDOWS.collect::<Vec<_>>());
    for shard in &shards {
        let index = shard.spec.index as u16;
        assert_eq!(shard.name_any(), shard_name(&name, index));
        assert_eq!(shard.spec.pool, name);
        assert_eq!(Some(&shard.spec.pool_uid), pool.metadata.uid.as_ref());
        assert_eq!(
            shard.spec.ranges,
            vec![window(index).to_string().as_str().into()]
        );
    }
    let plan = upgrade_plan(before).unwrap();
    let written: Vec<_> = shards.iter().map(|s| s.status.clone().unwrap()).collect();
    let planned: Vec<_> = plan.iter().map(|s| s.status.clone()).collect();
    assert_eq!(written, planned);

    // The union of the shards' entries is the old list, owner by owner.
    let record = ShardedRecord::load(pool.clone(), shards.clone()).unwrap();
    let mut undecodable = Vec::new();
    for entry in &old.holders {
        match Holdings::decode(&entry.ports) {
            Ok(held) => assert_eq!(record.holdings_of(&entry.uid), held, "{}", entry.uid),
            Err(_) => undecodable.push(entry.clone()),
        }
    }
    // An entry no one can decode is kept verbatim, in the pool's first shard.
    assert_eq!(undecodable.len(), 1);
    let first = shards[0].status.as_ref().unwrap();
    assert!(first.holders.contains(&undecodable[0]), "{first:?}");
    let anomalies: Vec<_> = record.anomalies.iter().collect();
    assert!(
        matches!(
            anomalies.as_slice(),
            [ShardAnomaly::InShard { shard: 117, anomaly: Anomaly::Undecodable { uid, .. } }]
                if uid == "uid-bad"
        ),
        "{anomalies:?}"
    );
    let old_uids: BTreeSet<&str> = old.holders.iter().map(|h| h.uid.as_str()).collect();
    let shard_uids: BTreeSet<&str> = shards
        .iter()
        .flat_map(|s| s.status.as_ref().unwrap().holders.iter())
        .map(|h| h.uid.as_str())
        .collect();
    assert_eq!(shard_uids, old_uids);
    // The spanning owners are split, under the same UID and owner.
    let owners_of_c: Vec<(i32, &str)> = shards
        .iter()
        .flat_map(|s| {
            let status = s.status.as_ref().unwrap();
            status
                .holders
                .iter()
                .filter(|h| h.uid == "uid-c")
                .map(move |h| (s.spec.index, h.owner.as_str()))
        })
        .collect();
    assert_eq!(owners_of_c, vec![(117, "team/uid-c"), (118, "team/uid-c")]);
}

#[tokio::test]
async fn upgrade_copies_every_entry_into_the_shards_and_a_second_run_changes_nothing() {
    let client = support::client().await;
    let before = old_format_pool(&client, "upgrade", old_holders()).await;
    let name = before.name_any();

    let run = cli::run(&["pool", "upgrade", &name]);
    assert!(run.ok(), "{run}");
    assert_eq!(
        run.stdout.trim(),
        format!(
            "portpool.portalloc.dev/{name} upgraded: 6 holders copied into 11 PortPoolShards (11 written)"
        )
    );
    assert_upgraded(&client, &before).await;

    let unchanged = versions(&client, &name).await;
    assert_eq!(unchanged.len(), 12, "{unchanged:?}");
    let again = cli::run(&["pool", "upgrade", &name, "-o", "name"]);
    assert!(again.ok(), "{again}");
    assert_eq!(
        again.stdout.trim(),
        format!("portpool.portalloc.dev/{name}")
    );
    let report = upgrade_pool(&client, &name).await.unwrap();
    assert_eq!(report.start, UpgradeStart::AlreadySharded);
    assert_eq!(report.shards_written, 0);
    assert_eq!(versions(&client, &name).await, unchanged);
}

#[tokio::test]
async fn an_upgrade_killed_after_the_freeze_resumes_to_the_same_result() {
    let client = support::client().await;
    let before = old_format_pool(&client, "resume-freeze", old_holders()).await;
    let name = before.name_any();
    freeze_by_hand(&client, &before).await;

    let run = cli::run(&["pool", "upgrade", &name]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout
            .contains("upgraded (resumed an interrupted upgrade): 6 holders copied into 11 PortPoolShards (11 written)"),
        "{run}"
    );
    assert_upgraded(&client, &before).await;
}

#[tokio::test]
async fn an_upgrade_killed_during_the_copy_resumes_and_writes_only_what_is_missing() {
    let client = support::client().await;
    let before = old_format_pool(&client, "resume-copy", old_holders()).await;
    let name = before.name_any();
    let frozen = freeze_by_hand(&client, &before).await;
    let plan = upgrade_plan(&frozen).unwrap();
    let store = ShardStore::new(client.clone());
    // Three shards fully written, as the killed upgrader planned them.
    for planned in &plan[..3] {
        let write = ShardWrite {
            index: planned.index,
            name: planned.name.clone(),
            resource_version: None,
            status: planned.status.clone(),
        };
        store
            .commit(&frozen, &write)
            .await
            .map_err(|e| e.0)
            .unwrap();
    }
    // One created but killed before its status write.
    let shards: Api<PortPoolShard> = Api::all(client.clone());
    shards
        .create(&PostParams::default(), &new_shard(&frozen, plan[3].index))
        .await
        .unwrap();
    // One written with a stale status (a lost race would leave no other kind).
    let mut stale = plan[4].status.clone();
    stale.holders.push(holder("uid-stale", "q.q=31300"));
    let write = ShardWrite {
        index: plan[4].index,
        name: plan[4].name.clone(),
        resource_version: None,
        status: stale,
    };
    store
        .commit(&frozen, &write)
        .await
        .map_err(|e| e.0)
        .unwrap();

    let report = upgrade_pool(&client, &name).await.unwrap();
    assert_eq!(report.start, UpgradeStart::Resumed);
    assert_eq!((report.shards, report.shards_written), (11, 8));
    assert_eq!(report.holders_copied, 6);
    assert_upgraded(&client, &before).await;
}

#[tokio::test]
async fn two_upgraders_racing_agree() {
    let client = support::client().await;
    let before = old_format_pool(&client, "upgrade-race", old_holders()).await;
    let name = before.name_any();
    let (one, two) = tokio::join!(upgrade_pool(&client, &name), upgrade_pool(&client, &name));
    let (one, two) = (one.unwrap(), two.unwrap());
    // Every shard was written by one of them at least (a shard both found missing or stale
    // may be written by both: the second write carries the same status).
    assert!(
        one.shards_written + two.shards_written >= 11,
        "{one:?} {two:?}"
    );
    assert_upgraded(&client, &before).await;
}

/// The pool as raw JSON, so a write can be built the way an old client would send it.
async fn raw_pool(client: &Client, name: &str) -> (Api<DynamicObject>, DynamicObject) {
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::erase::<PortPool>(&()));
    let object = api.get(name).await.unwrap();
    (api, object)
}

/// The API server's refusal message of a status write, or None if it was accepted.
async fn put_status(api: &Api<DynamicObject>, object: &DynamicObject) -> Option<String> {
    match api
        .replace_status(&object.name_any(), &PostParams::default(), object)
        .await
    {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            Some(status.message)
        }
        Err(other) => panic!("not an answer from the server: {other}"),
    }
}

#[tokio::test]
async fn the_crd_refuses_old_clients_and_freezes_holders_while_migrating() {
    let client = support::client().await;
    let before = old_format_pool(&client, "cel-rules", old_holders()).await;
    let name = before.name_any();

    // A pool still in today's format: an old client's write (no `format` at all) is accepted.
    let (api, mut object) = raw_pool(&client, &name).await;
    assert!(object.data["status"].get("format").is_none());
    object.data["status"]["holders"]
        .as_array_mut()
        .unwrap()
        .pop();
    assert_eq!(put_status(&api, &object).await, None);
    let before = current_pool(&client, &name).await;

    freeze_by_hand(&client, &before).await;
    // While Migrating, a write that changes holders is refused, even one that keeps `format`.
    let (api, object) = raw_pool(&client, &name).await;
    let mut changed = object.clone();
    changed.data["status"]["holders"]
        .as_array_mut()
        .unwrap()
        .remove(0);
    let refused = put_status(&api, &changed).await.expect("refused");
    assert!(
        refused.contains(FROZEN_WHILE_MIGRATING_MESSAGE),
        "{refused}"
    );
    // An old client's write drops `format`: refused.
    let mut old_client = object.clone();
    old_client.data["status"]
        .as_object_mut()
        .unwrap()
        .remove("format");
    let refused = put_status(&api, &old_client).await.expect("refused");
    assert!(refused.contains(FORMAT_KEPT_MESSAGE), "{refused}");
    // The flip is accepted.
    let mut flip = object.clone();
    flip.data["status"]["format"] = "Sharded".into();
    flip.data["status"]
        .as_object_mut()
        .unwrap()
        .remove("holders");
    assert_eq!(put_status(&api, &flip).await, None);

    // Sharded: an old client's write (holders back, no format) is refused, and so is going back.
    let (api, object) = raw_pool(&client, &name).await;
    let mut old_client = object.clone();
    let status = old_client.data["status"].as_object_mut().unwrap();
    status.remove("format");
    status.insert(
        "holders".into(),
        serde_json::to_value(old_holders()).unwrap(),
    );
    let refused = put_status(&api, &old_client).await.expect("refused");
    assert!(refused.contains(FORMAT_KEPT_MESSAGE), "{refused}");
    let mut back = object.clone();
    back.data["status"]["format"] = "Migrating".into();
    let refused = put_status(&api, &back).await.expect("refused");
    assert!(refused.contains(FORMAT_KEPT_MESSAGE), "{refused}");
}

/// The pool as it is now (after a raw write).
async fn current_pool(client: &Client, name: &str) -> PortPool {
    Api::<PortPool>::all(client.clone())
        .get(name)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_pool_created_sharded_has_every_shard_empty_from_the_start() {
    let client = support::client().await;
    let name = support::unique_name("created-sharded");
    let run = cli::run(&[
        "pool",
        "create",
        &name,
        "--range",
        RANGES,
        "--allow-overlap",
        "--sharded",
    ]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.trim_end().ends_with(", sharded"), "{run}");

    let pool = Api::<PortPool>::all(client.clone())
        .get(&name)
        .await
        .unwrap();
    let status = pool.status.clone().unwrap();
    assert_eq!(status.format, Some(RecordFormat::Sharded));
    assert!(status.holders.is_empty());
    assert_eq!(
        (
            status.size,
            status.allocated,
            status.available,
            status.holder_count
        ),
        (2768, 0, 2768, 0)
    );

    let shards = shards_of(&client, &name).await;
    let indices: Vec<u16> = shards.iter().map(|s| s.spec.index as u16).collect();
    assert_eq!(indices, WINDOWS.collect::<Vec<_>>());
    let mut total = 0;
    for shard in &shards {
        let index = shard.spec.index as u16;
        assert_eq!(shard.name_any(), shard_name(&name, index));
        assert_eq!(
            (shard.spec.pool.as_str(), Some(&shard.spec.pool_uid)),
            (name.as_str(), pool.metadata.uid.as_ref())
        );
        let s = shard.status.clone().expect("status written");
        assert!(s.holders.is_empty());
        // Window 117 starts at 29952, before the pool: 30000-30207 are its 208 ports.
        let size = if index == 117 { 208 } else { 256 };
        assert_eq!(
            (s.size, s.allocated, s.available, s.holder_count),
            (size, 0, size, 0),
            "{}",
            shard.name_any()
        );
        total += s.size;
    }
    assert_eq!(total, status.size);

    // Already sharded: upgrading it is a no-op.
    let unchanged = versions(&client, &name).await;
    let run = cli::run(&["pool", "upgrade", &name]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout.contains("is already sharded (unchanged)"),
        "{run}"
    );
    assert_eq!(versions(&client, &name).await, unchanged);
}

#[tokio::test]
async fn a_pool_applied_from_a_manifest_stays_in_todays_format() {
    let client = support::client().await;
    let name = support::unique_name("applied");
    let run = cli::run_stdin(
        &["create", "-f", "-"],
        &support::pool_yaml(&name, "\"40000-40999\"", "TCP"),
    );
    assert!(run.ok(), "{run}");
    let pool = Api::<PortPool>::all(client.clone())
        .get(&name)
        .await
        .unwrap();
    assert_eq!(pool.status.unwrap().format, None);
    assert!(shards_of(&client, &name).await.is_empty());
}

#[tokio::test]
async fn upgrading_a_missing_pool_says_so() {
    let name = support::unique_name("no-such-pool");
    let run = cli::run(&["pool", "upgrade", &name]);
    assert_eq!(run.code, 3, "{run}");
    assert!(
        run.stderr
            .contains(&format!("PortPool \"{name}\" not found")),
        "{run}"
    );
}

/// Create (or replace) these CRDs and wait until the API server serves them.
async fn put_crds(client: &Client, crds: Vec<CustomResourceDefinition>) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd.name_any();
        api.create(&PostParams::default(), &crd).await.unwrap();
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .expect("CRD established in 30 s")
            .unwrap();
    }
}

/// The PortPool CRD of a release before sharded pools: no `status.format`, no rules on it.
fn portpool_crd_without_format() -> CustomResourceDefinition {
    let mut crd = serde_json::to_value(PortPool::crd()).unwrap();
    let status =
        &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
    let object = status.as_object_mut().unwrap();
    object.remove("x-kubernetes-validations");
    object["properties"]
        .as_object_mut()
        .unwrap()
        .remove("format");
    serde_json::from_value(crd).unwrap()
}

/// A cluster whose CRDs predate sharded pools: the upgrade refuses before changing anything
/// (first the PortPoolShard kind is missing, then the PortPool CRD drops `format`), and after
/// `kubectl portalloc install` it upgrades.
#[tokio::test]
async fn an_upgrade_on_outdated_crds_changes_nothing_and_says_to_install() {
    let Some(cluster) = PrivateCluster::start("upgrade-old-crds", false) else {
        return;
    };
    let client = cluster.client().await;
    put_crds(
        &client,
        vec![portpool_crd_without_format(), PortAllocation::crd()],
    )
    .await;
    let name = "old-crds";
    let run = cluster.run(&["pool", "create", name, "--range", RANGES]);
    assert!(run.ok(), "{run}");
    let pools: Api<PortPool> = Api::all(client.clone());
    let mut object = pools.get(name).await.unwrap();
    object.status.get_or_insert_with(Default::default).holders = old_holders();
    object.status = Some(PoolRecord::load(object.clone()).unwrap().current_status());
    let before = pools
        .replace_status(name, &PostParams::default(), &object)
        .await
        .unwrap();

    let run = cluster.run(&["pool", "upgrade", name]);
    assert_eq!(run.code, 8, "{run}");
    assert!(run.stderr.contains("portpoolshards.portalloc.dev"), "{run}");
    assert!(run.stderr.contains("kubectl portalloc install"), "{run}");
    let untouched = pools.get(name).await.unwrap();
    assert_eq!(untouched.resource_version(), before.resource_version());

    put_crds(&client, vec![PortPoolShard::crd()]).await;
    let run = cluster.run(&["pool", "upgrade", name]);
    assert_eq!(run.code, 8, "{run}");
    assert!(
        run.stderr.contains("dropped status.format") && run.stderr.contains("install"),
        "{run}"
    );
    let status = pools.get(name).await.unwrap().status.unwrap();
    assert_eq!(status, before.status.clone().unwrap(), "holders kept");
    assert!(shards_of(&client, name).await.is_empty());
    // Nor is a pool created sharded there left looking sharded while it is not.
    let created = "created-on-old-crds";
    let run = cluster.run(&[
        "pool",
        "create",
        created,
        "--range",
        "40000-40511",
        "--sharded",
    ]);
    assert_eq!(run.code, 8, "{run}");
    assert!(run.stderr.contains("dropped status.format"), "{run}");

    let run = cluster.run(&["install"]);
    assert!(run.ok(), "{run}");
    // The API server takes a moment to serve a changed schema; a refusal meanwhile is the same
    // safe refusal as above, and a rerun is what a user would do.
    let mut upgraded = cluster.run(&["pool", "upgrade", name]);
    for _ in 0..20 {
        if upgraded.code != 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        upgraded = cluster.run(&["pool", "upgrade", name]);
    }
    assert!(upgraded.ok(), "{upgraded}");
    assert!(
        upgraded.stdout.contains(" upgraded: 6 holders"),
        "{upgraded}"
    );
    assert_upgraded(&client, &before).await;
    // The pool created sharded is finished by an upgrade: its empty shards are already right.
    let run = cluster.run(&["pool", "upgrade", created]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout
            .contains("upgraded: 0 holders copied into 3 PortPoolShards (0 written)"),
        "{run}"
    );
}

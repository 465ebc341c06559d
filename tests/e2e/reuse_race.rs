//! What two clients racing on one new PortAllocation in a pool with `nodeReuse` can leave: its
//! entries in two copies (each client wrote another copy's shard, so neither conflicted). The
//! next sync keeps one copy's, even when it is refused: a workload its pool keeps refusing must
//! not hold a second copy's ports for good (the crash test met that state after `repair` and
//! `sync --all`). The race's outcome is written here directly; the sync is the plugin's.

use std::collections::BTreeSet;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use portalloc::api::{PoolHolder, PortAllocation, PortPoolShard};
use portalloc::ledger::{PoolSnapshot, ShardKey, load_shard, shard_name, status_shards};

use crate::reuse::create_reused_pool;
use crate::support::invariants::{assert_consistent, pool_record};
use crate::support::{self, cli};

/// The window of `reuse::RANGE` (31900-31907).
const WINDOW: u16 = 124;

fn fixed(ns: &str, pool: &str, name: &str, port: u16) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: {name}\n  \
         namespace: {ns}\nspec:\n  pool: {pool}\n  roles:\n  - name: web\n    replicas: 1\n    \
         ports:\n    - {{name: http, scope: RoleScoped, env: HTTP_PORT, port: {port}}}\n"
    )
}

fn create(ns: &str, pool: &str, name: &str, port: u16) {
    let run = cli::run_stdin(
        &["create", "-f", "-", "-n", ns],
        &fixed(ns, pool, name, port),
    );
    assert!(run.ok(), "{run}");
}

/// Add `holder` to copy 1's shard, with its counts, as a racing client's write would.
async fn add_to_copy_1(client: &kube::Client, pool: &str, holder: PoolHolder) {
    let api: Api<PortPoolShard> = Api::all(client.clone());
    let name = shard_name(pool, ShardKey::new(1, WINDOW));
    let mut shard = api.get(&name).await.expect("copy 1's shard");
    let mut status = shard.status.clone().unwrap_or_default();
    status.holders.push(holder);
    shard.status = Some(status);
    let record = pool_record(client, pool).await;
    let snapshot: PoolSnapshot = record.pool.clone();
    let counted = load_shard(&snapshot, &record.layout, WINDOW, shard.clone()).current_status();
    shard.status = Some(counted);
    api.replace_status(&name, &PostParams::default(), &shard)
        .await
        .expect("write copy 1's shard");
}

#[tokio::test]
async fn an_owner_left_in_two_copies_keeps_one_even_when_its_sync_is_refused() {
    // One object's sync (the whole-pool path), and every object's (group commit).
    race_then_sync(false).await;
    race_then_sync(true).await;
}

async fn race_then_sync(all: bool) {
    let client = support::client().await;
    let ns = support::namespace(&client, "reuse-race").await;
    let pool = support::unique_name("reuse-race");
    let sync = |ns: &str| {
        let args = if all {
            ["sync", "--all", "-n", ns]
        } else {
            ["sync", "x", "-n", ns]
        };
        cli::run(&args)
    };
    create_reused_pool(&pool, "2");
    // a holds 31900 in copy 0, so b, asking for it too, gets it in copy 1; x holds 31901.
    create(&ns, &pool, "a", 31900);
    create(&ns, &pool, "b", 31900);
    create(&ns, &pool, "x", 31901);

    // The race's outcome: x also in copy 1, on 31902, its status naming both shards.
    let allocations: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let mut x = allocations.get("x").await.unwrap();
    let uid = x.uid().unwrap();
    let both = BTreeSet::from([ShardKey::new(0, WINDOW), ShardKey::new(1, WINDOW)]);
    let mut status = x.status.take().unwrap_or_default();
    status.shards = status_shards(&both);
    x.status = Some(status);
    allocations
        .replace_status("x", &PostParams::default(), &x)
        .await
        .expect("widen x's status");
    let holder = PoolHolder {
        uid: uid.clone(),
        owner: format!("{ns}/x"),
        ports: "web.http=31902".into(),
    };
    add_to_copy_1(&client, &pool, holder).await;
    assert_eq!(
        pool_record(&client, &pool).await.copies_of(&uid),
        BTreeSet::from([0, 1]),
        "x is in both copies"
    );

    // x now asks for 31900, which a holds in copy 0 and b in copy 1: refused in both.
    let patch = serde_json::json!({"spec": {"roles": [{"name": "web", "replicas": 1, "ports": [
        {"name": "http", "scope": "RoleScoped", "env": "HTTP_PORT", "port": 31900}]}]}});
    allocations
        .patch("x", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("edit x's spec");
    let run = sync(&ns);
    assert_eq!(run.code, 4, "refused: {run}");
    assert!(
        run.stderr.contains(&format!(
            "port 31900 of pool \"{pool}\" is already held by {ns}/a"
        )),
        "the lowest copy's refusal: {run}"
    );

    // Only copy 0's entry is left, and x's status records exactly it.
    let record = pool_record(&client, &pool).await;
    assert_eq!(
        record.copies_of(&uid),
        BTreeSet::from([0]),
        "copy 1's entry went"
    );
    assert_eq!(
        record.holdings_of(&uid).ports().collect::<Vec<_>>(),
        vec![31901]
    );
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings.len(), 3, "a, b and x hold ports: {holdings:?}");
    // Refused again, nothing more to drop: nothing is written.
    let versions = crate::support::invariants::shard_versions(&client, &pool).await;
    let run = sync(&ns);
    assert_eq!(run.code, 4, "{run}");
    assert_eq!(
        crate::support::invariants::shard_versions(&client, &pool).await,
        versions
    );
}

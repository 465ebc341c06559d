//! `kubectl portalloc repair` against the real API server: a recreated pool gets every holding
//! back, leaks are freed, what must not be decided alone is only reported, and repairs racing
//! allocations never take a port from them.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use portalloc::api::{PoolHolder, PortAllocation};
use portalloc::core::Holdings;
use portalloc::ledger::recorded_holdings;

use crate::support::invariants::{
    allocations_of, assert_consistent, pool_uid, set_holders, shard_versions, window_record,
};
use crate::support::{self, cli};

fn group(name: &str, pool: &str) -> String {
    format!(
        r#"apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata:
  name: {name}
spec:
  pool: {pool}
  roles:
  - name: router
    replicas: 1
    ports:
    - {{name: http, scope: RoleScoped, env: ROUTER_PORT}}
  - name: prefill
    replicas: 3
    ports:
    - {{name: http, scope: PodScoped, env: PREFILL_PORT}}
    - {{name: bootstrap, scope: PodScoped, env: BOOTSTRAP_PORT}}
"#
    )
}

fn holder(uid: &str, owner: &str, ports: &str) -> PoolHolder {
    PoolHolder {
        uid: uid.into(),
        owner: owner.into(),
        ports: ports.into(),
    }
}

/// Holdings by UID as the live PortAllocations' statuses record them.
async fn recorded_by_uid(client: &Client, pool: &str) -> BTreeMap<String, Holdings> {
    allocations_of(client, pool)
        .await
        .into_iter()
        .map(|(uid, pa)| {
            (
                uid,
                pa.status
                    .as_ref()
                    .map(recorded_holdings)
                    .unwrap_or_default(),
            )
        })
        .filter(|(_, h)| !h.is_empty())
        .collect()
}

#[tokio::test]
async fn a_pool_deleted_and_created_again_gets_every_holding_back() {
    let client = support::client().await;
    let ns = support::namespace(&client, "repair-recreate").await;
    let pool = support::unique_name("repair-recreate");
    support::create_pool(&pool, "33000-33199");
    for name in ["pd-a", "pd-b", "pd-c"] {
        let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &group(name, &pool));
        assert!(run.ok(), "{run}");
    }
    let before = assert_consistent(&client, &pool).await;
    assert_eq!(before.values().map(Holdings::len).sum::<usize>(), 21);
    let old_uid = pool_uid(&client, &pool).await;

    let run = cli::run(&["pool", "delete", &pool, "--force"]);
    assert!(run.ok(), "{run}");
    support::create_pool(&pool, "33000-33199");
    let record = window_record(&client, &pool).await;
    assert_ne!(record.pool_uid(), old_uid, "a new pool object");
    assert!(record.holders.is_empty());
    let version = shard_versions(&client, &pool).await;

    // Dry run: says what it would restore, writes nothing, exit 10.
    let run = cli::run(&["repair", "--pool", &pool]);
    assert_eq!(run.code, 10, "{run}");
    assert_eq!(run.stdout.matches("restore  pool/").count(), 3, "{run}");
    assert!(
        run.stdout
            .contains(&format!("pool/{pool}  {ns}/pd-a (uid ")),
        "{run}"
    );
    assert!(run.stderr.contains("--apply"), "{run}");
    assert_eq!(
        shard_versions(&client, &pool).await,
        version,
        "a dry run wrote the pool"
    );

    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("applied 3 changes"), "{run}");
    // Each restored PortAllocation is synced, and nothing moves.
    assert_eq!(run.stdout.matches("(unchanged)").count(), 3, "{run}");

    let after = assert_consistent(&client, &pool).await;
    assert_eq!(after, before, "every holding came back exactly");
    let new_uid = pool_uid(&client, &pool).await;
    for pa in allocations_of(&client, &pool).await.values() {
        let status = pa.status.as_ref().unwrap();
        assert_eq!(status.pool_uid.as_deref(), Some(new_uid.as_str()));
        assert_eq!(status.ports.as_deref(), Some("7/7"));
    }
    let run = cli::run(&["repair", "--pool", &pool]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout.contains("consistent (3 holders, 21 ports held)"),
        "{run}"
    );
}

#[tokio::test]
async fn leaked_entries_are_freed_and_live_ones_kept() {
    let client = support::client().await;
    let ns = support::namespace(&client, "repair-leak").await;
    let pool = support::unique_name("repair-leak");
    support::create_pool(&pool, "33200-33299");
    for name in ["keep", "gone"] {
        let manifest = support::simple_allocation(name, &pool, "worker", 2, &["rpc"]);
        assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &manifest).ok());
    }
    // Deleted behind the plugin's back: its entry leaks.
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let gone_uid = api.get("gone").await.unwrap().uid().unwrap();
    api.delete("gone", &DeleteParams::default()).await.unwrap();
    // And an entry of an object that never existed, and one nobody can read.
    let mut holders = window_record(&client, &pool).await.entries().to_vec();
    holders.push(holder(
        "00000000-dead-beef-0000-000000000000",
        &format!("{ns}/ghost"),
        "w.rpc=33290",
    ));
    holders.push(holder(
        "00000000-dead-beef-0000-000000000001",
        &format!("{ns}/garbled"),
        "not holdings",
    ));
    set_holders(&client, &pool, holders).await;

    let run = cli::run(&["repair", "--pool", &pool, "-o", "json"]);
    assert_eq!(run.code, 10, "{run}");
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    let changes = report[0]["changes"].as_array().unwrap();
    let mut freed: Vec<&str> = changes
        .iter()
        .filter(|c| c["action"] == "free")
        .map(|c| c["owner"].as_str().unwrap())
        .collect();
    freed.sort();
    let expected = [
        format!("{ns}/garbled"),
        format!("{ns}/ghost"),
        format!("{ns}/gone"),
    ];
    assert_eq!(
        freed,
        expected.iter().map(String::as_str).collect::<Vec<_>>(),
        "{run}"
    );
    assert!(changes.iter().any(|c| c["uid"] == gone_uid.as_str()));
    assert_eq!(report[0]["applied"], false);

    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout.contains(&format!(
            "free     pool/{pool}  {ns}/gone (uid {gone_uid})  2 ports: worker.rpc="
        )),
        "{run}"
    );
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings, recorded_by_uid(&client, &pool).await);
    assert_eq!(holdings.len(), 1);
    assert!(cli::run(&["repair", "--pool", &pool]).ok());
}

#[tokio::test]
async fn duplicates_and_stale_statuses_are_reported_and_left_alone() {
    let client = support::client().await;
    let ns = support::namespace(&client, "repair-report").await;
    let pool = support::unique_name("repair-report");
    support::create_pool(&pool, "33300-33309");
    for name in ["a", "b", "c"] {
        let manifest = support::simple_allocation(name, &pool, "worker", 1, &["rpc"]);
        assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &manifest).ok());
    }
    let record = window_record(&client, &pool).await;
    let live = allocations_of(&client, &pool).await;
    let uid_of = |name: &str| {
        live.iter()
            .find(|(_, pa)| pa.name_any() == name)
            .map(|(uid, _)| uid.clone())
            .unwrap()
    };
    let a_port = record.holdings_of(&uid_of("a")).ports().next().unwrap();
    // b is made to hold a's port too; c's entry is lost while its status still names this
    // pool object (what an interrupted release leaves).
    set_holders(
        &client,
        &pool,
        vec![
            holder(
                &uid_of("a"),
                &format!("{ns}/a"),
                &format!("worker.rpc={a_port}"),
            ),
            holder(
                &uid_of("b"),
                &format!("{ns}/b"),
                &format!("worker.rpc={a_port}"),
            ),
        ],
    )
    .await;
    let version = shard_versions(&client, &pool).await;

    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    for needle in [
        format!("warning  pool/{pool}  port {a_port} is held by both {ns}/a and {ns}/b"),
        format!("kubectl portalloc release b -n {ns} --role ROLE"),
        format!("stale    pool/{pool}  {ns}/c: its status records worker.rpc="),
        format!("kubectl portalloc sync c -n {ns}"),
    ] {
        assert!(run.stdout.contains(&needle), "{needle:?} missing: {run}");
    }
    assert_eq!(
        shard_versions(&client, &pool).await,
        version,
        "nothing for repair to change, so nothing written"
    );
    let run = cli::run(&["repair", "--pool", &pool]);
    assert_eq!(run.code, 10, "findings alone make a dry run exit 10: {run}");
}

/// Repairs and allocations at the same moment: the compare-and-swap on the pool's
/// resourceVersion means repair re-reads instead of overwriting a fresh allocation.
#[tokio::test]
async fn repairs_racing_allocations_never_take_their_ports() {
    let client = support::client().await;
    let ns = support::namespace(&client, "repair-race").await;
    let pool = support::unique_name("repair-race");
    support::create_pool(&pool, "33400-33599");
    // Leaks for the repairs to free while allocations land.
    let leaks: Vec<PoolHolder> = (0..6)
        .map(|i| {
            holder(
                &format!("00000000-0000-0000-0000-00000000000{i}"),
                &format!("{ns}/leak-{i}"),
                &format!("w.rpc={}", 33590 + i),
            )
        })
        .collect();
    set_holders(&client, &pool, leaks).await;

    let kubeconfig = &support::cluster().kubeconfig;
    let dir = tempfile::tempdir().unwrap();
    let mut children = Vec::new();
    for i in 0..10 {
        let path = dir.path().join(format!("{i}.yaml"));
        std::fs::write(
            &path,
            support::simple_allocation(&format!("job-{i}"), &pool, "worker", 3, &["rpc"]),
        )
        .unwrap();
        let args = vec![
            "create".to_string(),
            "-f".into(),
            path.to_string_lossy().into_owned(),
            "-n".into(),
            ns.clone(),
        ];
        children.push(("create", args));
        if i % 2 == 0 {
            children.push((
                "repair",
                vec![
                    "repair".into(),
                    "--pool".into(),
                    pool.clone(),
                    "--apply".into(),
                    "-v".into(),
                    "1".into(),
                ],
            ));
        }
    }
    let spawned: Vec<_> = children
        .into_iter()
        .map(|(what, args)| {
            let child = Command::new(cli::BIN)
                .args(&args)
                .env("KUBECONFIG", kubeconfig)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (what, child)
        })
        .collect();
    let mut retried = 0;
    for (what, child) in spawned {
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{what} failed: {}\n{stderr}",
            String::from_utf8_lossy(&output.stdout)
        );
        retried += stderr.matches("409 Conflict").count();
    }
    eprintln!("repair race: 10 allocations, 5 repairs, {retried} repair conflicts retried");
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(
        holdings.len(),
        10,
        "every allocation kept, every leak freed"
    );
    assert!(holdings.values().all(|h| h.len() == 3));
    assert_eq!(holdings, recorded_by_uid(&client, &pool).await);
}

/// A status left behind by an interrupted release must not survive a later failed sync: the
/// failure is recorded with the holdings the pool gives the object, not the stale ones.
#[tokio::test]
async fn a_failed_sync_stops_claiming_ports_the_pool_no_longer_gives() {
    let client = support::client().await;
    let ns = support::namespace(&client, "repair-stale-failure").await;
    let pool = support::unique_name("repair-stale-failure");
    support::create_pool(&pool, "33600-33609");
    let manifest = support::simple_allocation("a", &pool, "web", 3, &["http"]);
    assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &manifest).ok());
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let a = api.get("a").await.unwrap();
    let claimed = recorded_holdings(a.status.as_ref().unwrap());
    let port = claimed.ports().next().unwrap();
    // What a release killed after its shard write leaves: no entry, the old status.
    set_holders(&client, &pool, vec![]).await;
    // Someone else takes one of those ports, legitimately.
    let b = format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: b\nspec:\n  pool: {pool}\n  roles:\n  - name: ctl\n    replicas: 1\n    ports:\n    - {{name: admin, scope: RoleScoped, env: ADMIN, port: {port}}}\n"
    );
    assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &b).ok());
    // a now asks for the same port (applied by GitOps): its sync is refused, and that failure
    // is recorded on it.
    let mut changed = api.get("a").await.unwrap();
    changed.spec.roles[0]
        .ports
        .push(portalloc::api::PortRequest {
            name: "admin".into(),
            scope: portalloc::api::PortScope::RoleScoped,
            env: "ADMIN_PORT".into(),
            port: Some(i32::from(port)),
            ..Default::default()
        });
    api.replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    let run = cli::run(&["sync", "a", "-n", &ns]);
    assert_eq!(run.code, 4, "{run}");
    let status = api.get("a").await.unwrap().status.unwrap();
    assert_eq!(
        status.phase.map(|p| p.to_string()).as_deref(),
        Some("Failed")
    );
    assert!(
        recorded_holdings(&status).is_empty(),
        "the failed object still claims ports the pool gives to nobody or to b: {:?}",
        status.assignments
    );
}

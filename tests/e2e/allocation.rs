//! The allocation engine through the CLI, against the real API server: scopes, several roles,
//! requested ports, scaling, re-sync stability, release, delete, several pools, protocols, and the
//! refusals that must change nothing.

use std::collections::BTreeSet;

use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use portalloc::api::{PoolHolder, PortAllocation};
use portalloc::core::{Holdings, SlotKey};
use portalloc::ledger::recorded_holdings;

use crate::support::invariants::{assert_consistent, window_record};
use crate::support::{self, cli};

fn sglang(name: &str, pool: &str, decode_replicas: u32, metrics_port: u16) -> String {
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
    replicas: 2
    ports:
    - {{name: http, scope: PodScoped, env: PREFILL_PORT}}
    - {{name: bootstrap, scope: PodScoped, env: BOOTSTRAP_PORT}}
    references:
    - {{env: ROUTER_PORT, from: router.http}}
  - name: decode
    replicas: {decode_replicas}
    ports:
    - {{name: http, scope: PodScoped, env: DECODE_PORT}}
    - {{name: metrics, scope: RoleScoped, env: METRICS_PORT, port: {metrics_port}}}
    references:
    - {{env: PREFILL_BOOTSTRAP_PORTS, from: "prefill.bootstrap[*]"}}
"#
    )
}

async fn get_pa(client: &Client, ns: &str, name: &str) -> PortAllocation {
    Api::<PortAllocation>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
}

fn slot(role: &str, port: &str, index: u32) -> SlotKey {
    SlotKey::new(role, port, index)
}

#[tokio::test]
async fn role_and_pod_scoped_ports_with_a_requested_port() {
    let client = support::client().await;
    let ns = support::namespace(&client, "scopes").await;
    let pool = support::unique_name("scopes");
    support::create_pool(&pool, "31000-31099");
    let run = cli::run_stdin(
        &["create", "-f", "-", "-n", &ns],
        &sglang("pd", &pool, 3, 31005),
    );
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("9 ports held"), "{run}");

    let holdings = assert_consistent(&client, &pool).await;
    let pa = get_pa(&client, &ns, "pd").await;
    let status = pa.status.as_ref().unwrap();
    assert_eq!(status.ports.as_deref(), Some("9/9"));
    assert_eq!(
        status.phase.map(|p| p.to_string()).as_deref(),
        Some("Allocated")
    );
    let mine = recorded_holdings(status);
    assert_eq!(holdings[&pa.uid().unwrap()], mine);
    // One RoleScoped port per role, one PodScoped port per index, the requested one honoured.
    assert_eq!(mine.len(), 1 + 2 * 2 + 3 + 1);
    assert_eq!(mine.get(&slot("decode", "metrics", 0)), Some(31005));
    assert!(mine.get(&slot("router", "http", 1)).is_none());
    let distinct: BTreeSet<u16> = mine.ports().collect();
    assert_eq!(
        distinct.len(),
        mine.len(),
        "ports within one allocation are distinct"
    );
    assert!(mine.ports().all(|p| (31000..=31099).contains(&p)));
    // Every write is filed under our field manager, as kubectl files its own ("unknown" is what
    // the API server records when a client names none).
    let managers = |meta: &kube::api::ObjectMeta| -> Vec<(String, String)> {
        let entries = meta.managed_fields.clone().unwrap_or_default();
        entries
            .into_iter()
            .map(|m| {
                (
                    m.manager.unwrap_or_default(),
                    m.subresource.unwrap_or_default(),
                )
            })
            .collect()
    };
    let expected = |subresources: &[&str]| -> Vec<(String, String)> {
        let named = subresources.iter();
        named
            .map(|s| ("kubectl-portalloc".into(), s.to_string()))
            .collect()
    };
    assert_eq!(managers(&pa.metadata), expected(&["", "status"]));
    let shards = Api::<portalloc::api::PortPoolShard>::all(client.clone());
    let shard = shards
        .get(&format!("{pool}-{}", 31000 / 256))
        .await
        .unwrap();
    assert_eq!(managers(&shard.metadata), expected(&["", "status"]));
    // Automatic ports come from the dynamic band while it has room (static band: 16 ports).
    assert!(
        mine.iter()
            .filter(|(s, _)| s.port != "metrics")
            .all(|(_, p)| p.first >= 31016),
        "{mine:?}"
    );
}

#[tokio::test]
async fn resync_is_stable_and_writes_nothing() {
    let client = support::client().await;
    let ns = support::namespace(&client, "stable").await;
    let pool = support::unique_name("stable");
    support::create_pool(&pool, "31100-31199");
    let manifest = sglang("pd", &pool, 2, 31110);
    assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &manifest).ok());
    let before = get_pa(&client, &ns, "pd").await;
    let pool_before = crate::support::invariants::shard_versions(&client, &pool).await;

    for args in [
        vec!["create", "-f", "-", "-n", &ns],
        vec!["sync", "pd", "-n", &ns],
    ] {
        let run = cli::run_stdin(&args, &manifest);
        assert!(run.ok(), "{run}");
        assert!(run.stdout.contains("(unchanged)"), "{run}");
    }
    let run = cli::run(&["sync", "--all", "-n", &ns]);
    assert!(run.ok(), "{run}");

    let after = get_pa(&client, &ns, "pd").await;
    let pool_after = crate::support::invariants::shard_versions(&client, &pool).await;
    assert_eq!(before.status, after.status);
    assert_eq!(
        before.resource_version(),
        after.resource_version(),
        "re-sync rewrote the PortAllocation"
    );
    assert_eq!(pool_before, pool_after, "re-sync rewrote the pool");
}

#[tokio::test]
async fn scaling_keeps_surviving_ports_and_frees_exactly_the_removed_ones() {
    let client = support::client().await;
    let ns = support::namespace(&client, "scale").await;
    let pool = support::unique_name("scale");
    support::create_pool(&pool, "31200-31299");
    let create = |replicas| {
        let run = cli::run_stdin(
            &["create", "-f", "-", "-n", &ns],
            &sglang("pd", &pool, replicas, 31201),
        );
        assert!(run.ok(), "{run}");
    };
    create(3);
    let three = recorded_holdings(get_pa(&client, &ns, "pd").await.status.as_ref().unwrap());

    create(5);
    let five = recorded_holdings(get_pa(&client, &ns, "pd").await.status.as_ref().unwrap());
    for (slot, port) in three.iter() {
        assert_eq!(five.block(slot), Some(port), "scale-up moved {slot}");
    }
    assert_eq!(five.len(), three.len() + 2);

    create(2);
    let two = recorded_holdings(get_pa(&client, &ns, "pd").await.status.as_ref().unwrap());
    let expected: Holdings = five
        .iter()
        .filter(|(s, _)| !(s.role == "decode" && s.port == "http" && s.index >= 2))
        .map(|(s, p)| (s.clone(), p))
        .collect();
    assert_eq!(
        two, expected,
        "scale-down must release exactly indices 2..4 of decode.http"
    );
    let record = window_record(&client, &pool).await;
    for removed in [2, 3, 4] {
        let port = five.get(&slot("decode", "http", removed)).unwrap();
        assert!(
            !record.state.is_held(port),
            "port {port} of removed index {removed} is still held"
        );
    }
    assert_consistent(&client, &pool).await;

    // Scaling a role to zero releases all its ports, RoleScoped ones included.
    create(0);
    let zero = recorded_holdings(get_pa(&client, &ns, "pd").await.status.as_ref().unwrap());
    assert!(zero.iter().all(|(s, _)| s.role != "decode"), "{zero:?}");
    assert_consistent(&client, &pool).await;
}

#[tokio::test]
async fn release_and_delete_give_ports_back() {
    let client = support::client().await;
    let ns = support::namespace(&client, "release").await;
    let pool = support::unique_name("release");
    support::create_pool(&pool, "31300-31399");
    assert!(
        cli::run_stdin(
            &["create", "-f", "-", "-n", &ns],
            &sglang("pd", &pool, 2, 31301)
        )
        .ok()
    );
    let uid = get_pa(&client, &ns, "pd").await.uid().unwrap();

    let run = cli::run(&["release", "pd", "--role", "decode", "-n", &ns]);
    assert!(run.ok(), "{run}");
    let held = window_record(&client, &pool).await.holdings_of(&uid);
    assert!(
        held.iter().all(|(s, _)| s.role != "decode") && !held.is_empty(),
        "{held:?}"
    );
    let status = get_pa(&client, &ns, "pd").await.status.unwrap();
    assert_eq!(
        status.phase.map(|p| p.to_string()).as_deref(),
        Some("Pending")
    );
    assert_consistent(&client, &pool).await;

    let run = cli::run(&["release", "pd", "--role", "nosuch", "-n", &ns]);
    assert_eq!(run.code, 7, "{run}");
    assert!(run.stderr.contains("has no role \"nosuch\""), "{run}");

    assert!(cli::run(&["sync", "pd", "-n", &ns]).ok());
    let run = cli::run(&["pool", "delete", &pool]);
    assert_eq!(
        run.code, 4,
        "pool delete must refuse while ports are held: {run}"
    );
    assert!(run.stderr.contains(&format!("{ns}/pd")), "{run}");

    let run = cli::run(&["delete", "pd", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("8 ports released"), "{run}");
    let record = window_record(&client, &pool).await;
    assert!(record.holders.is_empty());
    assert_eq!(record.state.held_count(), 0);
    assert!(
        Api::<PortAllocation>::namespaced(client.clone(), &ns)
            .get_opt("pd")
            .await
            .unwrap()
            .is_none()
    );

    let run = cli::run(&["pool", "delete", &pool]);
    assert!(run.ok(), "{run}");
}

#[tokio::test]
async fn pools_and_protocols_are_independent() {
    let client = support::client().await;
    let ns = support::namespace(&client, "protocols").await;
    let tcp = support::unique_name("tcp");
    let udp = support::unique_name("udp");
    // Same numbers, different protocols: a port may be held in both.
    let pools = format!(
        "{}---\n{}",
        support::pool_yaml(&tcp, "\"31400-31401\"", "TCP"),
        support::pool_yaml(&udp, "\"31400-31401\"", "UDP")
    );
    assert!(cli::run_stdin(&["create", "-f", "-"], &pools).ok());
    let allocations = format!(
        "{}---\n{}",
        support::simple_allocation("over-tcp", &tcp, "worker", 2, &["rpc"]),
        support::simple_allocation("over-udp", &udp, "worker", 2, &["rpc"])
    );
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &allocations);
    assert!(run.ok(), "{run}");
    for pool in [&tcp, &udp] {
        let holdings = assert_consistent(&client, pool).await;
        let ports: BTreeSet<u16> = holdings
            .values()
            .flat_map(|h| h.ports().collect::<Vec<_>>())
            .collect();
        assert_eq!(ports, BTreeSet::from([31400, 31401]), "pool {pool}");
    }
}

#[tokio::test]
async fn refusals_name_the_cause_and_change_nothing() {
    let client = support::client().await;
    let ns = support::namespace(&client, "refusals").await;
    let pool = support::unique_name("refuse");
    support::create_pool(&pool, "31500-31509");
    assert!(
        cli::run_stdin(
            &["create", "-f", "-", "-n", &ns],
            &sglang("owner", &pool, 1, 31502)
        )
        .ok()
    );
    let before = crate::support::invariants::shard_versions(&client, &pool).await;

    // A requested port someone else holds: the holder is named.
    let thief = sglang("thief", &pool, 1, 31502);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &thief);
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr.contains(&format!(
            "port 31502 of pool \"{pool}\" is already held by {ns}/owner"
        )),
        "{run}"
    );
    assert!(run.stderr.contains("role decode, port metrics"), "{run}");

    // More than the pool has: size, use and holders are named.
    let greedy = support::simple_allocation("greedy", &pool, "worker", 20, &["rpc"]);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &greedy);
    assert_eq!(run.code, 4, "{run}");
    for needle in [
        "pool is full: it has 10 ports, 7 in use and 3 free, but this allocation needs 20",
        "nothing was allocated",
        &format!("{ns}/owner (7 ports)"),
    ] {
        assert!(run.stderr.contains(needle), "{needle:?} missing: {run}");
    }

    // A pool that does not exist.
    let orphan = support::simple_allocation("orphan", "no-such-pool", "worker", 1, &["rpc"]);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &orphan);
    assert_eq!(run.code, 3, "{run}");
    assert!(
        run.stderr.contains("PortPool \"no-such-pool\" not found"),
        "{run}"
    );

    let after = crate::support::invariants::shard_versions(&client, &pool).await;
    assert_eq!(before, after, "a refusal wrote the pool");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    for name in ["thief", "greedy", "orphan"] {
        assert!(
            api.get_opt(name).await.unwrap().is_none(),
            "refused {name} was left behind"
        );
    }
    assert_consistent(&client, &pool).await;
}

/// A client killed after its shard write but before its status write: the next sync completes
/// the status from the pool entry without moving a port.
#[tokio::test]
async fn sync_completes_an_allocation_interrupted_after_the_pool_write() {
    let client = support::client().await;
    let ns = support::namespace(&client, "interrupted").await;
    let pool = support::unique_name("interrupted");
    support::create_pool(&pool, "31600-31699");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let manifest = support::simple_allocation("half", &pool, "worker", 2, &["rpc"]);
    let pa: PortAllocation = serde_yaml::from_str(&manifest).unwrap();
    let pa = api.create(&PostParams::default(), &pa).await.unwrap();
    // What the killed client committed: its pool entry, and nothing else.
    crate::support::invariants::set_holders(
        &client,
        &pool,
        vec![PoolHolder {
            uid: pa.uid().unwrap(),
            owner: format!("{ns}/half"),
            ports: "worker.rpc=31650,31677".into(),
        }],
    )
    .await;

    let run = cli::run(&["sync", "half", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout.contains("(unchanged)"),
        "sync must not reallocate: {run}"
    );
    let status = api.get("half").await.unwrap().status.unwrap();
    assert_eq!(status.assignments[0].values, vec![31650, 31677]);
    assert_eq!(status.ports.as_deref(), Some("2/2"));
}

#[tokio::test]
async fn gitops_applied_allocations_get_ports_from_sync_all() {
    let client = support::client().await;
    let ns = support::namespace(&client, "gitops").await;
    let pool = support::unique_name("gitops");
    support::create_pool(&pool, "31700-31799");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    for name in ["a", "b", "c"] {
        let manifest = support::simple_allocation(name, &pool, "worker", 3, &["rpc", "metrics"]);
        let pa: PortAllocation = serde_yaml::from_str(&manifest).unwrap();
        api.create(&PostParams::default(), &pa).await.unwrap();
    }
    let run = cli::run(&["sync", "--all", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert_eq!(run.stdout.matches("(6 allocated)").count(), 3, "{run}");
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings.values().map(Holdings::len).sum::<usize>(), 18);

    let run = cli::run(&["get", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert_eq!(run.stdout.matches("Allocated").count(), 3, "{run}");
}

/// Scaling every role to 0 with a plain apply (as GitOps does), then `sync`: every port is given
/// back and the object is Allocated with 0 of 0 ports. Nobody ran `release`, so the status must
/// not say so.
#[tokio::test]
async fn scaling_every_role_to_zero_and_syncing_is_allocated_not_released() {
    let client = support::client().await;
    let ns = support::namespace(&client, "zero").await;
    let pool = support::unique_name("zero");
    support::create_pool(&pool, "31800-31819");
    let manifest = support::simple_allocation("z", &pool, "worker", 3, &["rpc"]);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &manifest);
    assert!(run.ok(), "{run}");

    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let mut pa = get_pa(&client, &ns, "z").await;
    pa.spec.roles[0].replicas = 0;
    api.replace("z", &PostParams::default(), &pa).await.unwrap();
    let run = cli::run(&["sync", "z", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("(3 released)"), "{run}");

    let status = get_pa(&client, &ns, "z").await.status.unwrap();
    let condition = &status.conditions[0];
    assert_eq!(
        (
            status.phase.map(|p| p.to_string()),
            status.ports.as_deref(),
            condition.status.as_str(),
            condition.reason.as_str()
        ),
        (Some("Allocated".into()), Some("0/0"), "True", "Allocated"),
        "{status:?}"
    );
    assert!(recorded_holdings(&status).is_empty());
    let holdings = assert_consistent(&client, &pool).await;
    assert!(holdings.values().all(Holdings::is_empty), "{holdings:?}");

    // `release` still says what it did.
    pa = get_pa(&client, &ns, "z").await;
    pa.spec.roles[0].replicas = 2;
    api.replace("z", &PostParams::default(), &pa).await.unwrap();
    assert!(cli::run(&["sync", "z", "-n", &ns]).ok());
    assert!(cli::run(&["release", "z", "-n", &ns]).ok());
    let status = get_pa(&client, &ns, "z").await.status.unwrap();
    assert_eq!(status.conditions[0].reason, "Released", "{status:?}");
}

//! Group commit: `sync --all -A` allocates every PortAllocation of a pool with one write per
//! changed shard, and a refusal stays with its own PortAllocation. On a control plane of its
//! own, since `-A` syncs every object in the cluster.

use std::collections::{BTreeMap, BTreeSet};

use kube::Client;
use kube::api::{Api, PostParams};
use portalloc::api::PortAllocation;
use portalloc::ledger::recorded_holdings;

use crate::support::invariants::{allocations_of, assert_consistent};
use crate::support::private_cluster::PrivateCluster;
use crate::support::simple_allocation;

const FRESH: usize = 200;

async fn create(client: &Client, ns: &str, yaml: &str) {
    let pa: PortAllocation = serde_yaml::from_str(yaml).unwrap();
    Api::<PortAllocation>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pa)
        .await
        .unwrap();
}

fn fixed(name: &str, pool: &str, port: u16) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: {name}\nspec:\n  pool: {pool}\n  roles:\n  - name: web\n    replicas: 1\n    ports: [{{name: http, scope: RoleScoped, env: HTTP_PORT, port: {port}}}]\n"
    )
}

/// `PUT .../portpoolshards/<pool>-<k>/status` lines of a `-v 2` request log, by shard.
fn shard_writes(stderr: &str, pool: &str) -> BTreeMap<String, usize> {
    let put = format!("PUT /apis/portalloc.dev/v1alpha1/portpoolshards/{pool}-");
    let mut writes = BTreeMap::new();
    for line in stderr.lines() {
        if let Some(rest) = line.split(&put).nth(1)
            && let Some((k, _)) = rest.split_once("/status")
        {
            *writes.entry(k.to_string()).or_default() += 1;
        }
    }
    writes
}

/// The PortAllocations whose status a `-v 2` request log shows written.
fn status_writes(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains("PUT /apis/portalloc.dev/v1alpha1/namespaces/"))
        .filter_map(|l| l.split("/portallocations/").nth(1))
        .filter_map(|rest| rest.split_once("/status").map(|(name, _)| name.to_string()))
        .collect()
}

fn reason(pa: &PortAllocation) -> String {
    pa.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| format!("{}/{}", c.status, c.reason))
        .unwrap_or_else(|| "no Ready condition".into())
}

#[tokio::test]
async fn sync_all_commits_each_pool_once_and_keeps_refusals_to_themselves() {
    let Some(cluster) = PrivateCluster::start("group-commit", true) else {
        return;
    };
    let client = cluster.client().await;
    for (pool, range) in [("big", "20000-20999"), ("tiny", "21000-21004")] {
        let run = cluster.run(&["pool", "create", pool, "--range", range]);
        assert!(run.ok(), "{run}");
    }
    for ns in ["team-a", "team-b"] {
        crate::support::create_namespace(&client, ns).await;
    }
    // Already allocated before the batch: it holds 20999.
    create(&client, "team-a", &fixed("owner", "big", 20999)).await;
    let run = cluster.run(&["sync", "owner", "-n", "team-a"]);
    assert!(run.ok(), "{run}");

    // Fresh, as `kubectl apply` leaves them: 200 in two namespaces, two ports each.
    for i in 0..FRESH {
        let ns = if i % 2 == 0 { "team-a" } else { "team-b" };
        let name = format!("job-{i:03}");
        create(
            &client,
            ns,
            &simple_allocation(&name, "big", "web", 2, &["http"]),
        )
        .await;
    }
    // Refusals among them: a port already held, a missing pool, and a pool too small for one
    // of four (5 ports: 2 + 2 fit, the third 2 does not, the last 1 still fits after it).
    create(&client, "team-b", &fixed("clash", "big", 20999)).await;
    create(
        &client,
        "team-b",
        &simple_allocation("nowhere", "no-such-pool", "web", 1, &["http"]),
    )
    .await;
    for (name, replicas) in [("t1", 2), ("t2", 2), ("t3", 2), ("t4", 1)] {
        create(
            &client,
            "team-a",
            &simple_allocation(name, "tiny", "web", replicas, &["http"]),
        )
        .await;
    }

    let run = cluster.run(&["sync", "--all", "-A", "-v", "2"]);
    assert_eq!(run.code, 4, "refusals exit 4: {run}");
    assert!(
        run.stderr
            .contains("3 of 207 PortAllocations could not be synced"),
        "{run}"
    );
    // Each shard once per pass at most: within the owners' homes (naming there the owners
    // placed elsewhere), then the overflow, and once more to stop naming them once their
    // statuses do. "big" (20000-20999) is windows 78-82; "tiny" lies in window 82 alone.
    let big_writes = shard_writes(&run.stderr, "big");
    assert!(
        big_writes.len() <= 5 && big_writes.values().all(|&n| n <= 3),
        "{big_writes:?}"
    );
    assert_eq!(
        shard_writes(&run.stderr, "tiny").values().sum::<usize>(),
        1,
        "{run}"
    );

    // Every fresh one allocated, nothing held twice, statuses equal to the pool entries.
    let big = assert_consistent(&client, "big").await;
    let tiny = assert_consistent(&client, "tiny").await;
    let live = allocations_of(&client, "big").await;
    let mut ports = BTreeSet::new();
    for pa in live.values() {
        let name = pa.metadata.name.as_deref().unwrap();
        let held = pa
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default();
        if name == "clash" {
            assert_eq!(reason(pa), "False/PortHeld", "{name}");
            assert!(held.is_empty());
            continue;
        }
        assert_eq!(reason(pa), "True/Allocated", "{name}");
        assert_eq!(held.len(), if name == "owner" { 1 } else { 2 }, "{name}");
        ports.extend(held.ports());
    }
    assert_eq!(ports.len(), 2 * FRESH + 1);
    assert_eq!(big.len(), FRESH + 1);
    let tiny_live = allocations_of(&client, "tiny").await;
    let mut tiny_reasons: Vec<(String, String)> = tiny_live
        .values()
        .map(|pa| (pa.metadata.name.clone().unwrap(), reason(pa)))
        .collect();
    tiny_reasons.sort();
    assert_eq!(
        tiny_reasons,
        [
            ("t1", "True/Allocated"),
            ("t2", "True/Allocated"),
            ("t3", "False/PoolFull"),
            ("t4", "True/Allocated"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(tiny.values().map(|h| h.len()).sum::<usize>(), 5);
    let nowhere = Api::<PortAllocation>::namespaced(client.clone(), "team-b")
        .get("nowhere")
        .await
        .unwrap();
    assert_eq!(reason(&nowhere), "False/PoolNotFound");

    let first_writes = status_writes(&run.stderr);
    // Every object but `owner` (allocated before) gets its status written once; an owner whose
    // home had no room also once before, naming the shard it goes to (the kill-safe order).
    let mut per_object: BTreeMap<&String, usize> = BTreeMap::new();
    for name in &first_writes {
        *per_object.entry(name).or_default() += 1;
    }
    assert_eq!(per_object.len(), 206, "{run}");
    assert!(per_object.values().all(|&n| n <= 2), "{per_object:?}");
    let widened = per_object.values().filter(|&&n| n == 2).count();
    eprintln!("batch: {widened} of 206 left their home shard");

    // Again: nothing to do, so no shard write and no status write, but t3's: its PoolFull message
    // names the pool's holders, and t4 joined them after t3 was refused (one by one, the same).
    let again = cluster.run(&["sync", "--all", "-A", "-v", "2"]);
    assert_eq!(again.code, 4, "{again}");
    assert!(shard_writes(&again.stderr, "big").is_empty(), "{again}");
    assert!(shard_writes(&again.stderr, "tiny").is_empty(), "{again}");
    assert!(
        status_writes(&again.stderr).iter().all(|name| name == "t3"),
        "{again}"
    );
    assert_eq!(assert_consistent(&client, "big").await, big);
}

/// More PortAllocations than one page of a list (500): `sync --all` reads them in pages of one
/// snapshot and allocates every one, in the same shard writes as one list would give.
#[tokio::test]
async fn sync_all_reads_allocations_in_pages() {
    const COUNT: usize = 1_100;
    let client = crate::support::client().await;
    let ns = crate::support::namespace(&client, "pages").await;
    let pool = crate::support::unique_name("pages");
    crate::support::create_pool(&pool, "45000-46999");
    let yaml = simple_allocation("x", &pool, "web", 1, &["http"]);
    let template: PortAllocation = serde_yaml::from_str(&yaml).unwrap();
    let api = Api::<PortAllocation>::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..COUNT).map(|i| format!("job-{i:04}")).collect();
    for chunk in names.chunks(50) {
        let creates = chunk.iter().map(|name| {
            let mut pa = template.clone();
            pa.metadata.name = Some(name.clone());
            let api = api.clone();
            async move { api.create(&PostParams::default(), &pa).await.unwrap() }
        });
        futures::future::join_all(creates).await;
    }

    let run = crate::support::cli::run(&["sync", "--all", "-n", &ns, "-v", "2"]);
    assert!(run.ok(), "{run}");
    let lists: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| {
            l.contains(&format!(
                "GET /apis/portalloc.dev/v1alpha1/namespaces/{ns}/portallocations?"
            ))
        })
        .collect();
    assert_eq!(lists.len(), 3, "1,100 objects are three pages: {lists:#?}");
    assert!(lists.iter().all(|l| l.contains("limit=500")), "{lists:#?}");
    assert!(
        lists[1..].iter().all(|l| l.contains("continue=")),
        "{lists:#?}"
    );
    // Each of the pool's 9 windows at most once per pass, as with one list.
    let writes = shard_writes(&run.stderr, &pool);
    assert!(
        writes.len() <= 9 && writes.values().all(|&n| n <= 2),
        "{writes:?}"
    );
    assert_eq!(status_writes(&run.stderr).len(), COUNT);

    let holdings = assert_consistent(&client, &pool).await;
    let live = allocations_of(&client, &pool).await;
    assert_eq!(live.len(), COUNT);
    let mut ports = BTreeSet::new();
    for pa in live.values() {
        let recorded = recorded_holdings(pa.status.as_ref().unwrap());
        assert_eq!(recorded.len(), 1, "{:?}", pa.metadata.name);
        ports.extend(recorded.ports());
    }
    assert_eq!(ports.len(), COUNT, "no port twice");
    assert_eq!(holdings.len(), COUNT);
    // The stored objects kept their managedFields: the status writes omitted them.
    assert!(live.values().all(|pa| {
        pa.metadata
            .managed_fields
            .as_ref()
            .is_some_and(|m| m.len() == 2)
    }));
}

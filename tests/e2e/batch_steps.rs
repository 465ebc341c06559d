//! A group commit whose pass 2 takes more than one step (more than 256 owners that leave their
//! home shard): each step is written while the next is decided, and the home shards name every
//! such owner before any step is written. Afterwards the record is exact and no home names
//! anyone, the refused owner included; and a `sync --all` killed while its steps are written
//! leaves what the next one completes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use kube::Client;
use kube::api::{Api, ListParams};
use portalloc::api::{PortAllocation, PortPoolShard};

use crate::support::cli::{self, BIN};
use crate::support::invariants::assert_consistent;
use crate::support::{self, cluster};

/// Owners of two pods with two PodScoped ports each, in a pool of one window and 8 copies:
/// the first 64 fill the window's first copy (their home) in pass 1, the other 336 go to pass
/// 2, in two steps (256, then the rest).
const OWNERS: usize = 400;

async fn create_owners(client: &Client, ns: &str, pool: &str, prefix: &str) {
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), ns);
    for i in 0..OWNERS {
        let name = format!("{prefix}-{i:03}");
        let yaml = support::simple_allocation(&name, pool, "w", 2, &["http", "rpc"]);
        let pa: PortAllocation = serde_yaml::from_str(&yaml).unwrap();
        api.create(&Default::default(), &pa).await.unwrap();
    }
}

/// A pool of 8 copies of `range`.
fn reuse_pool(name: &str, range: &str) {
    let args = [
        "pool",
        "create",
        name,
        "--range",
        range,
        "--node-reuse",
        "8",
        "--allow-overlap",
    ];
    let run = cli::run(&args);
    assert!(run.ok(), "pool create {name}: {run}");
}

/// The owners the pool's shards still name in `status.elsewhere`.
async fn named_elsewhere(client: &Client, pool: &str) -> Vec<String> {
    let api: Api<PortPoolShard> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.pool == pool)
        .flat_map(|s| s.status.into_iter().flat_map(|st| st.elsewhere))
        .map(|named| named.owner)
        .collect()
}

/// A namespace of [`OWNERS`] owners in a new pool of 8 copies of `range`.
async fn owners_in_pool(client: &Client, name: &str, range: &str) -> (String, String) {
    let ns = support::namespace(client, name).await;
    let pool = support::unique_name(name);
    reuse_pool(&pool, range);
    create_owners(client, &ns, &pool, "job").await;
    (ns, pool)
}

/// Every owner holds its 4 ports in an exact record and is Ready, and no home names anyone.
async fn assert_complete(client: &Client, ns: &str, pool: &str) {
    let held = assert_consistent(client, pool).await;
    assert_eq!(held.len(), OWNERS);
    assert!(held.values().all(|h| h.len() == 4), "{held:?}");
    assert_eq!(ready(client, ns).await, OWNERS);
    let named = named_elsewhere(client, pool).await;
    assert!(named.is_empty(), "homes still name {named:?}");
}

/// The Ready PortAllocations of `ns`.
async fn ready(client: &Client, ns: &str) -> usize {
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|pa| {
            pa.status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True")
        })
        .count()
}

#[tokio::test]
async fn a_pass_two_in_steps_ends_exact_and_names_nobody_the_refused_owner_included() {
    let client = support::client().await;
    let (ns, pool) = owners_in_pool(&client, "steps", "42240-42495").await;
    // More ports than the copies have left (8 x 256 - 1,600): refused, after its home named it
    // with the others.
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let huge = support::simple_allocation("huge", &pool, "w", 1024, &["http", "rpc"]);
    let huge: PortAllocation = serde_yaml::from_str(&huge).unwrap();
    api.create(&Default::default(), &huge).await.unwrap();

    let run = cli::run(&["sync", "--all", "-n", &ns, "-v", "2"]);
    assert_eq!(run.code, 4, "the huge one is refused: {run}");
    assert!(
        run.stderr.contains("pass 2 decided for 337 in ") && run.stderr.contains(" in 2 steps "),
        "{run}"
    );
    assert!(
        run.stderr.contains("huge") && run.stderr.contains("pool is full"),
        "{run}"
    );
    assert_complete(&client, &ns, &pool).await;
    // Pass 1 (its owners and the names), the two steps, the unnaming: at most four writes of any
    // shard.
    let put = format!("PUT /apis/portalloc.dev/v1alpha1/portpoolshards/{pool}-");
    let mut writes: std::collections::BTreeMap<&str, usize> = Default::default();
    for line in run.stderr.lines() {
        if let Some(rest) = line.split(&put).nth(1) {
            *writes.entry(rest.split('/').next().unwrap()).or_default() += 1;
        }
    }
    assert!(writes.values().all(|&n| n <= 4), "{writes:?}");
    eprintln!(
        "pass 2 in steps: {} shard writes over {} shards",
        writes.values().sum::<usize>(),
        writes.len()
    );

    let again = cli::run(&["sync", "--all", "-n", &ns, "-v", "2"]);
    assert_eq!(again.code, 4, "{again}");
    assert!(
        !again.stderr.contains(&put),
        "nothing to write again: {again}"
    );
}

#[tokio::test]
async fn a_sync_all_killed_while_its_steps_are_written_leaves_what_the_next_completes() {
    let client = support::client().await;
    let (ns, pool) = owners_in_pool(&client, "steps-killed", "43264-43519").await;

    // Killed once the first step's second shard write is answered: pass 1 (its owners and the
    // names) is committed, and part of the first step, some of whose owners may have their
    // status written, the others not.
    let mut child = Command::new(BIN)
        .args(["sync", "--all", "-n", &ns, "-v", "2"])
        .env("KUBECONFIG", &cluster().kubeconfig)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kubectl-portalloc");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    let mut shard_writes = 0;
    for line in stderr.lines() {
        let line = line.unwrap();
        if line.contains("/portpoolshards/") && !line.contains("GET ") {
            shard_writes += 1;
        }
        seen.push(line);
        if shard_writes == 3 {
            child.kill().unwrap();
            break;
        }
    }
    let _ = child.wait();
    let statuses = seen
        .iter()
        .filter(|l| l.contains("PUT ") && l.contains("/portallocations/"))
        .count();
    eprintln!("killed after {shard_writes} shard writes and {statuses} status writes");
    assert_eq!(shard_writes, 3, "{}", seen.join("\n"));
    assert!(ready(&client, &ns).await < OWNERS);

    let run = cli::run(&["sync", "--all", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert_complete(&client, &ns, &pool).await;
}

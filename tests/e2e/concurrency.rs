//! Many `kubectl-portalloc` processes allocating from one pool at the same moment.

use std::process::{Command, Stdio};
use std::time::Instant;

use kube::api::Api;
use portalloc::api::PortAllocation;

use crate::support::invariants::{assert_consistent, window_record};
use crate::support::{self, cli};

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Start every process before waiting for any, so they contend for real.
fn race(ns: &str, manifests: &[String]) -> Vec<Outcome> {
    let kubeconfig = &support::cluster().kubeconfig;
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = manifests
        .iter()
        .enumerate()
        .map(|(i, manifest)| {
            let path = dir.path().join(format!("{i}.yaml"));
            std::fs::write(&path, manifest).unwrap();
            Command::new(cli::BIN)
                .args(["create", "-f", path.to_str().unwrap(), "-n", ns, "-v", "1"])
                .env("KUBECONFIG", kubeconfig)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn kubectl-portalloc")
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            Outcome {
                code: output.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            }
        })
        .collect()
}

/// `[attempts=N conflicts=M]` as printed with -v 1, and retry lines on stderr.
fn conflicts_of(outcome: &Outcome) -> u32 {
    outcome
        .stdout
        .split("conflicts=")
        .nth(1)
        .and_then(|rest| {
            rest.trim_end_matches(|c: char| !c.is_ascii_digit())
                .split(']')
                .next()
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| outcome.stderr.matches("409 Conflict").count() as u32)
}

/// 24 processes, 2 ports each, 40 ports in the pool: exactly 20 win, 4 fail cleanly.
#[tokio::test]
async fn concurrent_processes_never_share_a_port_and_losers_leave_nothing() {
    race_to_a_full_pool(false).await;
}

/// The same race into a pool whose 40 ports lie 20 and 20 in two shards: owners fill their home
/// shard, move to the other, and the last ones span both.
#[tokio::test]
async fn concurrent_processes_never_share_a_port_across_two_shards() {
    race_to_a_full_pool(true).await;
}

async fn race_to_a_full_pool(two_shards: bool) {
    let client = support::client().await;
    let ns = support::namespace(&client, "race").await;
    let pool = support::unique_name("race");
    if two_shards {
        // 32236-32255 is window 125, 32256-32275 window 126.
        support::create_pool(&pool, "32236-32275");
    } else {
        // One shard: window 125.
        support::create_pool(&pool, "32000-32039");
    }
    let manifests: Vec<String> = (0..24)
        .map(|i| support::simple_allocation(&format!("job-{i}"), &pool, "worker", 2, &["rpc"]))
        .collect();

    let started = Instant::now();
    let outcomes = race(&ns, &manifests);
    let wall = started.elapsed();

    let winners: Vec<&Outcome> = outcomes.iter().filter(|o| o.code == 0).collect();
    let losers: Vec<&Outcome> = outcomes.iter().filter(|o| o.code != 0).collect();
    let conflicts: u32 = outcomes.iter().map(conflicts_of).sum();
    eprintln!(
        "concurrency: 24 processes, {} won, {} refused, {conflicts} conflicts retried, wall {:.2}s",
        winners.len(),
        losers.len(),
        wall.as_secs_f64()
    );
    for loser in &losers {
        assert_eq!(
            loser.code, 4,
            "a loser must fail as refused (pool full), not otherwise: {}",
            loser.stderr
        );
        assert!(loser.stderr.contains("pool is full"), "{}", loser.stderr);
    }
    assert_eq!(winners.len(), 20, "40 ports / 2 per allocation");

    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings.len(), 20);
    assert!(
        holdings.values().all(|h| h.len() == 2),
        "every winner holds exactly its 2 ports"
    );
    let record = window_record(&client, &pool).await;
    assert_eq!(record.state.held_count(), 40);
    // Losers leave no object behind, and no half allocation.
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let live = api.list(&Default::default()).await.unwrap().items;
    assert_eq!(live.len(), 20, "refused PortAllocations must not remain");
}

/// 16 processes, 8 ports each, plenty of room: all win, all distinct, both objects agree.
#[tokio::test]
async fn sixteen_concurrent_eight_port_allocations_all_succeed_without_duplicates() {
    sixteen_by_eight(false).await;
}

#[tokio::test]
async fn sixteen_concurrent_eight_port_allocations_over_three_shards() {
    sixteen_by_eight(true).await;
}

async fn sixteen_by_eight(three_shards: bool) {
    let client = support::client().await;
    let ns = support::namespace(&client, "race16").await;
    let pool = support::unique_name("race16");
    if three_shards {
        // Three shards: windows 125 (32100-32255), 126 and 127 (to 32767).
        support::create_pool(&pool, "32100-32767");
    } else {
        support::create_pool(&pool, "32100-32299");
    }
    let manifests: Vec<String> = (0..16)
        .map(|i| {
            support::simple_allocation(&format!("group-{i}"), &pool, "worker", 4, &["http", "rpc"])
        })
        .collect();
    let started = Instant::now();
    let outcomes = race(&ns, &manifests);
    let wall = started.elapsed();
    let conflicts: u32 = outcomes.iter().map(conflicts_of).sum();
    eprintln!(
        "concurrency: 16 processes x 8 ports, {conflicts} conflicts retried, wall {:.2}s",
        wall.as_secs_f64()
    );
    for outcome in &outcomes {
        assert_eq!(outcome.code, 0, "{}", outcome.stderr);
    }
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings.len(), 16);
    assert_eq!(holdings.values().map(|h| h.len()).sum::<usize>(), 128);
}

/// 24 processes, 4 ports each, into 40 ports kept twice (`--node-reuse 2`): 10 fit in each
/// copy, so exactly 20 win and the losers are told every copy is full; no port is held twice in
/// a copy, none by more than two.
#[tokio::test]
async fn concurrent_processes_fill_both_copies_of_a_reused_pool_and_no_more() {
    let client = support::client().await;
    let ns = support::namespace(&client, "race-reuse").await;
    let pool = support::unique_name("race-reuse");
    let run = cli::run(&[
        "pool",
        "create",
        &pool,
        "--range",
        "32040-32079",
        "--node-reuse",
        "2",
        "--allow-overlap",
    ]);
    assert!(run.ok(), "{run}");
    let manifests: Vec<String> = (0..24)
        .map(|i| support::simple_allocation(&format!("job-{i}"), &pool, "worker", 2, &["a", "b"]))
        .collect();
    let outcomes = race(&ns, &manifests);
    let winners = outcomes.iter().filter(|o| o.code == 0).count();
    let conflicts: u32 = outcomes.iter().map(conflicts_of).sum();
    eprintln!("concurrency with reuse 2: 24 processes, {winners} won, {conflicts} conflicts");
    for loser in outcomes.iter().filter(|o| o.code != 0) {
        assert_eq!(loser.code, 4, "{}", loser.stderr);
        assert!(
            loser
                .stderr
                .contains("the pool's 1 other copies, nodeReuse 2, refused too"),
            "{}",
            loser.stderr
        );
    }
    assert_eq!(winners, 20, "2 copies x 40 ports / 4 per allocation");
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings.len(), 20);
    let record = crate::support::invariants::pool_record(&client, &pool).await;
    assert_eq!(record.copies_in_use().len(), 2);
    for copy in record.copies.values() {
        assert_eq!(copy.held(), 40, "copy {} is full", copy.copy);
    }
}

/// 16 processes x 8 ports into 40 ports with `--node-reuse 4`: all win, five to a copy, copies
/// filled in order.
#[tokio::test]
async fn sixteen_concurrent_eight_port_allocations_into_a_pool_with_reuse() {
    let client = support::client().await;
    let ns = support::namespace(&client, "race16-reuse").await;
    let pool = support::unique_name("race16-reuse");
    let run = cli::run(&[
        "pool",
        "create",
        &pool,
        "--range",
        "32080-32119",
        "--node-reuse",
        "4",
        "--allow-overlap",
    ]);
    assert!(run.ok(), "{run}");
    let manifests: Vec<String> = (0..16)
        .map(|i| {
            support::simple_allocation(&format!("group-{i}"), &pool, "worker", 4, &["http", "rpc"])
        })
        .collect();
    let outcomes = race(&ns, &manifests);
    let conflicts: u32 = outcomes.iter().map(conflicts_of).sum();
    eprintln!("concurrency with reuse 4: 16 processes x 8 ports, {conflicts} conflicts");
    for outcome in &outcomes {
        assert_eq!(outcome.code, 0, "{}", outcome.stderr);
    }
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings.len(), 16);
    let record = crate::support::invariants::pool_record(&client, &pool).await;
    let held: Vec<u32> = record.copies.values().map(|copy| copy.held()).collect();
    assert_eq!(held, vec![40, 40, 40, 8], "copies fill in order");
}

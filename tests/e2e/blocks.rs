//! Blocks of contiguous ports (`ports[].count`) against the real API server: disjoint runs per
//! pod, idempotent re-syncs, refusals that write nothing, fragmentation named in the message,
//! repair restoring blocks exactly, and processes allocating blocks at once.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};

use kube::ResourceExt;
use kube::api::Api;
use portalloc::api::PortAllocation;
use portalloc::core::{Holdings, PortBlock, SlotKey};
use portalloc::ledger::recorded_holdings;

use crate::support::invariants::{allocations_of, assert_consistent, window_record};
use crate::support::{self, cli};

/// Ray on hostNetwork: a head port and, per worker pod, a block of `count` worker ports.
fn ray(name: &str, pool: &str, workers: u32, count: u32) -> String {
    format!(
        r#"apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata:
  name: {name}
spec:
  pool: {pool}
  roles:
  - name: head
    replicas: 1
    ports:
    - {{name: gcs, scope: RoleScoped, env: RAY_GCS_PORT}}
  - name: worker
    replicas: {workers}
    ports:
    - {{name: ray, scope: PodScoped, env: MIN_WORKER_PORT, count: {count}, lastEnv: MAX_WORKER_PORT}}
"#
    )
}

/// One RoleScoped port per entry of `ports`: `(name, requested first port, count)`.
fn fixed(name: &str, pool: &str, ports: &[(&str, u16, u32)]) -> String {
    let ports: Vec<String> = ports
        .iter()
        .map(|(port, first, count)| {
            format!(
                "    - {{name: {port}, scope: RoleScoped, env: {}_PORT, port: {first}, count: {count}}}\n",
                port.to_uppercase()
            )
        })
        .collect();
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: {name}\nspec:\n  pool: {pool}\n  roles:\n  - name: ctl\n    replicas: 1\n    ports:\n{}",
        ports.concat()
    )
}

/// Every block of every holder is whole: `count` ports, all in the pool.
fn assert_blocks(holdings: &Holdings, role: &str, port: &str, slots: u32, count: u16) {
    for index in 0..slots {
        let block = holdings
            .block(&SlotKey::new(role, port, index))
            .unwrap_or_else(|| panic!("{role}.{port}[{index}] holds nothing: {holdings}"));
        assert_eq!(block.count, count, "{role}.{port}[{index}] holds {block}");
    }
}

#[tokio::test]
async fn pod_scoped_blocks_are_disjoint_runs_and_a_resync_keeps_them() {
    let client = support::client().await;
    let ns = support::namespace(&client, "blocks").await;
    let pool = support::unique_name("blocks");
    support::create_pool(&pool, "34000-34199");
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &ray("ray", &pool, 3, 8));
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("25 ports held"), "{run}");

    let holdings = assert_consistent(&client, &pool).await;
    let mine = holdings.values().next().unwrap();
    assert_blocks(mine, "worker", "ray", 3, 8);
    let mut seen = BTreeSet::new();
    for port in mine.ports() {
        assert!((34000..=34199).contains(&port));
        assert!(seen.insert(port), "port {port} held twice: {mine}");
    }
    assert_eq!(seen.len(), 25);

    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let status = api.get("ray").await.unwrap().status.unwrap();
    let workers = status
        .assignments
        .iter()
        .find(|a| a.role == "worker")
        .unwrap();
    assert_eq!(workers.count, Some(8));
    assert_eq!(workers.values.len(), 3);
    let head = status
        .assignments
        .iter()
        .find(|a| a.role == "head")
        .unwrap();
    assert_eq!(head.count, None);

    // The pool text and `pool describe` write blocks first-last.
    let record = window_record(&client, &pool).await;
    let text = &record.entries()[0].ports;
    let block = |i: u32| mine.block(&SlotKey::new("worker", "ray", i)).unwrap();
    let expected = format!("worker.ray={},{},{}", block(0), block(1), block(2));
    assert!(text.contains(&expected), "{text} lacks {expected}");
    let run = cli::run(&["pool", "describe", &pool]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains(&expected), "{run}");
    let frag = record.state.fragmentation();
    let line = format!(
        "Free runs:    {} (largest {} ports); blocks that fit: {} of 8, {} of 16, {} of 32",
        frag.runs(),
        frag.largest(),
        frag.fits(8),
        frag.fits(16),
        frag.fits(32)
    );
    assert!(run.stdout.contains(&line), "{line:?} missing: {run}");
    assert_eq!(frag.free(), 200 - 25);

    // Re-sync: nothing moves, nothing is written.
    let version = crate::support::invariants::shard_versions(&client, &pool).await;
    let run = cli::run(&["sync", "ray", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("(unchanged)"), "{run}");
    let again = window_record(&client, &pool).await;
    assert_eq!(
        crate::support::invariants::shard_versions(&client, &pool).await,
        version,
        "a no-op sync wrote"
    );
    assert_eq!(
        again.holdings_of(&api.get("ray").await.unwrap().uid().unwrap()),
        *mine
    );

    // Doubling the count moves the worker blocks only; the head keeps its port.
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &ray("ray", &pool, 3, 16));
    assert!(run.ok(), "{run}");
    let after = assert_consistent(&client, &pool).await;
    let after = after.values().next().unwrap();
    assert_blocks(after, "worker", "ray", 3, 16);
    let gcs = SlotKey::new("head", "gcs", 0);
    assert_eq!(after.block(&gcs), mine.block(&gcs));
    assert_eq!(after.port_count(), 49);
}

#[tokio::test]
async fn a_requested_block_over_a_held_port_is_refused_and_nothing_is_written() {
    let client = support::client().await;
    let ns = support::namespace(&client, "block-held").await;
    let pool = support::unique_name("block-held");
    support::create_pool(&pool, "34200-34299");
    let owner = fixed("owner", &pool, &[("admin", 34205, 1)]);
    assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &owner).ok());
    let before = crate::support::invariants::shard_versions(&client, &pool).await;

    let thief = fixed("thief", &pool, &[("nixl", 34200, 8)]);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &thief);
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr.contains(&format!(
            "port 34205 (in the requested block 34200-34207) of pool \"{pool}\" is already held by {ns}/owner (role ctl, port admin"
        )),
        "{run}"
    );
    // A block crossing the end of the pool is refused too, naming the first port outside.
    let outside = fixed("outside", &pool, &[("nixl", 34296, 8)]);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &outside);
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr.contains(
            "ports 34296-34303 are not all in the pool's ranges 34200-34299: port 34300 is not"
        ),
        "{run}"
    );

    let after = crate::support::invariants::shard_versions(&client, &pool).await;
    assert_eq!(before, after, "a refusal wrote the pool");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    for name in ["thief", "outside"] {
        assert!(
            api.get_opt(name).await.unwrap().is_none(),
            "refused {name} was left behind"
        );
    }

    // Right next to the held port it fits, exactly where asked.
    let neighbour = fixed("neighbour", &pool, &[("nixl", 34206, 8)]);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &neighbour);
    assert!(run.ok(), "{run}");
    let holdings = assert_consistent(&client, &pool).await;
    assert!(
        holdings
            .values()
            .any(|h| h.block(&SlotKey::new("ctl", "nixl", 0)) == PortBlock::new(34206, 8))
    );
}

#[tokio::test]
async fn a_pool_too_fragmented_for_a_block_is_refused_with_its_largest_run() {
    let client = support::client().await;
    let ns = support::namespace(&client, "block-frag").await;
    let pool = support::unique_name("block-frag");
    support::create_pool(&pool, "34300-34339");
    // Every tenth port held: four free runs of 9.
    let squatter = fixed(
        "squatter",
        &pool,
        &[
            ("a", 34309, 1),
            ("b", 34319, 1),
            ("c", 34329, 1),
            ("d", 34339, 1),
        ],
    );
    assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &squatter).ok());
    let before = crate::support::invariants::shard_versions(&client, &pool).await;

    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &ray("ray", &pool, 1, 16));
    assert_eq!(run.code, 4, "{run}");
    for needle in [
        "worker.ray[0] needs a block of 16 contiguous ports; the largest free run is 9 (36 free in 4 runs)",
        "nothing was allocated",
        &format!("Holders: {ns}/squatter (4 ports)"),
    ] {
        assert!(run.stderr.contains(needle), "{needle:?} missing: {run}");
    }
    let after = crate::support::invariants::shard_versions(&client, &pool).await;
    assert_eq!(before, after, "a refusal wrote the pool");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    assert!(api.get_opt("ray").await.unwrap().is_none());

    // Blocks of 9 still fit, one per run; the head port goes in the fourth run.
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &ray("nine", &pool, 3, 9));
    assert!(run.ok(), "{run}");
    let frag = window_record(&client, &pool).await.state.fragmentation();
    assert_eq!((frag.free(), frag.fits(9)), (8, 0));
}

#[tokio::test]
async fn repair_restores_blocks_exactly_after_the_pool_is_recreated() {
    let client = support::client().await;
    let ns = support::namespace(&client, "block-repair").await;
    let pool = support::unique_name("block-repair");
    support::create_pool(&pool, "34400-34599");
    for (name, count) in [("ray-a", 8), ("ray-b", 4)] {
        let run = cli::run_stdin(
            &["create", "-f", "-", "-n", &ns],
            &ray(name, &pool, 3, count),
        );
        assert!(run.ok(), "{run}");
    }
    let before = assert_consistent(&client, &pool).await;
    assert_eq!(
        before.values().map(Holdings::port_count).sum::<u32>(),
        25 + 13
    );

    let run = cli::run(&["pool", "delete", &pool, "--force"]);
    assert!(run.ok(), "{run}");
    support::create_pool(&pool, "34400-34599");
    assert!(window_record(&client, &pool).await.holders.is_empty());

    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("applied 2 changes"), "{run}");
    let after = assert_consistent(&client, &pool).await;
    assert_eq!(after, before, "every block came back exactly");
    let record = window_record(&client, &pool).await;
    assert_eq!(record.state.held_count(), 38);
    for pa in allocations_of(&client, &pool).await.values() {
        let recorded = recorded_holdings(pa.status.as_ref().unwrap());
        assert_eq!(recorded, record.holdings_of(&pa.uid().unwrap()));
    }
    let run = cli::run(&["repair", "--pool", &pool]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout.contains("consistent (2 holders, 38 ports held)"),
        "{run}"
    );
}

/// 4 processes at once, each a head port and 2 blocks of 8: no port is held twice, every block
/// is whole, both objects agree.
#[tokio::test]
async fn four_processes_allocating_blocks_at_once_never_overlap() {
    let client = support::client().await;
    let ns = support::namespace(&client, "block-race").await;
    let pool = support::unique_name("block-race");
    support::create_pool(&pool, "34600-34719");
    let kubeconfig = &support::cluster().kubeconfig;
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..4)
        .map(|i| {
            let path = dir.path().join(format!("{i}.yaml"));
            std::fs::write(&path, ray(&format!("ray-{i}"), &pool, 2, 8)).unwrap();
            Command::new(cli::BIN)
                .args(["create", "-f", path.to_str().unwrap(), "-n", &ns, "-v", "1"])
                .env("KUBECONFIG", kubeconfig)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn kubectl-portalloc")
        })
        .collect();
    let mut conflicts = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // `[attempts=N conflicts=M]`, as -v 1 prints it.
        conflicts += stdout
            .split("conflicts=")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .and_then(|n| n.trim().parse::<u32>().ok())
            .unwrap_or(0);
    }
    eprintln!("blocks: 4 processes x (1 port + 2 blocks of 8), {conflicts} conflicts retried");
    // assert_consistent checks every port of every block against every other holder.
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings.len(), 4);
    let mut all = BTreeSet::new();
    for held in holdings.values() {
        assert_blocks(held, "worker", "ray", 2, 8);
        assert_eq!(held.port_count(), 17);
        all.extend(held.ports());
    }
    assert_eq!(all.len(), 68);
    assert!(all.iter().all(|p| (34600..=34719).contains(p)));
    assert_eq!(window_record(&client, &pool).await.state.held_count(), 68);
}

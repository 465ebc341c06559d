//! Pools with `nodeReuse`: a second holder of a port only once the first copy is full, the
//! warnings that come with a reused port, what readers show, the bad inputs, and repair.

use kube::api::Api;
use portalloc::api::{PortPool, PortPoolShard};
use portalloc::ledger::{ShardKey, shard_name};

use crate::support::invariants::{assert_consistent, pool_record};
use crate::support::{self, cli};

/// 8 ports in window 124 (31744-31999); other tests' pools may overlap (objects differ).
const RANGE: &str = "31900-31907";

pub(crate) fn create_reused_pool(pool: &str, reuse: &str) {
    let run = cli::run(&[
        "pool",
        "create",
        pool,
        "--range",
        RANGE,
        "--node-reuse",
        reuse,
        "--allow-overlap",
    ]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout
            .contains("each port held by up to 2 pods, never two on one node (16 in all)"),
        "{run}"
    );
}

fn create(ns: &str, pool: &str, name: &str, replicas: u32) -> cli::Run {
    let manifest = support::simple_allocation(name, pool, "web", replicas, &["http"]);
    cli::run_stdin(&["create", "-f", "-", "-n", ns], &manifest)
}

fn ports_of(run: &cli::Run) -> Vec<u16> {
    run.stdout
        .lines()
        .filter_map(|line| line.split_once('=').map(|(_, v)| v.trim().parse().unwrap()))
        .collect()
}

#[tokio::test]
async fn a_port_gets_a_second_holder_only_once_the_first_copy_is_full() {
    let client = support::client().await;
    let ns = support::namespace(&client, "reuse").await;
    let pool = support::unique_name("reuse");
    create_reused_pool(&pool, "2");

    // Copy 0: two owners of 4 ports fill it; neither is warned about.
    for name in ["a", "b"] {
        let run = create(&ns, &pool, name, 4);
        assert!(run.ok(), "{run}");
        assert!(!run.stderr.contains("warning"), "{run}");
    }
    let resolved = cli::run(&["resolve", "a", "--role", "web", "--index", "0", "-n", &ns]);
    assert!(
        resolved.ok() && !resolved.stderr.contains("warning"),
        "{resolved}"
    );

    // The third owner goes to copy 1, where the same port numbers are free again.
    let run = create(&ns, &pool, "c", 4);
    assert!(run.ok(), "{run}");
    assert!(
        run.stderr.contains(&format!(
            "warning: the ports of PortAllocation {ns}/c are in copy 1 of pool {pool}"
        )),
        "{run}"
    );
    let shards: Api<PortPoolShard> = Api::all(client.clone());
    let second = shards
        .get(&shard_name(&pool, ShardKey::new(1, 124)))
        .await
        .expect("copy 1's shard of window 124");
    assert_eq!(second.spec.copy, 1);
    let mut c_ports = Vec::new();
    for index in 0..4 {
        let index = index.to_string();
        let resolved = cli::run(&[
            "resolve", "c", "--role", "web", "--index", &index, "-n", &ns,
        ]);
        assert!(resolved.ok(), "{resolved}");
        assert!(
            resolved
                .stderr
                .contains("must declare its ports as hostPorts"),
            "{resolved}"
        );
        c_ports.extend(ports_of(&resolved));
    }
    c_ports.sort_unstable();
    let mut held_by_a_and_b = Vec::new();
    for name in ["a", "b"] {
        for index in 0..4 {
            let index = index.to_string();
            held_by_a_and_b.extend(ports_of(&cli::run(&[
                "resolve", name, "--role", "web", "--index", &index, "-n", &ns,
            ])));
        }
    }
    assert!(
        c_ports.iter().all(|p| held_by_a_and_b.contains(p)),
        "c's ports {c_ports:?} are copy 0's ports again: {held_by_a_and_b:?}"
    );
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(holdings.len(), 3);

    // What readers see: both copies, the fill, the bound on excluded nodes.
    let described = cli::run(&["pool", "describe", &pool]);
    assert!(described.ok(), "{described}");
    assert!(
        described
            .stdout
            .contains("Copies:       2 of 2 in use; 12 of 16 ports held in all"),
        "{described}"
    );
    assert!(
        described
            .stdout
            .contains("a pod with k ports is kept off at most k x 1 nodes"),
        "{described}"
    );
    assert!(
        described
            .stdout
            .contains(&format!("  {ns}/c  (copy 1, 4 ports")),
        "{described}"
    );
    let listed = cli::run(&["pool", "get", &pool, "-o", "wide"]);
    assert!(listed.ok(), "{listed}");
    let row: Vec<&str> = listed
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    // NAME PROTOCOL RANGES SIZE ALLOCATED FREE HOLDERS AGE REUSE: every copy counts.
    assert_eq!(&row[3..7], &["8", "12", "4", "3"], "{listed}");
    assert_eq!(row[8], "2", "{listed}");

    // Full in both copies: refused, saying so, nothing written.
    let run = create(&ns, &pool, "d", 8);
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr
            .contains("each of the pool's 1 other copies, nodeReuse 2, refused too"),
        "{run}"
    );

    // Lowering nodeReuse below the copies in use: one line, nothing changed.
    // (allowOverlap as create_reused_pool set it: the tests' reused pools share RANGE.)
    let lowered = format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata:\n  name: {pool}\nspec:\n  ranges: [\"{RANGE}\"]\n  nodeReuse: 1\n  allowOverlap: true\n"
    );
    // (--force: a pool's spec changes only when asked to; even then not under its holders.)
    let run = cli::run_stdin(&["create", "-f", "-", "--force"], &lowered);
    assert_eq!(run.code, 4, "{run}");
    assert_eq!(run.stderr.trim().lines().count(), 1, "{run}");
    assert!(
        run.stderr.contains("nodeReuse 1 would leave copies 1-1")
            && run.stderr.contains(&format!("{ns}/c")),
        "{run}"
    );
    let pools: Api<PortPool> = Api::all(client.clone());
    assert_eq!(pools.get(&pool).await.unwrap().spec.node_reuse, Some(2));

    // Once copy 1 is empty, the same edit goes through.
    let run = cli::run(&["delete", "c", "-n", &ns]);
    assert!(run.ok(), "{run}");
    let run = cli::run_stdin(&["create", "-f", "-", "--force"], &lowered);
    assert!(run.ok(), "{run}");
    assert_eq!(pools.get(&pool).await.unwrap().spec.node_reuse, Some(1));
}

#[tokio::test]
async fn a_node_reuse_below_one_is_refused_by_the_plugin_and_the_api_server() {
    let pool = support::unique_name("reuse-zero");
    for bad in ["0", "-1", "257"] {
        let run = cli::run(&[
            "pool",
            "create",
            &pool,
            "--range",
            RANGE,
            "--node-reuse",
            bad,
        ]);
        assert_eq!(run.code, 2, "{run}");
        assert!(run.stderr.contains("--node-reuse"), "{run}");
    }
    let manifest = format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata:\n  name: {pool}\nspec:\n  ranges: [\"{RANGE}\"]\n  nodeReuse: 0\n"
    );
    let run = cli::run_stdin(&["create", "-f", "-"], &manifest);
    assert_ne!(run.code, 0, "{run}");
    assert!(
        run.stderr.contains("spec.nodeReuse") && run.stderr.contains("greater than or equal to 1"),
        "{run}"
    );
    let client = support::client().await;
    let pools: Api<PortPool> = Api::all(client);
    assert!(
        pools.get_opt(&pool).await.unwrap().is_none(),
        "nothing created"
    );
}

#[tokio::test]
async fn repair_puts_a_reused_holder_back_in_its_copy_after_the_pool_is_recreated() {
    let client = support::client().await;
    let ns = support::namespace(&client, "reuse-repair").await;
    let pool = support::unique_name("reuse-repair");
    create_reused_pool(&pool, "2");
    for (name, replicas) in [("a", 8), ("b", 3)] {
        let run = create(&ns, &pool, name, replicas);
        assert!(run.ok(), "{run}");
    }
    let before = assert_consistent(&client, &pool).await;
    let run = cli::run(&["pool", "delete", &pool, "--force"]);
    assert!(run.ok(), "{run}");
    create_reused_pool(&pool, "2");
    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    let after = assert_consistent(&client, &pool).await;
    assert_eq!(after, before, "every holder keeps its ports");
    let record = pool_record(&client, &pool).await;
    let b = before
        .keys()
        .find(|uid| record.copies_of(uid) == [1].into());
    assert!(b.is_some(), "b is back in copy 1");
    let again = cli::run(&["repair", "--pool", &pool]);
    assert!(again.ok(), "{again}");
}

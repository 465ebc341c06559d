//! A workload bigger than one copy of its pool, through the plugin: its pods spread over the
//! copies, a re-run changes nothing, repair puts each pod's ports back in its copy, and a
//! workload too big even spread is refused with how far it got, nothing written.

use kube::api::Api;
use portalloc::api::PortAllocation;

use crate::support::invariants::{assert_consistent, pool_record};
use crate::support::{self, cli};

/// 8 ports in window 125 (32000-32255); other tests' pools may overlap (objects differ).
const RANGE: &str = "32010-32017";

fn create_pool(pool: &str) {
    let run = cli::run(&[
        "pool",
        "create",
        pool,
        "--range",
        RANGE,
        "--node-reuse",
        "2",
        "--allow-overlap",
    ]);
    assert!(run.ok(), "{run}");
}

fn apply(ns: &str, pool: &str, pods: u32) -> cli::Run {
    let manifest = support::simple_allocation("w", pool, "web", pods, &["http", "nccl"]);
    cli::run_stdin(&["create", "-f", "-", "-n", ns], &manifest)
}

#[tokio::test]
async fn a_workload_bigger_than_a_copy_spreads_its_pods_and_repair_restores_each_in_its_copy() {
    let client = support::client().await;
    let ns = support::namespace(&client, "spread").await;
    let pool = support::unique_name("spread");
    create_pool(&pool);

    // 5 pods x 2 ports = 10 ports from a copy of 8: 4 pods in copy 0, the fifth in copy 1.
    let run = apply(&ns, &pool, 5);
    assert!(run.ok(), "{run}");
    let allocations: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let pa = allocations.get("w").await.unwrap();
    let status = pa.status.clone().unwrap();
    assert_eq!(status.ports.as_deref(), Some("10/10"));
    for assignment in &status.assignments {
        assert_eq!(assignment.copies, vec![0, 0, 0, 0, 1], "{assignment:?}");
    }
    let record = pool_record(&client, &pool).await;
    let uid = pa.metadata.uid.clone().unwrap();
    assert_eq!(record.copies_of(&uid), [0, 1].into());
    let before = assert_consistent(&client, &pool).await;

    let described = cli::run(&["describe", "w", "-n", &ns]);
    assert!(
        described
            .stdout
            .contains("Copies:       0 (8 ports), 1 (2 ports): pods spread over copies"),
        "{described}"
    );

    // Pod 4's ports are copy 1's: resolve warns that they must be declared.
    let resolved = cli::run(&["resolve", "w", "--role", "web", "--index", "4", "-n", &ns]);
    assert!(resolved.ok(), "{resolved}");
    assert!(
        resolved
            .stderr
            .contains("must declare its ports as hostPorts"),
        "{resolved}"
    );

    // Again: nothing moves, nothing is written.
    let again = cli::run(&["sync", "w", "-n", &ns]);
    assert!(again.ok(), "{again}");
    assert_eq!(assert_consistent(&client, &pool).await, before);
    assert_eq!(
        allocations
            .get("w")
            .await
            .unwrap()
            .metadata
            .resource_version,
        pa.metadata.resource_version,
        "the status is unchanged"
    );

    // The pool lost and recreated: repair puts pods 0-3 back in copy 0 and pod 4 in copy 1.
    let run = cli::run(&["pool", "delete", &pool, "--force"]);
    assert!(run.ok(), "{run}");
    create_pool(&pool);
    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    assert_eq!(assert_consistent(&client, &pool).await, before);
    assert_eq!(
        pool_record(&client, &pool).await.copies_of(&uid),
        [0, 1].into()
    );

    // 9 pods need 18 ports of 16: refused, saying how far the spread got; nothing changes.
    let run = apply(&ns, &pool, 9);
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr.contains(
            "spread pod by pod over the copies, 8 of its 9 pods fit, and pod web[8] fits in none"
        ),
        "{run}"
    );
    assert_eq!(assert_consistent(&client, &pool).await, before);
}

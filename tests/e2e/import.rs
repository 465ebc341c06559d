//! `import` of RoleBasedGroup v1alpha2 manifests, piped into `create` on the real API server.

use crate::support::{self, cli};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/rbg/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `KEY=value` lines of `resolve` as pairs.
fn env_of(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {text}"))
        .to_string()
}

#[tokio::test]
async fn import_of_rbg_v1alpha2_pipes_into_create_and_allocates() {
    let client = support::client().await;
    let ns = support::namespace(&client, "import-v2").await;
    let pool = support::unique_name("import-v2");
    support::create_pool(&pool, "36400-36499");

    let imported = cli::run(&[
        "import",
        "-f",
        &fixture("v1alpha2-pd.yaml"),
        "--pool",
        &pool,
    ]);
    assert!(imported.ok(), "{imported}");
    assert!(
        imported.stdout.contains("# note: ") && imported.stdout.contains("addressRef LEADER_ADDR"),
        "untranslatable addressRefs are named: {imported}"
    );
    let created = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &imported.stdout);
    assert!(created.ok(), "{created}");
    // router 1 + prefill-leader 2 + prefill-worker 2 + decode-leader 2 + decode-worker 4.
    assert!(created.stdout.contains("11 ports held"), "{created}");

    let resolve = |role: &str, index: &str| {
        let run = cli::run(&["resolve", "pd", "--role", role, "--index", index, "-n", &ns]);
        assert!(run.ok(), "{run}");
        run.stdout
    };
    let leader = resolve("prefill-leader", "0");
    let worker = resolve("prefill-worker", "1");
    assert_eq!(
        env_of(&worker, "LEADER_PORT"),
        env_of(&leader, "LEADER_GRPC_PORT"),
        "port-allocator reference reads the leader's port"
    );
    assert_eq!(
        env_of(&worker, "LEADER_BOOTSTRAP"),
        env_of(&leader, "BOOTSTRAP_PORT"),
        "component-discovery portRef reads the leader's RoleScoped port"
    );
    assert_eq!(
        env_of(&worker, "WORKER_1_GRPC_PORT"),
        env_of(&worker, "WORKER_GRPC_PORT"),
        "portRef index 1 is this pod's own port"
    );
    let decode_leader = resolve("decode-leader", "0");
    let decode_worker = resolve("decode-worker", "3");
    assert_eq!(
        env_of(&decode_worker, "LEADER_DIST_PORT"),
        env_of(&decode_leader, "DIST_PORT")
    );
    // Every value, own port or reference, is a port of the pool.
    let ports: Vec<u16> = [&leader, &worker, &decode_leader, &decode_worker]
        .iter()
        .flat_map(|t| t.lines())
        .map(|l| l.split_once('=').unwrap().1.parse().unwrap())
        .collect();
    assert_eq!(ports.len(), 2 + 4 + 1 + 2, "{ports:?}");
    assert!(
        ports.iter().all(|p| (36400..=36499).contains(p)),
        "{ports:?}"
    );

    // A bad reference: one line naming the field path, exit 7, nothing created.
    let run = cli::run(&[
        "import",
        "-f",
        &fixture("v1alpha2-bad-reference.yaml"),
        "--pool",
        &pool,
    ]);
    assert_eq!(run.code, 7, "{run}");
    assert_eq!(run.stderr.lines().count(), 1, "{run}");
    assert!(
        run.stderr.contains(
            "spec.roles[0].customComponentsPattern.components[1].annotations[rolebasedgroup.workloads.x-k8s.io/port-allocator].references[0].from"
        ),
        "{run}"
    );
    assert!(run.stdout.is_empty(), "nothing to pipe on: {run}");
    let get = cli::run(&["get", "bad", "-n", &ns]);
    assert_eq!(get.code, 3, "nothing was written: {get}");
}

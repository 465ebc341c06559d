//! Pools whose copies follow the nodes (`spec.followNodes`): copies used up to the bound the
//! nodes counted set, the refusal past it with its figures, the watcher's count of new nodes
//! letting the refused holder in at its next resync, and a CLI that counts the nodes itself
//! where no watcher keeps them. Fake Node objects (metadata only) are enough: only their count
//! matters here, and each test selects its own by a label no other test uses.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use portalloc::api::{PortAllocation, PortPool};
use portalloc::ledger::{CONDITION_READY, ShardKey, shard_name};

use crate::support::poll::until_object;
use crate::support::private_cluster::PrivateCluster;
use crate::support::watcher_process::WatcherProcess;
use crate::support::{self, cli};

/// 4 ports in window 124 (31744-31999); other tests' pools may overlap (objects differ).
const RANGE: &str = "31920-31923";
/// The label that selects a test's nodes.
const LABEL: &str = "portalloc.dev/test-follow";

/// `count` more Nodes labelled `LABEL=group`, named `group-<i>` from `first`.
async fn add_nodes(client: &Client, group: &str, first: usize, count: usize) {
    let nodes: Api<Node> = Api::all(client.clone());
    for i in first..first + count {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(format!("{group}-{i}")),
                labels: Some([(LABEL.to_string(), group.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
}

async fn remove_nodes(client: &Client, group: &str, count: usize) {
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..count {
        let _ = nodes
            .delete(&format!("{group}-{i}"), &DeleteParams::default())
            .await;
    }
}

fn create_following_pool(kubeconfig: &Path, pool: &str, group: &str) {
    let selector = format!("{LABEL}={group}");
    let run = cli::run_with(
        kubeconfig,
        &[
            "pool",
            "create",
            pool,
            "--range",
            RANGE,
            "--follow-nodes",
            "--node-selector",
            &selector,
            "--allow-overlap",
        ],
    );
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("its copies follow the nodes"), "{run}");
}

/// An owner of 4 pods of 1 port each: it fills one copy of the 4-port pool.
fn create(kubeconfig: &Path, ns: &str, pool: &str, name: &str) -> cli::Run {
    let manifest = support::simple_allocation(name, pool, "web", 4, &["http"]);
    cli::run_stdin_with(kubeconfig, &["create", "-f", "-", "-n", ns], &manifest)
}

async fn copy_exists(client: &Client, pool: &str, copy: u16) -> bool {
    let shards: Api<portalloc::api::PortPoolShard> = Api::all(client.clone());
    let name = shard_name(pool, ShardKey::new(copy, 124));
    shards
        .get_opt(&name)
        .await
        .unwrap()
        .and_then(|s| s.status)
        .is_some_and(|s| !s.holders.is_empty())
}

fn ready(pa: Option<&PortAllocation>) -> bool {
    pa.and_then(|pa| pa.status.as_ref()).is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == CONDITION_READY && c.status == "True")
    })
}

#[tokio::test]
async fn copies_follow_the_nodes_and_a_refused_holder_gets_in_once_nodes_are_added() {
    // A watcher of every namespace syncs every object it sees: a control plane of its own, so
    // that other tests' objects stay as those tests left them.
    let Some(cluster) = PrivateCluster::start("follow-watch", true) else {
        return;
    };
    let client = cluster.client().await;
    let kubeconfig = &cluster.kubeconfig;
    let ns = support::namespace(&client, "follow").await;
    let pool = support::unique_name("follow");
    let group = support::unique_name("fnodes");
    add_nodes(&client, &group, 0, 3).await;
    create_following_pool(kubeconfig, &pool, &group);

    // The watcher counts the pool's 3 nodes onto its status.
    let dir = tempfile::tempdir().unwrap();
    let watcher = WatcherProcess::start(
        kubeconfig,
        "follow-watcher",
        &["-A", "--resync", "3s", "-v", "1"],
        dir.path(),
    );
    let pools: Api<PortPool> = Api::all(client.clone());
    let nodes_are = |n: i32| {
        move |pool: Option<&PortPool>| {
            pool.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.nodes == Some(n) && s.nodes_counted_at.is_some())
        }
    };
    let counted = until_object(&pools, &pool, Duration::from_secs(30), nodes_are(3)).await;
    eprintln!("follow nodes: 3 nodes counted onto the pool within {counted:?}");

    // Pods of 1 port on 3 nodes: copy 0, then copies 1 and 2 (1 x 2 < 3); copy 3 is refused.
    for (name, copy) in [("a", 0), ("b", 1), ("c", 2)] {
        let run = create(kubeconfig, &ns, &pool, name);
        assert!(run.ok(), "{run}");
        assert!(
            copy_exists(&client, &pool, copy).await,
            "{name} in copy {copy}"
        );
    }
    let refused = create(kubeconfig, &ns, &pool, "d");
    assert!(!refused.ok(), "{refused}");
    let reason = "copy 3 refused: pods of 1 port with 3 other holders per port could be kept \
                  off 3 of the pool's 3 nodes";
    assert!(refused.stderr.contains(reason), "{refused}");
    assert!(!copy_exists(&client, &pool, 3).await);

    // Applied as kubectl would (no check before it is stored): the watcher records the same
    // refusal on it, and tries again at every resync.
    let allocations: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    allocations
        .create(&PostParams::default(), &support::allocation("d", &pool, 4))
        .await
        .unwrap();
    until_object(&allocations, "d", Duration::from_secs(30), |pa| {
        pa.and_then(|pa| pa.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == CONDITION_READY && c.message.contains(reason))
        })
    })
    .await;

    // What readers see: the nodes, when counted, the copies allowed and why not one more.
    let described = cluster.run(&["pool", "describe", &pool]);
    assert!(described.ok(), "{described}");
    let selector = format!("{LABEL}={group}");
    assert!(
        described
            .stdout
            .contains(&format!("Nodes:        3 ({selector}), counted ")),
        "{described}"
    );
    assert!(
        described
            .stdout
            .contains("    1 port   copies 0-2; copy 3 refused: pods of 1 port with 3 other"),
        "{described}"
    );

    // Two more nodes: the watcher counts 5, and its next resync places d in copy 3.
    add_nodes(&client, &group, 3, 2).await;
    let recounted = until_object(&pools, &pool, Duration::from_secs(30), nodes_are(5)).await;
    let placed = until_object(&allocations, "d", Duration::from_secs(30), ready).await;
    assert!(copy_exists(&client, &pool, 3).await, "d in copy 3");
    eprintln!("follow nodes: 5 nodes counted within {recounted:?}, d placed {placed:?} after");
    crate::support::invariants::assert_consistent(&client, &pool).await;

    let (_, log) = watcher.terminate();
    assert!(log.contains("counted the pool's nodes"), "{log}");
}

#[tokio::test]
async fn without_a_watcher_an_allocation_counts_the_nodes_itself() {
    let client = support::client().await;
    let ns = support::namespace(&client, "follow-cli").await;
    let pool = support::unique_name("follow-cli");
    let group = support::unique_name("cnodes");
    add_nodes(&client, &group, 0, 2).await;
    create_following_pool(&support::cluster().kubeconfig, &pool, &group);

    // No watcher: status.nodes stays empty, and the CLI counts 2 nodes itself: copy 1 is
    // allowed (1 x 1 < 2), copy 2 is not.
    for (name, copy) in [("a", 0), ("b", 1)] {
        let run = create(&support::cluster().kubeconfig, &ns, &pool, name);
        assert!(run.ok(), "{run}");
        assert!(
            copy_exists(&client, &pool, copy).await,
            "{name} in copy {copy}"
        );
    }
    let refused = create(&support::cluster().kubeconfig, &ns, &pool, "c");
    assert!(!refused.ok(), "{refused}");
    assert!(
        refused.stderr.contains(
            "copy 2 refused: pods of 1 port with 2 other holders per port could be kept off 2 of \
             the pool's 2 nodes"
        ),
        "{refused}"
    );
    let read: Api<PortPool> = Api::all(client.clone());
    let status = read.get(&pool).await.unwrap().status.unwrap_or_default();
    assert_eq!(status.nodes, None, "the CLI writes no count");

    let described = cli::run(&["pool", "describe", &pool]);
    assert!(
        described
            .stdout
            .contains("counted now by this command: no watcher keeps status.nodes"),
        "{described}"
    );
    remove_nodes(&client, &group, 2).await;
}

#[tokio::test]
async fn node_reuse_and_follow_nodes_together_are_refused_saying_which_to_keep() {
    let pool = support::unique_name("follow-both");
    let run = cli::run(&[
        "pool",
        "create",
        &pool,
        "--range",
        RANGE,
        "--node-reuse",
        "2",
        "--follow-nodes",
        "--allow-overlap",
    ]);
    assert!(!run.ok(), "{run}");
    assert!(
        run.stderr.contains("Keep followNodes and remove nodeReuse"),
        "{run}"
    );
    // The server refuses it too (the schema's rule), for manifests applied with kubectl.
    let client = support::client().await;
    let pools: Api<PortPool> = Api::all(client);
    let mut both: PortPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "portalloc.dev/v1alpha1",
        "kind": "PortPool",
        "metadata": {"name": pool},
        "spec": {"ranges": [RANGE], "nodeReuse": 2, "followNodes": {}}
    }))
    .unwrap();
    both.metadata.name = Some(pool.clone());
    let error = pools
        .create(&PostParams::default(), &both)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("set either nodeReuse"), "{error}");
}

#[tokio::test]
async fn a_user_who_may_not_list_nodes_gets_copy_0_only_and_is_told_why() {
    use crate::support::apply::{apply_yaml, bind, create_namespace};
    use crate::support::{USER_CONTEXT, USER_NAME};

    // Cluster-wide bindings: a control plane of its own, as the RBAC tests have.
    let Some(cluster) = PrivateCluster::start("follow-rbac", true) else {
        return;
    };
    let admin = cluster.client().await;
    let rbac =
        |name: &str| std::fs::read_to_string(support::repo_root().join("rbac").join(name)).unwrap();
    apply_yaml(&admin, &rbac("portalloc-user.yaml"), None).await;
    create_namespace(&admin, "team-a").await;
    bind(
        &admin,
        "portalloc-user",
        "portalloc-user",
        USER_NAME,
        Some("team-a"),
    )
    .await;
    bind(
        &admin,
        "portalloc-pool-user",
        "portalloc-pool-user",
        USER_NAME,
        None,
    )
    .await;
    add_nodes(&admin, "rbac-nodes", 0, 3).await;
    let created = cluster.run(&[
        "pool",
        "create",
        "fp",
        "--range",
        "23000-23003",
        "--follow-nodes",
    ]);
    assert!(created.ok(), "{created}");

    let as_user = |name: &str| {
        let manifest = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            manifest.path(),
            support::simple_allocation(name, "fp", "web", 4, &["http"]),
        )
        .unwrap();
        let path = manifest.path().to_str().unwrap().to_string();
        cluster.run(&[
            "--context",
            USER_CONTEXT,
            "create",
            "-n",
            "team-a",
            "-f",
            &path,
        ])
    };
    let first = as_user("a");
    assert!(first.ok(), "copy 0 needs no count: {first}");
    let second = as_user("b");
    assert!(!second.ok(), "{second}");
    assert!(
        second.stderr.contains(
            "copy 1 refused: the pool follows the nodes, but they are not counted (status.nodes \
             is empty (no watcher counts them) and this identity may not list nodes \
             (Forbidden: list nodes)), so only copy 0 is used"
        ),
        "{second}"
    );
    // An identity that may list them (the admin) counts 3 and takes copy 1.
    let manifest = support::simple_allocation("b", "fp", "web", 4, &["http"]);
    let path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(path.path(), manifest).unwrap();
    let by_admin = cluster.run(&[
        "create",
        "-n",
        "team-a",
        "-f",
        path.path().to_str().unwrap(),
    ]);
    assert!(by_admin.ok(), "{by_admin}");
}

//! The node agent on SIGTERM: a rollout or a pod deletion (its DaemonSet still there) keeps the
//! guard attached and the reserved ports (and the next release's agent upgrades the guard in
//! place); an uninstall (its DaemonSet being deleted, or gone)
//! removes both, as `node-agent --detach` does, leaving others' reserved entries. A control
//! plane of its own (no controller-manager: the DaemonSet and the agent's pod are objects only),
//! the agent on a simulated node (tests/common/agent_node.rs) with CAP_BPF and CAP_NET_ADMIN
//! only, as the chart runs it.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

use portalloc::node::bind_guard::{self, BindGuard};
use portalloc::node::reserved_ports::parse;

use crate::support::agent_node::AgentNode;
use crate::support::private_cluster::PrivateCluster;

const NAMESPACE: &str = portalloc::ledger::node_report::NODE_AGENT_NAMESPACE;
const DAEMONSET: &str = "portalloc-node-agent";
const POD: &str = "portalloc-node-agent-x7k2p";
const HOLD: &str = "portalloc.dev/e2e-hold";
const OTHERS: &str = "30000-32767,33000-33009";
const POOL: &str = "46100-46109";

fn until(within: Duration, what: &str, mut check: impl FnMut() -> bool, log: impl Fn() -> String) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < within,
            "{what} did not happen within {within:?}; agent log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn reserved(node: &AgentNode) -> std::collections::BTreeSet<u16> {
    parse(&node.sh("cat /proc/sys/net/ipv4/ip_local_reserved_ports")).unwrap()
}

const OLD_VERSION: &str = "0123456789abcdef";
const OLD_LAYOUT: &str = "deadbeef";

fn pin_names(node: &AgentNode) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(node.cgroups.pins())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Rename the pins as an agent of another release (another program, other maps) left them.
fn as_another_release(node: &AgentNode) {
    let pins = node.cgroups.pins();
    let version = bind_guard::program_version();
    let layout = format!("map_{}_", bind_guard::layout());
    for name in pin_names(node) {
        let renamed = if let Some(map) = name.strip_prefix(&layout) {
            format!("map_{OLD_LAYOUT}_{map}")
        } else {
            name.replace(&version, OLD_VERSION)
        };
        std::fs::rename(pins.join(&name), pins.join(renamed)).unwrap();
    }
}

fn attached(node: &AgentNode) -> usize {
    BindGuard::attached(&node.cgroups.kubepods(), &node.cgroups.pins()).unwrap()
}

/// The agent started and its guard attached and pool reserved.
fn start(node: &mut AgentNode, took_over: bool) {
    node.start_agent(&[
        "-v",
        "1",
        "--node-name",
        "node-a",
        "--pod-name",
        POD,
        "--lease-namespace",
        NAMESPACE,
        "--round",
        "100ms",
        "--guard-lease",
        "2s",
    ]);
    let expect = format!("took_over={took_over}");
    until(
        Duration::from_secs(20),
        "the guard attached",
        || node.log().contains("bind guard attached") && node.log().contains(&expect),
        || node.log(),
    );
    let pool = parse(POOL).unwrap();
    until(
        Duration::from_secs(20),
        "the pool reserved",
        || reserved(node).is_superset(&pool),
        || node.log(),
    );
    assert_eq!(attached(node), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sigterm_the_agent_removes_the_guard_only_when_its_daemonset_goes() {
    let Some(cluster) = PrivateCluster::start("node-agent-removal", true) else {
        return;
    };
    let client = cluster.client().await;
    let run = cluster.run(&[
        "pool", "create", "guarded", "--range", POOL, "--guard", "Enforce",
    ]);
    assert!(run.ok(), "{run}");
    crate::support::create_namespace(&client, NAMESPACE).await;
    // The chart's DaemonSet (held by a finalizer, so its deletion shows first as a
    // deletionTimestamp) and the agent's pod it controls.
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let labels = serde_json::json!({"app.kubernetes.io/component": "node-agent"});
    let daemonset: DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": DAEMONSET, "finalizers": [HOLD]},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "node-agent", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }))
    .unwrap();
    let daemonset = daemonsets
        .create(&PostParams::default(), &daemonset)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": POD,
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": DAEMONSET,
                "uid": daemonset.metadata.uid.clone().unwrap(),
                "controller": true,
            }],
        },
        "spec": {
            "nodeName": "node-a",
            "containers": [{"name": "node-agent", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    let mut node = AgentNode::start(&cluster.kubeconfig, "removal");
    node.capabilities = Some(vec!["bpf", "net_admin"]);
    node.sh(&format!(
        "echo {OTHERS} > /proc/sys/net/ipv4/ip_local_reserved_ports"
    ));
    start(&mut node, false);

    // A rollout or a pod deletion: SIGTERM with the DaemonSet there keeps everything.
    let status = node.terminate_agent();
    assert!(status.success(), "{status}: {}", node.log());
    assert!(
        node.log()
            .contains("node agent stopped; the guard stays attached"),
        "{}",
        node.log()
    );
    assert_eq!(attached(&node), 2, "the guard stays");
    assert!(
        reserved(&node).is_superset(&parse(POOL).unwrap()),
        "the pool stays reserved"
    );
    // The next agent is of another release: the pins name another program version and map
    // layout. It fills new maps in its first round, then swaps its program into the links.
    as_another_release(&node);
    start(&mut node, false);
    until(
        Duration::from_secs(20),
        "the upgrade in place",
        || node.log().contains("bind guard upgraded in place"),
        || node.log(),
    );
    let names = pin_names(&node);
    let version = bind_guard::program_version();
    assert!(names.contains(&format!("link4_{version}")), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.contains(OLD_VERSION) || n.contains(OLD_LAYOUT)),
        "{names:?}"
    );
    assert_eq!(names.len(), 10, "{names:?}");
    assert_eq!(attached(&node), 2);
    let status = node.terminate_agent();
    assert!(status.success(), "{status}: {}", node.log());
    start(&mut node, true);

    // Uninstalled: the DaemonSet being deleted (its finalizer holds it).
    daemonsets
        .delete(DAEMONSET, &DeleteParams::default())
        .await
        .unwrap();
    let status = node.terminate_agent();
    assert!(status.success(), "{status}: {}", node.log());
    let log = node.log();
    assert!(
        log.contains(&format!(
            "its DaemonSet {NAMESPACE}/{DAEMONSET} is being deleted"
        )),
        "{log}"
    );
    assert!(log.contains("detached 2 bind guard programs"), "{log}");
    assert_eq!(attached(&node), 0, "the guard is detached");
    assert!(!node.cgroups.pins().exists(), "and its pins removed");
    assert_eq!(
        reserved(&node),
        parse(OTHERS).unwrap(),
        "exactly others' entries stay"
    );

    // Started again (the pod still names the DaemonSet), then the DaemonSet gone: the same.
    start(&mut node, false);
    daemonsets
        .patch(
            DAEMONSET,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    let status = node.terminate_agent();
    assert!(status.success(), "{status}: {}", node.log());
    let log = node.log();
    assert!(
        log.contains(&format!("its DaemonSet {NAMESPACE}/{DAEMONSET} is gone")),
        "{log}"
    );
    assert_eq!(attached(&node), 0, "the guard is detached");
    assert_eq!(reserved(&node), parse(OTHERS).unwrap());
    drop(node);
}

/// `helm uninstall` deletes the agent's DaemonSet, ServiceAccount and RBAC at once, often before
/// kubelet stops the pod: the agent, on its own ServiceAccount's token (bound to its pod, as
/// kubelet mounts it) and the shipped RBAC, finds its reads refused on SIGTERM and still takes
/// the guard and its reserved ports off the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninstall_that_takes_the_agents_account_first_still_removes_the_guard() {
    let Some(cluster) = PrivateCluster::start("node-agent-uninstall", true) else {
        return;
    };
    let admin = cluster.client().await;
    let run = cluster.run(&[
        "pool", "create", "guarded", "--range", POOL, "--guard", "Enforce",
    ]);
    assert!(run.ok(), "{run}");
    crate::support::create_namespace(&admin, NAMESPACE).await;
    crate::node_agent_lease::apply_shipped_agent(&admin).await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), NAMESPACE);
    let labels = serde_json::json!({"app.kubernetes.io/component": "node-agent"});
    let daemonset: DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": DAEMONSET},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "node-agent", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }))
    .unwrap();
    let daemonset = daemonsets
        .create(&PostParams::default(), &daemonset)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Node node-a and the agent's pod agent-node-a on it, with a token bound to that pod.
    crate::node_agent_lease::agent_on(&admin, &cluster.kubeconfig, dir.path(), "node-a").await;
    let token_kubeconfig = dir.path().join("agent-node-a.kubeconfig");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    pods.patch(
        "agent-node-a",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"ownerReferences": [{
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": DAEMONSET,
            "uid": daemonset.metadata.uid.clone().unwrap(),
            "controller": true,
        }]}})),
    )
    .await
    .unwrap();

    let mut node = AgentNode::start(&token_kubeconfig, "uninstall");
    node.capabilities = Some(vec!["bpf", "net_admin"]);
    node.sh(&format!(
        "echo {OTHERS} > /proc/sys/net/ipv4/ip_local_reserved_ports"
    ));
    node.start_agent(&[
        "-v",
        "1",
        "--node-name",
        "node-a",
        "--pod-name",
        "agent-node-a",
        "--lease-namespace",
        NAMESPACE,
        "--round",
        "100ms",
        "--guard-lease",
        "2s",
    ]);
    let pool = parse(POOL).unwrap();
    until(
        Duration::from_secs(20),
        "the guard attached and the pool reserved",
        || node.log().contains("bind guard attached") && reserved(&node).is_superset(&pool),
        || node.log(),
    );
    assert!(
        !node
            .log()
            .contains("on SIGTERM the guard and the reserved ports stay"),
        "the shipped RBAC lets the agent read its pod and DaemonSet: {}",
        node.log()
    );

    // As helm uninstall: the DaemonSet, then the agent's RBAC and ServiceAccount.
    daemonsets
        .delete(DAEMONSET, &DeleteParams::default())
        .await
        .unwrap();
    for (kind, namespaced) in [
        ("RoleBinding", true),
        ("Role", true),
        ("ClusterRoleBinding", false),
        ("ClusterRole", false),
        ("ServiceAccount", true),
    ] {
        let namespace = if namespaced {
            vec!["-n", NAMESPACE]
        } else {
            vec![]
        };
        let mut args = vec!["delete", kind, "portalloc-node-agent"];
        args.extend(namespace);
        let out = std::process::Command::new(crate::support::tools::kubectl())
            .args(&args)
            .env("KUBECONFIG", &cluster.kubeconfig)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let status = node.terminate_agent();
    assert!(status.success(), "{status}: {}", node.log());
    let log = node.log();
    let why = log
        .lines()
        .find(|l| l.contains("taking the guard and the agent's reserved ports off the node"))
        .unwrap_or_else(|| panic!("no removal said: {log}"));
    eprintln!("the agent on SIGTERM after the uninstall: {why}");
    assert_eq!(attached(&node), 0, "the guard is detached");
    assert_eq!(
        reserved(&node),
        parse(OTHERS).unwrap(),
        "exactly others' entries stay"
    );
    drop(node);
}

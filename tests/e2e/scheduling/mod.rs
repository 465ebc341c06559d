//! The scheduler keeps holders of a port apart: the pod webhook declares each hostNetwork
//! pod's ports in its spec, and the real kube-scheduler's NodePorts filter then never puts two
//! pods that bind one port on one node. Pods come from the real StatefulSet (and Deployment)
//! controllers through the webhook process; the node simulation then runs each node's pods in
//! that node's own network namespace, binding every port each pod was given.

mod follow_spread;
pub mod harness;
mod reuse;
mod service;
mod service_proxy;
mod spread;

use std::collections::BTreeMap;

use crate::simulation::pods::Manifest;
use crate::support::nodes::NodeShape;
use harness::{NO_FREE_PORTS, ScheduledCluster, assert_node_ports_unique, declared_ports, node_of};

/// Every port a pod declares was bound by its stand-ins, in its node's namespace, and no bind
/// anywhere failed (EADDRINUSE or other).
fn assert_every_declared_port_bound(
    outcome: &crate::simulation::run::Outcome,
    pods: &[k8s_openapi::api::core::v1::Pod],
) {
    let refused = outcome.refused_binds();
    assert!(refused.is_empty(), "binds refused: {refused:#?}");
    for pod in pods {
        let name = pod.metadata.name.as_deref().unwrap();
        let bound: Vec<u64> = outcome
            .runs
            .iter()
            .filter(|r| r.pod.name == name)
            .flat_map(|r| r.binds())
            .map(|(port, _)| port)
            .collect();
        for (port, _) in declared_ports(pod) {
            assert!(
                bound.contains(&u64::from(port)),
                "pod {name} declares {port} but bound only {bound:?}"
            );
        }
    }
}

/// examples/sglang-pd-webhook.yaml as written (its pool, its namespace, `kubectl apply` alone)
/// on two nodes: six pods, so nodes are shared. Every pod is made by its controller, admitted
/// with its env and declared ports, bound by the scheduler; then every node runs its pods in
/// its own network namespace, and the router reaches every server across nodes.
#[tokio::test]
async fn the_sglang_pd_webhook_example_placed_by_the_scheduler_runs_on_its_nodes() {
    let Some(sc) = ScheduledCluster::start("sched-example", 2, &NodeShape::gpu_server()).await
    else {
        return;
    };
    let ns = "llm";
    sc.namespace(ns).await;
    let path = crate::support::repo_root().join("examples/sglang-pd-webhook.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    sc.apply(ns, &text);
    let pods = sc.wait_scheduled(ns, 6).await;
    let by_node = assert_node_ports_unique(&pods);
    eprintln!("placement: {by_node:?}");
    sc.assert_pods_agree(ns, &pods).await;
    for pod in &pods {
        assert!(
            !declared_ports(pod).is_empty(),
            "{:?} is a hostNetwork pod of the allocation: its ports are declared",
            pod.metadata.name
        );
    }

    let outcome = sc.simulate(ns, &Manifest::parse(&text), &pods).await;
    outcome.assert_clean();
    assert_every_declared_port_bound(&outcome, &pods);
    let router = outcome
        .runs
        .iter()
        .find(|r| r.pod.workload == "Deployment/router")
        .expect("the router ran");
    let mut servers: Vec<String> = ["prefill-0", "prefill-1", "decode-0", "decode-1", "decode-2"]
        .map(String::from)
        .to_vec();
    servers.sort();
    let reached: Vec<String> = outcome.reached(&router.pod.name).into_iter().collect();
    assert_eq!(
        reached, servers,
        "the router reaches every server, on whichever node"
    );
}

/// Two roles with a RoleScoped port each (every pod of a role binds it) and a third with a
/// requested port that another hostNetwork pod already declares on two of the three nodes.
/// The ports alone decide placement: each node gets exactly one pod of each role, the third
/// role's pod the one node where its port is free, and a fourth pod of a role has no node at
/// all ("didn't have free ports"), although every node has the GPUs it asks for.
#[tokio::test]
async fn declared_ports_decide_placement_on_shared_nodes() {
    let Some(sc) = ScheduledCluster::start("sched-ports", 3, &NodeShape::gpu_server()).await else {
        return;
    };
    let ns = "grid";
    sc.namespace(ns).await;
    sc.apply(ns, FOREIGN);
    let text = grid(3);
    sc.apply(ns, &text);
    let pods = sc.wait_scheduled(ns, 3 + 3 + 1 + 2).await;
    let by_node = assert_node_ports_unique(&pods);
    eprintln!("placement: {by_node:?}");
    for (node, names) in &by_node {
        for role in ["a-", "b-"] {
            let count = names.iter().filter(|n| n.starts_with(role)).count();
            assert_eq!(count, 1, "{node} runs one pod of role {role}: {names:?}");
        }
    }
    let c = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("c-0"))
        .unwrap();
    assert_eq!(
        node_of(c),
        Some("node-2"),
        "port 40900 is free only on node-2 (foreign pods declare it on node-0 and node-1)"
    );
    sc.assert_pods_agree(ns, &pods).await;

    let manifest = Manifest::parse(&format!("{FOREIGN}---\n{text}"));
    let outcome = sc.simulate(ns, &manifest, &pods).await;
    outcome.assert_clean();
    assert_every_declared_port_bound(&outcome, &pods);

    // One more pod of role a (one edit, as the examples scale): every node already has a pod
    // binding a's RoleScoped port.
    sc.apply(ns, &grid(4));
    let why = sc.wait_unschedulable(ns, "a-3").await;
    assert!(
        why.contains(&format!("3 node(s) {NO_FREE_PORTS}")),
        "a-3 is refused for its ports on every node: {why}"
    );
    let after = sc.pods(ns).await;
    let placed: BTreeMap<String, Option<String>> = after
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                node_of(p).map(str::to_string),
            )
        })
        .collect();
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap();
        assert_eq!(
            placed[&name].as_deref(),
            node_of(pod),
            "{name} stays where it was"
        );
    }
}

/// Pods that are none of ours: hostNetwork, declaring port 40900, bound to node-0 and node-1
/// directly (nodeName, no scheduler), binding it when run.
const FOREIGN: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: foreign-0, labels: {app: foreign}}
spec:
  nodeName: node-0
  hostNetwork: true
  containers:
  - name: server
    image: lmsysorg/sglang:latest
    command: [python3, -m, sglang.launch_server]
    args: [--model-path, /models/m, --host, 0.0.0.0, --port, "40900"]
    ports: [{containerPort: 40900, hostPort: 40900}]
---
apiVersion: v1
kind: Pod
metadata: {name: foreign-1, labels: {app: foreign}}
spec:
  nodeName: node-1
  hostNetwork: true
  containers:
  - name: server
    image: lmsysorg/sglang:latest
    command: [python3, -m, sglang.launch_server]
    args: [--model-path, /models/m, --host, 0.0.0.0, --port, "40900"]
    ports: [{containerPort: 40900, hostPort: 40900}]
"#;

/// A pool, a PortAllocation of roles a and b (`a_replicas` pods of a, 3 of b, each binding its
/// role's RoleScoped http port and a nccl port of its own) and c (one pod, the requested port
/// 40900), and their StatefulSets asking 2 GPUs a pod.
fn grid(a_replicas: u32) -> String {
    let mut text = format!(
        r#"
apiVersion: portalloc.dev/v1alpha1
kind: PortPool
metadata: {{name: grid}}
spec:
  ranges: ["40000-40999"]
---
apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {{name: grid}}
spec:
  pool: grid
  roles:
  - name: a
    replicas: {a_replicas}
    workload: {{kind: StatefulSet, name: a, service: grid}}
    ports:
    - {{name: http, scope: RoleScoped, env: HTTP_PORT}}
    - {{name: nccl, scope: PodScoped, env: NCCL_PORT}}
  - name: b
    replicas: 3
    workload: {{kind: StatefulSet, name: b, service: grid}}
    ports:
    - {{name: http, scope: RoleScoped, env: HTTP_PORT}}
    - {{name: nccl, scope: PodScoped, env: NCCL_PORT}}
  - name: c
    replicas: 1
    workload: {{kind: StatefulSet, name: c, service: grid}}
    ports:
    - {{name: http, scope: RoleScoped, env: HTTP_PORT, port: 40900}}
---
apiVersion: v1
kind: Service
metadata: {{name: grid}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: grid}}
"#
    );
    for (role, replicas, nccl) in [("a", a_replicas, true), ("b", 3, true), ("c", 1, false)] {
        let nccl = if nccl {
            ", --nccl-port, $(NCCL_PORT)"
        } else {
            ""
        };
        text.push_str(&format!(
            r#"---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: {role}}}
spec:
  replicas: {replicas}
  serviceName: grid
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: grid, role: {role}}}
  template:
    metadata:
      labels: {{app: grid, role: {role}, portalloc.dev/allocation: grid}}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      containers:
      - name: engine
        image: lmsysorg/sglang:latest
        command: [python3, -m, sglang.launch_server]
        args: [--model-path, /models/m, --host, 0.0.0.0, --port, $(HTTP_PORT){nccl}]
        resources:
          limits: {{nvidia.com/gpu: 2}}
"#
        ));
    }
    text
}

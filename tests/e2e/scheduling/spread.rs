//! A workload bigger than its pool's range: 24 hostNetwork Ray workers of 4 ports each (96
//! ports) from a pool of 40 ports with `nodeReuse: 4`. No copy takes the workload whole, so
//! its pods spread over the copies; the real StatefulSet controller makes the pods, the pod
//! webhook admits them, the real kube-scheduler places them on 6 nodes, and each node runs its
//! pods in its own network namespace, every port bound once on its node.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::Api;
use portalloc::api::PortAllocation;

use crate::simulation::pods::Manifest;
use crate::support::invariants::{assert_consistent, pool_record};
use crate::support::nodes::NodeShape;

use super::assert_every_declared_port_bound;
use super::harness::{ScheduledCluster, assert_node_ports_unique, declared_ports, node_of};

const WORKERS: usize = 24;

#[tokio::test]
async fn a_statefulset_bigger_than_the_range_spreads_over_copies_and_every_node_binds_its_ports() {
    let Some(sc) = ScheduledCluster::start("sched-spread", 6, &NodeShape::gpu_server()).await
    else {
        return;
    };
    let ns = "spread";
    sc.namespace(ns).await;
    sc.apply(ns, MANIFEST);
    let pods = sc.wait_scheduled(ns, WORKERS + 1).await;
    let by_node = assert_node_ports_unique(&pods);
    eprintln!("placement: {by_node:?}");

    // The workload holds 96 ports of a 40-port pool, each pod's 4 in one copy.
    let allocations: Api<PortAllocation> = Api::namespaced(sc.client.clone(), ns);
    let pa = allocations.get("ray-workers").await.unwrap();
    let status = pa.status.clone().unwrap();
    assert_eq!(status.ports.as_deref(), Some("96/96"), "{status:?}");
    let mut copies_per_pod: BTreeMap<usize, BTreeSet<i32>> = BTreeMap::new();
    for assignment in &status.assignments {
        assert_eq!(assignment.copies.len(), WORKERS, "{assignment:?}");
        for (pod, &copy) in assignment.copies.iter().enumerate() {
            copies_per_pod.entry(pod).or_default().insert(copy);
        }
    }
    assert!(
        copies_per_pod.values().all(|c| c.len() == 1),
        "each pod's ports in one copy: {copies_per_pod:?}"
    );
    let record = pool_record(&sc.client, "ray").await;
    assert_eq!(
        record.copies_in_use(),
        BTreeSet::from([0, 1, 2]),
        "copies fill in order: 10 + 10 + 4 pods"
    );
    let held = assert_consistent(&sc.client, "ray").await;
    assert_eq!(
        held.get(&pa.metadata.uid.clone().unwrap())
            .map(|h| h.port_count()),
        Some(96)
    );

    // A port held by several workers: on as many different nodes.
    let mut holders: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| !declared_ports(p).is_empty()) {
        for (port, _) in declared_ports(pod) {
            holders
                .entry(port)
                .or_default()
                .push(node_of(pod).unwrap().to_string());
        }
    }
    assert_eq!(holders.len(), 40, "every port of the pool is in use");
    for (port, nodes) in &holders {
        let distinct: BTreeSet<&String> = nodes.iter().collect();
        assert_eq!(distinct.len(), nodes.len(), "port {port} on {nodes:?}");
    }
    assert_eq!(holders.values().map(Vec::len).max(), Some(3));

    sc.assert_pods_agree(ns, &pods).await;
    let run = sc.plugin(&[
        "resolve",
        "ray-workers",
        "--pod",
        "ray-workers-23",
        "-n",
        ns,
    ]);
    assert!(run.ok(), "resolve of a pod in copy 2: {run}");

    let outcome = sc.simulate(ns, &Manifest::parse(MANIFEST), &pods).await;
    outcome.assert_clean();
    assert_every_declared_port_bound(&outcome, &pods);
}

/// The pool (below the kernel's ephemeral range, 32768-60999, so that the ports Ray's agents
/// take at random on a node never land on a worker's), a Ray head (on the host network, Ray's default ports, outside the pool) and 24
/// workers that pin the four ports Ray would otherwise take at random or at a default that
/// collides on a shared node (52365), from the pool through the webhook.
const MANIFEST: &str = r#"
apiVersion: portalloc.dev/v1alpha1
kind: PortPool
metadata: {name: ray}
spec:
  ranges: ["20000-20039"]
  nodeReuse: 4
---
apiVersion: v1
kind: Service
metadata: {name: ray}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: ray}
---
apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: ray-workers}
spec:
  pool: ray
  roles:
  - name: worker
    replicas: 24
    workload: {kind: StatefulSet, name: ray-workers, service: ray}
    ports:
    - {name: node-manager, scope: PodScoped, env: RAY_NODE_MANAGER_PORT}
    - {name: object-manager, scope: PodScoped, env: RAY_OBJECT_MANAGER_PORT}
    - {name: agent, scope: PodScoped, env: RAY_AGENT_PORT}
    - {name: metrics, scope: PodScoped, env: RAY_METRICS_PORT}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ray-head}
spec:
  replicas: 1
  serviceName: ray
  selector:
    matchLabels: {app: ray, ray: head}
  template:
    metadata:
      labels: {app: ray, ray: head}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      containers:
      - name: head
        image: rayproject/ray:2.40.0
        command: [ray, start, --head, --block, --port=6379, --include-dashboard=false]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ray-workers}
spec:
  replicas: 24
  serviceName: ray
  podManagementPolicy: Parallel
  selector:
    matchLabels: {app: ray, ray: worker}
  template:
    metadata:
      labels: {app: ray, ray: worker, portalloc.dev/allocation: ray-workers}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      containers:
      - name: worker
        image: rayproject/ray:2.40.0
        command: [ray, start, --address=ray-head-0.ray:6379, --block]
        args:
        - --node-manager-port=$(RAY_NODE_MANAGER_PORT)
        - --object-manager-port=$(RAY_OBJECT_MANAGER_PORT)
        - --dashboard-agent-listen-port=$(RAY_AGENT_PORT)
        - --metrics-export-port=$(RAY_METRICS_PORT)
"#;

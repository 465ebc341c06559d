//! A pool with `nodeReuse: 3` whose ports are held three times over, placed by the real
//! scheduler: the holders of a port always land on different nodes, and each node runs its
//! pods, every port bound, with no EADDRINUSE.

use std::collections::BTreeMap;

use crate::simulation::pods::Manifest;
use crate::support::invariants::{assert_consistent, pool_record};
use crate::support::nodes::NodeShape;

use super::assert_every_declared_port_bound;
use super::harness::{ScheduledCluster, assert_node_ports_unique, declared_ports, node_of};

/// Three PortAllocations of two 4-GPU pods with two ports each, in a pool of 4 ports kept three
/// times: each takes a whole copy, so every port has three holders. Three nodes of 8 GPUs hold
/// exactly the six pods, and only the declared ports keep two holders of a port apart.
#[tokio::test]
async fn the_holders_of_a_reused_port_are_placed_on_different_nodes_and_all_run() {
    let Some(sc) = ScheduledCluster::start("sched-reuse", 3, &NodeShape::gpu_server()).await else {
        return;
    };
    let ns = "reuse";
    sc.namespace(ns).await;
    let text = fleet(&["east", "west", "north"]);
    sc.apply(ns, &text);
    let pods = sc.wait_scheduled(ns, 6).await;
    let by_node = assert_node_ports_unique(&pods);
    eprintln!("placement: {by_node:?}");

    // Every port is held three times, once per copy, each time by a pod on another node.
    let mut holders: BTreeMap<u16, Vec<(String, String)>> = BTreeMap::new();
    for pod in &pods {
        for (port, _) in declared_ports(pod) {
            holders.entry(port).or_default().push((
                pod.metadata.name.clone().unwrap(),
                node_of(pod).unwrap().to_string(),
            ));
        }
    }
    assert_eq!(holders.len(), 4, "the pool's 4 ports: {holders:?}");
    for (port, held) in &holders {
        assert_eq!(
            held.len(),
            3,
            "port {port} has a holder in each copy: {held:?}"
        );
        let mut nodes: Vec<&str> = held.iter().map(|(_, node)| node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        assert_eq!(
            nodes.len(),
            3,
            "port {port}'s holders on three nodes: {held:?}"
        );
    }
    sc.assert_pods_agree(ns, &pods).await;
    let client = sc.client.clone();
    let record = pool_record(&client, "reused").await;
    assert_eq!(record.copies_in_use().len(), 3);
    assert_eq!(assert_consistent(&client, "reused").await.len(), 3);

    let outcome = sc.simulate(ns, &Manifest::parse(&text), &pods).await;
    outcome.assert_clean();
    assert_every_declared_port_bound(&outcome, &pods);
}

/// The pool, and per name a PortAllocation and its StatefulSet of two hostNetwork pods, each
/// binding its http and nccl ports and asking 4 GPUs.
fn fleet(names: &[&str]) -> String {
    let mut text = String::from(
        r#"
apiVersion: portalloc.dev/v1alpha1
kind: PortPool
metadata: {name: reused}
spec:
  ranges: ["41000-41003"]
  nodeReuse: 3
---
apiVersion: v1
kind: Service
metadata: {name: fleet}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: fleet}
"#,
    );
    for name in names {
        text.push_str(&format!(
            r#"---
apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {{name: {name}}}
spec:
  pool: reused
  roles:
  - name: engine
    replicas: 2
    workload: {{kind: StatefulSet, name: {name}, service: fleet}}
    ports:
    - {{name: http, scope: PodScoped, env: HTTP_PORT}}
    - {{name: nccl, scope: PodScoped, env: NCCL_PORT}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: {name}}}
spec:
  replicas: 2
  serviceName: fleet
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: fleet, allocation: {name}}}
  template:
    metadata:
      labels: {{app: fleet, allocation: {name}, portalloc.dev/allocation: {name}}}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      containers:
      - name: engine
        image: lmsysorg/sglang:latest
        command: [python3, -m, sglang.launch_server]
        args: [--model-path, /models/m, --host, 0.0.0.0, --port, $(HTTP_PORT), --nccl-port, $(NCCL_PORT)]
        resources:
          limits: {{nvidia.com/gpu: 4}}
"#
        ));
    }
    text
}

//! A workload bigger than one copy in a pool that follows its nodes: 20 hostNetwork pods of 4
//! ports from a 40-port pool on 6 nodes spread over copies 0 and 1 (4 ports x 1 other holder <
//! 6 nodes), each placed by the real kube-scheduler; a 21st pod would need copy 2
//! (4 x 2 = 8 >= 6) and is refused, until three more nodes let the watcher's recount allow it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use portalloc::api::{PortAllocation, PortPool};
use serde_json::json;

use crate::support::invariants::{assert_consistent, pool_record};
use crate::support::nodes::{NodeShape, Nodes};
use crate::support::watcher_process::WatcherProcess;

use super::harness::{ScheduledCluster, assert_node_ports_unique};

const MANIFEST: &str = r#"
apiVersion: portalloc.dev/v1alpha1
kind: PortPool
metadata: {name: fleet}
spec:
  ranges: ["20000-20039"]
  followNodes: {nodeSelector: {matchLabels: {grp: fn}}}
---
apiVersion: v1
kind: Service
metadata: {name: decode}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: decode}
---
apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: decode}
spec:
  pool: fleet
  roles:
  - name: decode
    replicas: 20
    workload: {kind: StatefulSet, name: decode, service: decode}
    ports:
    - {name: http, scope: PodScoped, env: HTTP_PORT}
    - {name: bootstrap, scope: PodScoped, env: BOOTSTRAP_PORT}
    - {name: nccl, scope: PodScoped, env: NCCL_PORT}
    - {name: metrics, scope: PodScoped, env: METRICS_PORT}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: decode}
spec:
  replicas: 20
  serviceName: decode
  podManagementPolicy: Parallel
  selector:
    matchLabels: {app: decode}
  template:
    metadata:
      labels: {app: decode, portalloc.dev/allocation: decode}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      containers:
      - name: decode
        image: lmsysorg/sglang:latest
        command: [python3, -m, sglang.launch_server]
        args: [--model-path, /models/m, --host, 0.0.0.0, --port, $(HTTP_PORT),
               --disaggregation-mode, decode, --disaggregation-bootstrap-port, $(BOOTSTRAP_PORT),
               --nccl-port, $(NCCL_PORT)]
"#;

fn shape() -> NodeShape {
    let mut shape = NodeShape::gpu_server();
    shape.labels.insert("grp".into(), "fn".into());
    shape
}

/// Poll `check` every 250 ms for up to a minute; panics with `what` and the last value.
async fn until<T: std::fmt::Debug>(what: &str, mut check: impl AsyncFnMut() -> (bool, T)) -> T {
    let started = Instant::now();
    loop {
        let (done, value) = check().await;
        if done {
            return value;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: still {value:?} after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Pods per copy of the PortAllocation's status, and its PORTS column.
fn pods_per_copy(pa: &PortAllocation) -> (BTreeMap<i32, usize>, Option<String>) {
    let status = pa.status.clone().unwrap_or_default();
    let mut pods: BTreeMap<i32, BTreeSet<usize>> = BTreeMap::new();
    for assignment in &status.assignments {
        for (pod, &copy) in assignment.copies.iter().enumerate() {
            pods.entry(copy).or_default().insert(pod);
        }
    }
    let counts = pods.into_iter().map(|(c, p)| (c, p.len())).collect();
    (counts, status.ports)
}

#[tokio::test]
async fn a_spread_workload_in_a_follow_nodes_pool_uses_every_copy_its_nodes_allow() {
    let Some(sc) = ScheduledCluster::start("sched-follow-spread", 6, &shape()).await else {
        return;
    };
    // The watcher of every namespace, which counts the pool's nodes onto its status.
    let dir = tempfile::tempdir().unwrap();
    let _watcher = WatcherProcess::start(
        &sc.cluster.kubeconfig,
        "fleet-watcher",
        &["-A", "--resync", "3s", "-v", "1"],
        dir.path(),
    );
    let ns = "fleet";
    sc.namespace(ns).await;
    sc.apply(ns, MANIFEST);
    let pools: Api<PortPool> = Api::all(sc.client.clone());
    let nodes_counted = async || {
        let pool = pools.get("fleet").await.unwrap();
        let nodes = pool.status.and_then(|s| s.nodes);
        (nodes.is_some(), nodes)
    };
    assert_eq!(
        until("the pool's nodes counted", nodes_counted).await,
        Some(6)
    );

    let pods = sc.wait_scheduled(ns, 20).await;
    let by_node = assert_node_ports_unique(&pods);
    let per_node: BTreeMap<&String, usize> = by_node.iter().map(|(n, p)| (n, p.len())).collect();
    eprintln!("pods per node: {per_node:?}");
    let allocations: Api<PortAllocation> = Api::namespaced(sc.client.clone(), ns);
    let (per_copy, ports) = pods_per_copy(&allocations.get("decode").await.unwrap());
    eprintln!("pods per copy: {per_copy:?}");
    assert_eq!(ports.as_deref(), Some("80/80"));
    assert_eq!(per_copy, BTreeMap::from([(0, 10), (1, 10)]));
    assert_eq!(
        pool_record(&sc.client, "fleet").await.copies_in_use(),
        BTreeSet::from([0, 1])
    );
    assert_consistent(&sc.client, "fleet").await;
    sc.assert_pods_agree(ns, &pods).await;

    // A 21st pod would need copy 2: 4 ports x 2 other holders = 8, not fewer than 6 nodes.
    let patch = Patch::Merge(json!({"spec": {"roles": [{"name": "decode", "replicas": 21,
        "workload": {"kind": "StatefulSet", "name": "decode", "service": "decode"},
        "ports": [{"name": "http", "scope": "PodScoped", "env": "HTTP_PORT"},
                  {"name": "bootstrap", "scope": "PodScoped", "env": "BOOTSTRAP_PORT"},
                  {"name": "nccl", "scope": "PodScoped", "env": "NCCL_PORT"},
                  {"name": "metrics", "scope": "PodScoped", "env": "METRICS_PORT"}]}]}}));
    allocations
        .patch("decode", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let refused = async || {
        let pa = allocations.get("decode").await.unwrap();
        let message = pa
            .status
            .iter()
            .flat_map(|s| s.conditions.iter())
            .find(|c| c.type_ == "Stalled" && c.status == "True")
            .map(|c| c.message.clone());
        (message.is_some(), message)
    };
    let reason = until("the 21st pod refused", refused).await.unwrap();
    assert!(
        reason.contains("could be kept off 6 of the pool's 6 nodes"),
        "the refusal gives the rule's figures: {reason}"
    );
    assert_eq!(
        pods_per_copy(&allocations.get("decode").await.unwrap())
            .0
            .len(),
        2
    );

    // Three more nodes match: 4 x 2 < 9, so the recount lets copy 2 in, and the pod runs.
    let _more = Nodes::register(&sc.client, &sc.cluster.kubeconfig, "more", 3, &shape())
        .await
        .unwrap();
    let allocated = async || {
        let (per_copy, ports) = pods_per_copy(&allocations.get("decode").await.unwrap());
        (ports.as_deref() == Some("84/84"), (per_copy, ports))
    };
    let (per_copy, _) = until("the 21st pod's ports after the recount", allocated).await;
    assert_eq!(per_copy, BTreeMap::from([(0, 10), (1, 10), (2, 1)]));
    sc.kubectl(
        &[
            "scale",
            "statefulset",
            "decode",
            "-n",
            ns,
            "--replicas",
            "21",
        ],
        None,
    );
    let pods = sc.wait_scheduled(ns, 21).await;
    assert_node_ports_unique(&pods);
    assert_consistent(&sc.client, "fleet").await;
    sc.assert_pods_agree(ns, &pods).await;
}

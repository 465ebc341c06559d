//! A plain Service in front of pods whose ports differ: the webhook names each declared port
//! after its role's port, so `targetPort: http` resolves pod by pod, and the real EndpointSlice
//! controller (kube-controller-manager) publishes each pod's endpoint on its own port.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::support::nodes::NodeShape;

use super::harness::{ScheduledCluster, declared_ports, node_of};

const MANIFEST: &str = r#"
apiVersion: portalloc.dev/v1alpha1
kind: PortPool
metadata: {name: served}
spec:
  ranges: ["41100-41109"]
---
apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: web}
spec:
  pool: served
  roles:
  - name: server
    replicas: 3
    workload: {kind: StatefulSet, name: web}
    ports:
    - {name: http, scope: PodScoped, env: HTTP_PORT}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  replicas: 3
  serviceName: web
  podManagementPolicy: Parallel
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web, portalloc.dev/allocation: web}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      containers:
      - name: server
        image: python:3.12-slim
        command: [python3, -m, http.server, $(HTTP_PORT)]
"#;

/// One pod behind Service `web`: where it runs and the port it holds.
pub struct Backend {
    pub pod: String,
    pub node: String,
    pub ip: String,
    pub port: u16,
}

#[tokio::test]
async fn a_service_with_a_named_target_port_reaches_each_pod_on_its_own_port() {
    let Some(sc) = ScheduledCluster::start("sched-service", 3, &NodeShape::gpu_server()).await
    else {
        return;
    };
    serve(&sc, "served").await;
}

/// Service `web` (port 80, `targetPort: http`) in `ns` in front of three hostNetwork pods whose
/// ports the webhook gave from one pool, each reported running and ready on its node's address
/// as a kubelet would; returns the pods once the real EndpointSlice controller's slices carry
/// each one, ready, on its own port (and fails if they do not).
pub async fn serve(sc: &ScheduledCluster, ns: &str) -> Vec<Backend> {
    sc.namespace(ns).await;
    sc.apply(ns, MANIFEST);
    let pods = sc.wait_scheduled(ns, 3).await;

    // What the node's kubelet would report: a hostNetwork pod runs on its node's address.
    let api: Api<Pod> = Api::namespaced(sc.client.clone(), ns);
    let mut backends = Vec::new();
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap();
        let node = node_of(pod).unwrap().to_string();
        let ip = sc.nodes.ip(&node).unwrap().to_string();
        let ports = declared_ports(pod);
        assert_eq!(ports.len(), 1, "{name} declares its http port: {ports:?}");
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = json!({"status": {
            "phase": "Running", "hostIP": ip, "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        }});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("status of {name}: {e}"));
        backends.push(Backend {
            pod: name,
            node,
            ip,
            port: ports[0].0,
        });
    }
    let want: BTreeSet<(String, i32)> = backends
        .iter()
        .map(|b| (b.ip.clone(), i32::from(b.port)))
        .collect();
    let distinct: BTreeSet<u16> = backends.iter().map(|b| b.port).collect();
    assert_eq!(distinct.len(), 3, "three pods, three ports: {want:?}");

    // Each pod's endpoint, ready, in a slice whose port is that pod's.
    let slices: Api<EndpointSlice> = Api::namespaced(sc.client.clone(), ns);
    let listed = ListParams::default().labels("kubernetes.io/service-name=web");
    let started = Instant::now();
    let got = loop {
        let mut got = BTreeSet::new();
        for slice in slices.list(&listed).await.unwrap().items {
            let ports = slice.ports.unwrap_or_default();
            let http: Vec<i32> = ports
                .iter()
                .filter(|p| p.name.as_deref() == Some("http"))
                .filter_map(|p| p.port)
                .collect();
            for endpoint in &slice.endpoints {
                let ready = endpoint.conditions.as_ref().and_then(|c| c.ready);
                for address in &endpoint.addresses {
                    for port in &http {
                        if ready == Some(true) {
                            got.insert((address.clone(), *port));
                        }
                    }
                }
            }
        }
        if got == want || started.elapsed() > Duration::from_secs(60) {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        got,
        want,
        "EndpointSlices of Service web (address, port) against the pods' own; kube-controller-manager:\n{}",
        sc.controllers.log_tail("kube-controller-manager", 20)
    );
    backends
}

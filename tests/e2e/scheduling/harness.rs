//! A cluster where pods go the whole way: made by real workload controllers, admitted by the
//! real pod webhook (a `kubectl portalloc sync --watch` process), placed by the real
//! kube-scheduler on Node objects the test keeps as kubelets would, then run by the node
//! simulation with one network namespace per node. Its own control plane (so the scheduler and
//! the controllers see only this test's objects), stopped when it is dropped.
//!
//! Use from another test:
//! ```ignore
//! let Some(sc) = ScheduledCluster::start("my-test", 3, &NodeShape::gpu_server()).await else {
//!     return; // a reused cluster: no control plane of our own
//! };
//! sc.namespace("ns").await;
//! sc.apply("ns", &manifest_text);
//! let pods = sc.wait_scheduled("ns", 9).await;   // every pod made and bound
//! assert_node_ports_unique(&pods);
//! sc.assert_pods_agree("ns", &pods).await;        // env = declared ports = resolve --pod
//! let outcome = sc.simulate("ns", &Manifest::parse(&manifest_text), &pods);
//! outcome.assert_clean();                         // every port bound on its node, 0 EADDRINUSE
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::process::Child;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::api::{Api, ListParams};
use portalloc::api::{
    POD_ALLOCATION_LABEL, POD_ROLE_LABEL, PortAllocation, PortPool, WorkloadKind, find_pod,
};

use crate::simulation::netns::NodeNetworks;
use crate::simulation::pods::{self, Manifest};
use crate::simulation::run::{self, Outcome};
use crate::simulation::{kubectl_on, start_webhook_on};
use crate::support::cli::Run;
use crate::support::controllers::Controllers;
pub use crate::support::controllers::{NO_FREE_PORTS, unschedulable};
use crate::support::nodes::{NodeShape, Nodes};
use crate::support::private_cluster::PrivateCluster;

/// How long pods may take to be made, admitted and bound.
pub const SCHEDULE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stand-in keeps trying to reach a peer, and the simulation waits for all.
const SIMULATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Where the webhook keeps its CA Secret.
const WEBHOOK_NAMESPACE: &str = "portalloc-system";

/// See the module's comment. Fields drop in order: the heartbeat stops, then the
/// controllers, then the control plane.
pub struct ScheduledCluster {
    webhook: Option<Child>,
    pub nodes: Nodes,
    pub controllers: Controllers,
    pub client: Client,
    pub cluster: PrivateCluster,
}

impl Drop for ScheduledCluster {
    fn drop(&mut self) {
        if let Some(mut webhook) = self.webhook.take() {
            let _ = webhook.kill();
            let _ = webhook.wait();
        }
    }
}

impl ScheduledCluster {
    /// A control plane of its own (with our CRDs), kube-scheduler and kube-controller-manager,
    /// `count` nodes named `node-0`.. of `shape`, and the pod webhook. `None` when the tests run
    /// against a cluster given by the user (no control plane of our own to start).
    pub async fn start(name: &str, count: usize, shape: &NodeShape) -> Option<ScheduledCluster> {
        let cluster = PrivateCluster::start(name, true)?;
        let client = cluster.client().await;
        let controllers =
            Controllers::start(&cluster.kubeconfig).unwrap_or_else(|e| panic!("{e:#}"));
        let nodes = Nodes::register(&client, &cluster.kubeconfig, "node", count, shape)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        crate::support::create_namespace(&client, WEBHOOK_NAMESPACE).await;
        let webhook = start_webhook_on(&cluster.kubeconfig, &client, WEBHOOK_NAMESPACE).await;
        Some(ScheduledCluster {
            webhook: Some(webhook),
            nodes,
            controllers,
            client,
            cluster,
        })
    }

    pub async fn namespace(&self, name: &str) {
        crate::support::create_namespace(&self.client, name).await;
    }

    /// `kubectl ARGS` on this cluster (the pinned kubectl).
    pub fn kubectl(&self, args: &[&str], input: Option<&str>) -> Run {
        kubectl_on(&self.cluster.kubeconfig, args, input)
    }

    /// `kubectl-portalloc ARGS` on this cluster.
    pub fn plugin(&self, args: &[&str]) -> Run {
        self.cluster.run(args)
    }

    /// `kubectl apply -f -` of `manifest` in `ns`, which must succeed.
    pub fn apply(&self, ns: &str, manifest: &str) {
        let run = self.kubectl(&["apply", "-n", ns, "-f", "-"], Some(manifest));
        assert!(run.ok(), "kubectl apply in {ns}: {run}");
    }

    pub async fn pods(&self, ns: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let mut pods = api.list(&ListParams::default()).await.unwrap().items;
        pods.sort_by_key(|p| p.metadata.name.clone());
        pods
    }

    /// Poll the pods of `ns` until `done` says yes (`None`) or [`SCHEDULE_TIMEOUT`] passes,
    /// then fail with what the pods look like. `done` returns what is still missing.
    pub async fn wait_pods(
        &self,
        ns: &str,
        what: &str,
        done: impl Fn(&[Pod]) -> Option<String>,
    ) -> Vec<Pod> {
        let started = Instant::now();
        loop {
            let pods = self.pods(ns).await;
            let Some(missing) = done(&pods) else {
                return pods;
            };
            if started.elapsed() > SCHEDULE_TIMEOUT {
                panic!(
                    "{what} in {ns}: still {missing} after {}s\n{}\n--- kube-scheduler (last lines)\n{}\n--- \
                     kube-controller-manager (last lines)\n{}",
                    SCHEDULE_TIMEOUT.as_secs(),
                    describe_pods(&pods),
                    self.controllers.log_tail("kube-scheduler", 20),
                    self.controllers.log_tail("kube-controller-manager", 20),
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Until `count` pods exist in `ns` and every one is bound to a node; returns them.
    pub async fn wait_scheduled(&self, ns: &str, count: usize) -> Vec<Pod> {
        self.wait_pods(ns, &format!("{count} pods made and bound"), |pods| {
            let bound = pods.iter().filter(|p| node_of(p).is_some()).count();
            (pods.len() != count || bound != count)
                .then(|| format!("{} pods, {bound} bound", pods.len()))
        })
        .await
    }

    /// Until pod `name` exists and the scheduler has said why it cannot place it; returns the
    /// message (`0/3 nodes are available: 3 node(s) didn't have free ports ...`).
    pub async fn wait_unschedulable(&self, ns: &str, name: &str) -> String {
        let pods = self
            .wait_pods(ns, &format!("pod {name} unschedulable"), |pods| {
                let pod = pods
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some(name));
                match pod {
                    None => Some("no such pod".into()),
                    Some(p) if unschedulable(p).is_none() => Some(format!(
                        "not refused by the scheduler (node {:?})",
                        node_of(p)
                    )),
                    Some(_) => None,
                }
            })
            .await;
        let pod = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .unwrap();
        unschedulable(pod).unwrap()
    }

    /// Each node's address.
    pub fn node_addresses(&self) -> BTreeMap<String, Ipv4Addr> {
        self.nodes.nodes.iter().cloned().collect()
    }

    /// For every pod labelled with a PortAllocation: its env (every container's), its declared
    /// host ports (all containers) and `kubectl portalloc resolve NAME --pod POD` agree. The
    /// ports the pod must declare are its role's ports (found by its name, as resolve finds
    /// it), each at the value resolve gives its env variable, a block port by port, in its
    /// pool's protocol.
    pub async fn assert_pods_agree(&self, ns: &str, pods: &[Pod]) {
        let allocations: Api<PortAllocation> = Api::namespaced(self.client.clone(), ns);
        let pools: Api<PortPool> = Api::all(self.client.clone());
        let mut checked = 0;
        for pod in pods {
            let name = pod.metadata.name.as_deref().unwrap();
            let Some(pa_name) = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POD_ALLOCATION_LABEL))
            else {
                continue;
            };
            let pa = allocations.get(pa_name).await.unwrap();
            let protocol = pools
                .get(&pa.spec.pool)
                .await
                .unwrap()
                .spec
                .protocol
                .to_string();
            let as_named = resolve_name(&pa, pod);
            let run = self.plugin(&[
                "resolve", pa_name, "--pod", &as_named, "-n", ns, "-o", "json",
            ]);
            assert!(run.ok(), "resolve {pa_name} --pod {as_named}: {run}");
            let resolved: BTreeMap<String, String> = serde_json::from_str(&run.stdout)
                .unwrap_or_else(|e| panic!("resolve -o json: {e}\n{run}"));
            let spec = pod.spec.as_ref().unwrap();
            for container in &spec.containers {
                let env: BTreeMap<&str, &str> = container
                    .env
                    .iter()
                    .flatten()
                    .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
                    .collect();
                for (key, value) in &resolved {
                    assert_eq!(
                        env.get(key.as_str()).copied(),
                        Some(value.as_str()),
                        "pod {name} container {}: {key} (resolve --pod says {value})",
                        container.name
                    );
                }
            }
            let found = find_pod(&pa.spec, &as_named);
            let [(role, _)] = found.as_slice() else {
                panic!("pod {name} is no single pod of PortAllocation {pa_name}: {found:?}");
            };
            let mut expected = BTreeSet::new();
            for port in &pa.spec.roles[*role].ports {
                let first: u16 = resolved[&port.env].parse().unwrap();
                for i in 0..port.count.unwrap_or(1) as u16 {
                    expected.insert((first + i, protocol.clone()));
                }
            }
            let declared: BTreeSet<(u16, String)> = declared_ports(pod).into_iter().collect();
            if spec.host_network == Some(true) {
                assert_eq!(
                    declared, expected,
                    "pod {name}: declared host ports vs resolve --pod"
                );
            } else {
                assert!(
                    declared.is_empty(),
                    "pod {name} is on the pod network: {declared:?}"
                );
            }
            checked += 1;
        }
        assert!(checked > 0, "no pod of a PortAllocation in {ns}");
    }

    /// Run every pod of `ns` (all bound) with the node simulation: each node's pods in that
    /// node's own network namespace, the engines replaced by the stand-in, the ConfigMaps of
    /// `ns` mounted where the pods mount them. Prints the summary; the caller asserts.
    pub async fn simulate(&self, ns: &str, manifest: &Manifest, live: &[Pod]) -> Outcome {
        let addresses = self.node_addresses();
        let sim = pods::from_cluster(live, ns, &addresses);
        let dns = pods::dns(manifest, &sim, ns);
        let configmaps: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let configmaps: BTreeMap<String, BTreeMap<String, String>> = configmaps
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|cm| (cm.metadata.name.unwrap(), cm.data.unwrap_or_default()))
            .collect();
        let networks = NodeNetworks::new(addresses.iter().map(|(n, ip)| (n.as_str(), *ip)));
        let outcome = run::run_on_nodes(&sim, &dns, &configmaps, &networks, SIMULATION_TIMEOUT);
        eprintln!(
            "=== {ns}, one network namespace per node\n{}",
            outcome.summary()
        );
        outcome
    }
}

/// The name `resolve --pod` knows a pod by: its own, or for a Deployment's pod (named at
/// random) its role's, the role whose Deployment owns the pod's ReplicaSet
/// (`<deployment>-<pod-template-hash>`) or that its `portalloc.dev/role` label names.
fn resolve_name(pa: &PortAllocation, pod: &Pod) -> String {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    if let Some(role) = labels.get(POD_ROLE_LABEL) {
        return role.clone();
    }
    let hash = labels.get("pod-template-hash");
    let deployment = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "ReplicaSet" && o.controller == Some(true))
        .and_then(|o| Some(o.name.strip_suffix(&format!("-{}", hash?))?.to_string()));
    let Some(deployment) = deployment else {
        return name;
    };
    pa.spec
        .roles
        .iter()
        .find(|r| {
            r.workload
                .as_ref()
                .is_some_and(|w| w.kind == WorkloadKind::Deployment && w.name == deployment)
        })
        .map_or(name, |r| r.name.clone())
}

/// The node a pod is bound to.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// Every host port a pod declares (all containers and sidecars), with its protocol.
pub fn declared_ports(pod: &Pod) -> Vec<(u16, String)> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = u16::try_from(p.host_port?).ok().filter(|p| *p > 0)?;
            Some((port, p.protocol.clone().unwrap_or_else(|| "TCP".into())))
        })
        .collect()
}

/// No two pods on one node declare the same host port (and protocol): what kube-scheduler's
/// NodePorts filter is to guarantee. Returns each node's pods, for further checks.
pub fn assert_node_ports_unique(pods: &[Pod]) -> BTreeMap<String, Vec<String>> {
    let mut holders: BTreeMap<(String, u16, String), Vec<String>> = BTreeMap::new();
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap();
        let node = node_of(pod)
            .unwrap_or_else(|| panic!("pod {name} is not bound"))
            .to_string();
        for (port, protocol) in declared_ports(pod) {
            holders
                .entry((node.clone(), port, protocol))
                .or_default()
                .push(name.clone());
        }
        by_node.entry(node).or_default().push(name);
    }
    let shared: Vec<String> = holders
        .iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|((node, port, protocol), pods)| format!("{node} {port}/{protocol}: {pods:?}"))
        .collect();
    assert!(
        shared.is_empty(),
        "ports declared twice on one node: {shared:#?}"
    );
    by_node
}

/// One line per pod: node, or why it is not bound.
fn describe_pods(pods: &[Pod]) -> String {
    pods.iter()
        .map(|p| {
            let name = p.metadata.name.as_deref().unwrap_or("?");
            match (node_of(p), unschedulable(p)) {
                (Some(node), _) => format!("  {name}: on {node}"),
                (None, Some(why)) => format!("  {name}: unschedulable: {why}"),
                (None, None) => format!("  {name}: not bound yet"),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

//! Node objects a test keeps as a kubelet would, for kube-scheduler to place pods on: each is
//! registered with its capacity (cpu, memory, pods, `nvidia.com/gpu`), its status says Ready,
//! and its Lease in `kube-node-lease` is renewed every 10 s (a kubelet's heartbeat), so the
//! node lifecycle controller removes the not-ready taint the API server gives every new Node
//! and never marks one unreachable. No kubelet runs: pods bound to these nodes stay Pending.
//!
//! The heartbeat runs on a thread of its own (with its own runtime and client), so a test that
//! blocks its runtime for a while (a node simulation) does not starve it.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

/// The extended resource GPU nodes advertise (NVIDIA's device plugin).
pub const GPU: &str = "nvidia.com/gpu";
/// A kubelet renews its Lease every quarter of its 40 s duration.
const LEASE_SECONDS: i32 = 40;
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How long the node lifecycle controller may take to clear the not-ready taints.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// What each node offers (its capacity, all allocatable).
#[derive(Clone, Debug)]
pub struct NodeShape {
    /// Kubernetes quantities, e.g. `"64"` and `"512Gi"`.
    pub cpu: String,
    pub memory: String,
    pub pods: u32,
    /// `nvidia.com/gpu`; 0 leaves the resource out.
    pub gpus: u32,
    /// More labels for every node (the standard hostname, os and arch labels are always set).
    pub labels: BTreeMap<String, String>,
}

impl NodeShape {
    /// An 8-GPU server: 8 GPUs, 128 cores, 1 TiB, 110 pods.
    pub fn gpu_server() -> NodeShape {
        NodeShape {
            cpu: "128".into(),
            memory: "1Ti".into(),
            pods: 110,
            gpus: 8,
            labels: BTreeMap::new(),
        }
    }

    pub fn with_gpus(mut self, gpus: u32) -> NodeShape {
        self.gpus = gpus;
        self
    }
}

/// A set of nodes with their heartbeat; dropping it stops the heartbeat (the Node objects stay:
/// they go with their control plane).
pub struct Nodes {
    /// Node name and its InternalIP, in creation order.
    pub nodes: Vec<(String, Ipv4Addr)>,
    stop: Option<mpsc::Sender<()>>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
}

impl Nodes {
    /// Register `count` nodes named `<prefix>-0`..: create each Node, write its status as a
    /// kubelet's first status update does, create its Lease, start the heartbeat; then wait
    /// until the node lifecycle controller has cleared their not-ready taints (it must run:
    /// `Controllers::start` in `controllers.rs` starts it).
    pub async fn register(
        client: &Client,
        kubeconfig: &Path,
        prefix: &str,
        count: usize,
        shape: &NodeShape,
    ) -> anyhow::Result<Nodes> {
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let name = format!("{prefix}-{i}");
            let ip = next_ip();
            register(client, &name, ip, shape).await?;
            nodes.push((name, ip));
        }
        let names: Vec<String> = nodes.iter().map(|(n, _)| n.clone()).collect();
        let (stop, stopped) = mpsc::channel();
        let heartbeat = heartbeat(kubeconfig.to_path_buf(), names, stopped)?;
        let nodes = Nodes {
            nodes,
            stop: Some(stop),
            heartbeat: Some(heartbeat),
        };
        nodes.wait_schedulable(client).await?;
        Ok(nodes)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|(n, _)| n.as_str())
    }

    /// The InternalIP of a node of this set.
    pub fn ip(&self, node: &str) -> Option<Ipv4Addr> {
        self.nodes
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, ip)| *ip)
    }

    /// Until no node of the set has a taint (the not-ready one, until the node lifecycle
    /// controller has seen it Ready).
    pub async fn wait_schedulable(&self, client: &Client) -> anyhow::Result<()> {
        let api: Api<Node> = Api::all(client.clone());
        let started = Instant::now();
        loop {
            let mut tainted = Vec::new();
            for name in self.names() {
                let node = api
                    .get(name)
                    .await
                    .with_context(|| format!("get Node {name}"))?;
                let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
                if !taints.is_empty() {
                    let keys: Vec<String> = taints.into_iter().map(|t| t.key).collect();
                    tainted.push(format!("{name} ({})", keys.join(", ")));
                }
            }
            if tainted.is_empty() {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!(
                    "Nodes still tainted after {}s: {}. The node lifecycle controller removes \
                     the not-ready taint of a Ready node: is kube-controller-manager running \
                     with node-lifecycle-controller (Controllers::start)?",
                    READY_TIMEOUT.as_secs(),
                    tainted.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.heartbeat.take() {
            let _ = thread.join();
        }
    }
}

/// InternalIPs 10.200.x.y, unique in this process, so that a network simulation can give each
/// node its own address on one bridge.
fn next_ip() -> Ipv4Addr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Ipv4Addr::new(10, 200, (n / 250) as u8, (n % 250 + 1) as u8)
}

/// Create the Node (the API server adds the not-ready taint), then its status, then its Lease.
async fn register(
    client: &Client,
    name: &str,
    ip: Ipv4Addr,
    shape: &NodeShape,
) -> anyhow::Result<()> {
    let mut labels = shape.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), name.into());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), "amd64".into());
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
    }))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("create Node {name}"))?;
    let mut capacity = json!({
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": shape.pods.to_string(),
        "ephemeral-storage": "1Ti",
    });
    if shape.gpus > 0 {
        capacity[GPU] = shape.gpus.to_string().into();
    }
    let now = Timestamp::now().to_string();
    let condition = |kind: &str, status: &str, reason: &str| {
        json!({
            "type": kind, "status": status, "reason": reason,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        })
    };
    let status = json!({"status": {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            condition("Ready", "True", "KubeletReady"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": ip.to_string()},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
            "osImage": "portalloc test node", "containerRuntimeVersion": "none://0",
            "kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("write the status of Node {name}"))?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": lease_time(),
        },
    }))?;
    leases
        .create(&PostParams::default(), &lease)
        .await
        .with_context(|| format!("create the Lease of Node {name}"))?;
    Ok(())
}

/// A Lease's renewTime (a MicroTime, serialized as the API server wants it).
fn lease_time() -> serde_json::Value {
    serde_json::to_value(MicroTime(Timestamp::now())).expect("a MicroTime serializes")
}

/// A client for the current context of `kubeconfig`.
async fn client_from(kubeconfig: &Path) -> anyhow::Result<Client> {
    let file = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("cannot read kubeconfig {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Renew every node's Lease each [`RENEW_EVERY`] until `stop` is dropped or sent to. The
/// thread makes its own runtime and client (this may be called from within a runtime, which
/// cannot block on another).
fn heartbeat(
    kubeconfig: PathBuf,
    names: Vec<String>,
    stop: mpsc::Receiver<()>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let (started, ready) = mpsc::channel::<anyhow::Result<()>>();
    let thread = std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                let _ = started.send(Err(
                    anyhow::Error::new(e).context("a runtime for the node heartbeat")
                ));
                return;
            }
        };
        let client = match runtime.block_on(client_from(&kubeconfig)) {
            Ok(client) => client,
            Err(e) => {
                let _ = started.send(Err(e.context("a client for the node heartbeat")));
                return;
            }
        };
        let _ = started.send(Ok(()));
        let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
        while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(RENEW_EVERY) {
            for name in &names {
                let patch = json!({"spec": {"renewTime": lease_time()}});
                let renewed = runtime.block_on(leases.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                ));
                if let Err(e) = renewed {
                    eprintln!("node heartbeat: renewing the Lease of {name}: {e}");
                }
            }
        }
    });
    ready
        .recv()
        .context("the node heartbeat thread ended before it started")??;
    Ok(thread)
}

//! Test support: one real control plane per test run, a namespace per test.
//!
//! The control plane comes from `scripts/local-cluster.sh up` (kube-apiserver and etcd built
//! from their Go modules) and stops by itself when this test process exits. To run against a
//! cluster you already have, set `PORTALLOC_TEST_REUSE_CLUSTER=1` and point `KUBECONFIG` at it.

#![allow(dead_code)]

pub mod apply;
pub mod cli;
// The helpers shared with the other test binaries and the benchmarks, under their own names here.
#[path = "../../common/mod.rs"]
mod common;
pub mod endpoints;
pub mod error_text;
pub mod fault_proxy;
pub mod invariants;
pub mod kube_proxy;
pub mod private_cluster;
pub mod tools;

pub use common::{
    agent_node, control_plane, controllers, events, nodes, poll, ports, probe_http,
    service_account, watcher_process, webhook,
};

use std::path::PathBuf;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};

use control_plane::ControlPlane;
pub use control_plane::repo_root;

/// The admin context (client certificate in system:masters).
pub const ADMIN_CONTEXT: &str = "portalloc-local";
/// A user with no rights unless a test grants them.
pub const USER_CONTEXT: &str = "portalloc-local-user";
pub const USER_NAME: &str = "portalloc-user";

pub struct TestCluster {
    pub kubeconfig: PathBuf,
    /// Whether this is the local control plane (with its two contexts) or a reused cluster.
    pub local: bool,
    /// Never dropped (a static): the script's owner watcher stops it when the test process exits.
    _plane: Option<ControlPlane>,
}

static CLUSTER: OnceLock<TestCluster> = OnceLock::new();

/// The cluster for this test run, started (and given our CRDs) on first use.
pub fn cluster() -> &'static TestCluster {
    CLUSTER.get_or_init(|| {
        let cluster = start_or_reuse().unwrap_or_else(|e| panic!("no test cluster: {e}"));
        control_plane::install_crds(&cluster.kubeconfig).unwrap_or_else(|e| panic!("{e:#}"));
        cluster
    })
}

fn start_or_reuse() -> Result<TestCluster, String> {
    if std::env::var("PORTALLOC_TEST_REUSE_CLUSTER").as_deref() == Ok("1") {
        let path = std::env::var("KUBECONFIG")
            .map_err(|_| "PORTALLOC_TEST_REUSE_CLUSTER=1 needs KUBECONFIG".to_string())?;
        let first = std::env::split_paths(&path)
            .next()
            .ok_or("KUBECONFIG is empty")?;
        return Ok(TestCluster {
            kubeconfig: first,
            local: false,
            _plane: None,
        });
    }
    let plane = ControlPlane::up("e2e-cluster").map_err(|e| format!("{e:#}"))?;
    Ok(TestCluster {
        kubeconfig: plane.kubeconfig.clone(),
        local: true,
        _plane: Some(plane),
    })
}

/// A client for the given kubeconfig context (`None`: the current one).
pub async fn client_for(context: Option<&str>) -> Client {
    control_plane::client_from(&cluster().kubeconfig, context)
        .await
        .expect("test client")
}

/// An admin client. Clients are per test: each test has its own runtime.
pub async fn client() -> Client {
    client_for(None).await
}

/// A fresh namespace for one test, so tests run in parallel without seeing each other.
/// There is no namespace controller in this control plane, so namespaces are never deleted;
/// the whole control plane goes away with the test run instead.
pub async fn namespace(client: &Client, test: &str) -> String {
    let name = unique_name(test);
    create_namespace(client, &name).await;
    name
}

/// A namespace of exactly this name (on a private cluster, where names cannot clash).
pub async fn create_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"portalloc.dev/test": "true"}}
    }))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create test namespace");
}

/// `<prefix>-<random>`, a DNS label usable for namespaces and cluster-scoped pools alike.
pub fn unique_name(prefix: &str) -> String {
    let suffix: u32 = rand::random::<u32>() % 1_000_000;
    let prefix: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    format!("{}-{suffix:06}", prefix.trim_matches('-'))
}

/// A PortPool manifest.
pub fn pool_yaml(name: &str, ranges: &str, protocol: &str) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata:\n  name: {name}\nspec:\n  ranges: [{ranges}]\n  protocol: {protocol}\n"
    )
}

/// Create a pool through the plugin (overlap allowed: tests share one cluster).
pub fn create_pool(name: &str, ranges: &str) {
    let run = cli::run(&["pool", "create", name, "--range", ranges, "--allow-overlap"]);
    assert!(run.ok(), "pool create {name}: {run}");
}

/// A PortAllocation with one role of `replicas` pods, each with the given PodScoped ports.
pub fn simple_allocation(
    name: &str,
    pool: &str,
    role: &str,
    replicas: u32,
    ports: &[&str],
) -> String {
    let ports: Vec<String> = ports
        .iter()
        .map(|p| {
            format!(
                "{{name: {p}, scope: PodScoped, env: {}_PORT}}",
                p.to_uppercase().replace('-', "_")
            )
        })
        .collect();
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: {name}\nspec:\n  pool: {pool}\n  roles:\n  - name: {role}\n    replicas: {replicas}\n    ports: [{}]\n",
        ports.join(", ")
    )
}

/// A PortAllocation object of one role `worker` of `replicas` pods, each with a port `rpc`.
pub fn allocation(name: &str, pool: &str, replicas: u32) -> portalloc::api::PortAllocation {
    serde_yaml::from_str(&simple_allocation(name, pool, "worker", replicas, &["rpc"])).unwrap()
}

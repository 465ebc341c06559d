//! The webhook beside a watcher of the pods' namespace takes their PortAllocation from the
//! watcher's cache: a burst of labelled pods costs the API server no read of it, and each pod
//! still carries exactly the ports `resolve --pod` prints. A pod the cached object cannot admit
//! (past the replicas it knew) is decided from a fresh read, which syncs the scale-up.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use portalloc::api::PortAllocation;

use crate::support::poll::until;
use crate::support::private_cluster::PrivateCluster;
use crate::support::webhook::{Log, WebhookCommand};
use crate::support::{self};

const ALLOCATION: &str = r#"apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: web, namespace: apps}
spec:
  pool: gpu
  roles:
  - name: web
    replicas: 8
    workload: {kind: StatefulSet, name: web, service: web}
    ports: [{name: http, env: HTTP_PORT}, {name: metrics, env: METRICS_PORT}]
"#;

fn pod(index: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("web-{index}"),
            "namespace": "apps",
            "labels": {"portalloc.dev/allocation": "web"},
        },
        "spec": {"hostNetwork": true, "containers": [{"name": "engine", "image": "busybox"}]},
    }))
    .unwrap()
}

/// `GET portallocations` (one object, not a list) the API server has answered so far.
async fn allocation_reads(client: &Client) -> f64 {
    let (requests, _) = crate::leader_election::scrape(client).await;
    let key = ("GET".to_string(), "portallocations".to_string());
    requests.get(&key).copied().unwrap_or(0.0)
}

fn env(pod: &Pod, name: &str) -> Option<String> {
    pod.spec.as_ref()?.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)?
        .value
        .clone()
}

#[tokio::test]
async fn admissions_read_the_watchers_cache_and_a_miss_reads_afresh() {
    let Some(cluster) = PrivateCluster::start("webhook-cache", true) else {
        return;
    };
    let client = cluster.client().await;
    assert!(
        cluster
            .run(&["pool", "create", "gpu", "--range", "31000-31999"])
            .ok()
    );
    for ns in ["apps", "portalloc-system"] {
        support::create_namespace(&client, ns).await;
    }
    let mut webhook = WebhookCommand::new(&cluster.kubeconfig)
        .watch_namespace("apps")
        .args(&["-v", "1"])
        .env("NO_COLOR", "1")
        .log(Log::Piped)
        .spawn()
        .expect("spawn the watcher with its webhook");
    webhook.wait_registered(&client).await.unwrap();

    let allocations: Api<PortAllocation> = Api::namespaced(client.clone(), "apps");
    let pa: PortAllocation = serde_yaml::from_str(ALLOCATION).unwrap();
    allocations
        .create(&PostParams::default(), &pa)
        .await
        .unwrap();
    until("the watcher syncs web", Duration::from_secs(60), || {
        crate::leader_election::is_ready(&allocations, "web")
    })
    .await;
    // The watcher's cache sees the Ready status a watch event later.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let before = allocation_reads(&client).await;
    let mut admitted = Vec::new();
    for index in 0..8 {
        admitted.push(
            pods.create(&PostParams::default(), &pod(index))
                .await
                .unwrap(),
        );
    }
    let reads = allocation_reads(&client).await - before;
    assert_eq!(
        reads, 0.0,
        "8 admissions beside a watcher of their namespace read the PortAllocation {reads} times"
    );
    // The counter counts: one read of ours moves it.
    let counted = allocation_reads(&client).await;
    allocations.get("web").await.unwrap();
    assert!(
        allocation_reads(&client).await > counted,
        "a GET of the PortAllocation left apiserver_request_total unmoved"
    );
    // What the cache gave them is what the PortAllocation says (`resolve` reads it afresh).
    let mut seen = std::collections::BTreeSet::new();
    for created in &admitted {
        let name = created.name_any();
        let http = env(created, "HTTP_PORT").expect("HTTP_PORT injected");
        let out = cluster.run(&["resolve", "web", "-n", "apps", "--pod", &name, "-o", "json"]);
        assert!(out.ok(), "{out}");
        let resolved: std::collections::BTreeMap<String, String> =
            serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(
            resolved.get("HTTP_PORT"),
            Some(&http),
            "pod {name}: injected and resolved differ"
        );
        assert!(seen.insert(http), "two pods share a port");
    }

    // Scaled up: until the watcher's cache has the new spec, pod web-8 is past the replicas the
    // cached object knows; either way it is admitted, with ports of its own.
    let mut current = allocations.get("web").await.unwrap();
    current.spec.roles[0].replicas = 9;
    current.metadata.managed_fields = None;
    allocations
        .replace("web", &PostParams::default(), &current)
        .await
        .unwrap();
    let ninth = pods.create(&PostParams::default(), &pod(8)).await.unwrap();
    let http = env(&ninth, "HTTP_PORT").expect("HTTP_PORT injected in web-8");
    assert!(
        !seen.contains(&http),
        "web-8 was given a port of another pod"
    );
    drop(webhook);
}

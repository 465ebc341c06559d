//! The pod webhook as a process the real kube-apiserver calls over TLS (`--webhook-url`), on a
//! control plane of its own (its configuration is cluster-wide and fails closed for labelled
//! pods). Labelled pods created with kubectl carry exactly what `resolve --pod` prints; a pod
//! past its role's replicas is denied with what to change; a never-synced PortAllocation is
//! synced by its first pod's admission; unlabelled pods pass with the webhook stopped; two
//! webhook processes share one CA; one killed -9 in a burst of 50 pods leaves no admitted pod
//! with ports other than its PortAllocation's.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use portalloc::api::PortAllocation;

use crate::support::private_cluster::PrivateCluster;
use crate::support::service_account::watcher_kubeconfig;
use crate::support::webhook::{Log, Webhook, WebhookCommand};
use crate::support::{self, tools};

const ALLOCATION: &str = r#"apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: pd, namespace: apps}
spec:
  pool: gpu
  roles:
  - name: router
    replicas: 1
    workload: {kind: Deployment, name: router, service: router}
    ports: [{name: http, scope: RoleScoped, env: ROUTER_PORT}]
    references:
    - {env: PREFILL_URLS, from: "prefill[*]", format: "http://{address}:{http}", join: " "}
  - name: prefill
    replicas: 2
    workload: {kind: StatefulSet, name: prefill, service: prefill}
    ports:
    - {name: http, env: PREFILL_PORT}
    - {name: nixl, env: NIXL_PORT, count: 4, rangeEnv: NIXL_RANGE}
  - name: worker
    replicas: 60
    workload: {kind: StatefulSet, name: worker, service: worker}
    ports: [{name: rpc, env: RPC_PORT}]
---
apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: sglang, namespace: apps}
spec:
  pool: gpu
  groups: 2
  roles:
  - name: leader
    replicas: 1
    workload: {kind: LeaderWorkerSet, name: sglang, member: Leader, service: sglang}
    ports: [{name: dist, scope: RoleScoped, env: DIST_PORT}]
  - name: worker
    replicas: 2
    workload: {kind: LeaderWorkerSet, name: sglang, member: Workers, service: sglang}
    references:
    - {env: DIST_INIT_ADDR, from: leader, format: "{address}:{dist}"}
"#;

/// A webhook process (`sync --watch` of an empty namespace, so only admission syncs `apps`),
/// with its probes.
fn start(kubeconfig: &Path) -> Webhook {
    WebhookCommand::new(kubeconfig)
        .probes()
        .args(&["-v", "1"])
        .env("NO_COLOR", "1")
        .log(Log::Piped)
        .spawn()
        .expect("spawn the webhook")
}

/// Its `/metrics` text.
fn metrics(webhook: &Webhook) -> String {
    let answer = webhook.get("/metrics").expect("its /metrics");
    answer.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// Until its /readyz answers 200.
fn wait_ready(webhook: &Webhook) {
    let started = Instant::now();
    while !webhook
        .get("/readyz")
        .is_some_and(|answer| answer.starts_with("HTTP/1.1 200"))
    {
        // Generous: CI runs this beside every other test on 2 cores.
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the webhook never got ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The port of the URL the configuration points at.
async fn registered_port(client: &Client) -> Option<u16> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let url = api
        .get_opt("portalloc")
        .await
        .unwrap()?
        .webhooks?
        .into_iter()
        .next()?
        .client_config
        .url?;
    url.strip_prefix("https://127.0.0.1:")?
        .strip_suffix("/mutate")?
        .parse()
        .ok()
}

/// A pod manifest for `name` (or generateName `generate`), labelled for `allocation`.
fn pod_yaml(name: &str, generate: &str, allocation: Option<&str>) -> String {
    let id = if generate.is_empty() {
        format!("name: {name}")
    } else {
        format!("generateName: {generate}")
    };
    let labels = allocation
        .map(|a| format!("  labels: {{portalloc.dev/allocation: {a}}}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  {id}\n  namespace: apps\n{labels}spec:\n  \
         initContainers:\n  - {{name: wait, image: busybox}}\n  containers:\n  - name: engine\n    \
         image: busybox\n    command: [python3, -m, sglang.launch_server, --port, $(PREFILL_PORT)]\n    \
         env: [{{name: PREFILL_PORT, value: \"1\"}}]\n  - {{name: sidecar, image: busybox}}\n"
    )
}

/// `kubectl create -f -` of `yaml`: (succeeded, the created pod's name or the error).
fn kubectl_create(kubeconfig: &Path, yaml: &str) -> (bool, String) {
    let mut command = Command::new(tools::kubectl());
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["create", "-f", "-", "-o", "name"]);
    let out = tools::run_with_input(command, yaml);
    let text = if out.status.success() {
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .trim_start_matches("pod/")
            .to_string()
    } else {
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    (out.status.success(), text)
}

/// `resolve NAME --pod POD -o json` as (name, value) pairs.
fn resolved(
    cluster: &PrivateCluster,
    allocation: &str,
    pod: &str,
    role: Option<&str>,
) -> BTreeMap<String, String> {
    let mut args = vec![
        "resolve", allocation, "--pod", pod, "-n", "apps", "-o", "json",
    ];
    if let Some(role) = role {
        args.extend(["--role", role]);
    }
    let run = cluster.run(&args);
    assert!(run.ok(), "{run}");
    serde_json::from_str(&run.stdout).unwrap()
}

fn env_of(pod: &Pod, container: usize, init: bool) -> BTreeMap<String, String> {
    let spec = pod.spec.as_ref().unwrap();
    let containers = if init {
        spec.init_containers.as_ref().unwrap()
    } else {
        &spec.containers
    };
    containers[container]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

/// Every container of `pod` carries what `resolve` gives it, except a name the container set
/// itself (the engine's own PREFILL_PORT), and the annotation is there.
fn assert_injected(pod: &Pod, expected: &BTreeMap<String, String>) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    for (index, init) in [(0, true), (0, false), (1, false)] {
        let mut want = expected.clone();
        if !init && index == 0 {
            want.insert("PREFILL_PORT".into(), "1".into());
        }
        assert_eq!(
            env_of(pod, index, init),
            want,
            "{name} container {index} (init: {init})"
        );
    }
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert!(
        annotations.contains_key("portalloc.dev/ports"),
        "{name}: {annotations:?}"
    );
}

#[tokio::test]
async fn labelled_pods_get_their_ports_and_the_rest_is_refused_or_left_alone() {
    let Some(cluster) = PrivateCluster::start("webhook", true) else {
        return;
    };
    let client = cluster.client().await;
    assert!(
        cluster
            .run(&["pool", "create", "gpu", "--range", "30000-30999"])
            .ok()
    );
    for ns in ["apps", "quiet", "portalloc-system"] {
        support::create_namespace(&client, ns).await;
    }
    // The webhook runs as the ServiceAccount deploy/ ships, with the rights watcher.yaml and
    // webhook.yaml give it, and nothing more.
    for file in ["deploy/watcher.yaml", "deploy/webhook.yaml"] {
        let yaml = std::fs::read_to_string(support::repo_root().join(file)).unwrap();
        support::apply::apply_yaml(&client, &yaml, None).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let account = dir.path().join("watcher");
    watcher_kubeconfig(&client, &cluster.kubeconfig, &account).await;

    // Applied as GitOps would: nothing syncs them but the first pod's admission.
    let allocations: Api<PortAllocation> = Api::namespaced(client.clone(), "apps");
    for doc in ALLOCATION.split("\n---\n") {
        let pa: PortAllocation = serde_yaml::from_str(doc).unwrap();
        allocations
            .create(&PostParams::default(), &pa)
            .await
            .unwrap();
    }
    assert!(
        allocations
            .get("pd")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .is_none_or(|p| p.to_string() == "Pending")
    );

    // Two webhooks start at once: one CA between them (one Secret), whichever registers last
    // is called, and the other's certificate chains to the same CA.
    let first = start(&account);
    let second = start(&account);
    // Ready means registered (the webhook starts, and registers, before the watch).
    wait_ready(&first);
    wait_ready(&second);
    let (mut registered, other) = if registered_port(&client).await == Some(first.port()) {
        (first, second)
    } else {
        (second, first)
    };
    registered.wait_registered(&client).await.unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "portalloc-system");
    assert!(secrets.get("portalloc-webhook-ca").await.is_ok());

    let kubeconfig = cluster.kubeconfig.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let mut latencies = Vec::new();
    for (yaml, allocation, role) in [
        (pod_yaml("prefill-0", "", Some("pd")), "pd", None),
        (pod_yaml("prefill-1", "", Some("pd")), "pd", None),
        (
            pod_yaml("", "router-6f9c7d5b8-", Some("pd")),
            "pd",
            Some("router"),
        ),
        (pod_yaml("sglang-1", "", Some("sglang")), "sglang", None),
        (pod_yaml("sglang-1-2", "", Some("sglang")), "sglang", None),
    ] {
        let started = Instant::now();
        let (ok, name) = kubectl_create(&kubeconfig, &yaml);
        latencies.push(started.elapsed());
        assert!(ok, "{name}");
        let pod = pods.get(&name).await.unwrap();
        // A Deployment's pods share the role's env; `resolve` knows them by the role's name.
        let lookup = if role.is_some() {
            "router"
        } else {
            name.as_str()
        };
        assert_injected(&pod, &resolved(&cluster, allocation, lookup, role));
    }
    let pd = allocations.get("pd").await.unwrap();
    assert_eq!(
        pd.status
            .and_then(|s| s.phase)
            .map(|p| p.to_string())
            .as_deref(),
        Some("Allocated"),
        "synced at admission"
    );

    // Past the replicas: denied, with what to change; nothing created.
    let (ok, message) = kubectl_create(&kubeconfig, &pod_yaml("prefill-2", "", Some("pd")));
    assert!(!ok);
    assert!(
        message.contains("denied the request")
            && message.contains("pod prefill-2 is pod 2 of role prefill")
            && message.contains("raise the role's replicas"),
        "{message}"
    );
    // Named for no role at all.
    let (ok, message) = kubectl_create(&kubeconfig, &pod_yaml("stranger-0", "", Some("pd")));
    assert!(
        !ok && message.contains("no pod \"stranger-0\""),
        "{message}"
    );
    let (ok, message) = kubectl_create(&kubeconfig, &pod_yaml("x-0", "", Some("missing")));
    assert!(
        !ok && message.contains("PortAllocation apps/missing, which does not exist"),
        "{message}"
    );

    // A burst of 50 worker pods; the registered webhook is killed -9 part-way. Every admitted
    // pod carries its own ports; the rest fail closed.
    let burst = {
        let pods = pods.clone();
        tokio::spawn(async move {
            let mut admitted = Vec::new();
            let mut refused = 0;
            for i in 0..50 {
                let pod: Pod =
                    serde_yaml::from_str(&pod_yaml(&format!("worker-{i}"), "", Some("pd")))
                        .unwrap();
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(pod) => admitted.push(pod),
                    Err(_) => refused += 1,
                }
            }
            (admitted, refused)
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    registered.kill();
    let (admitted, refused) = burst.await.unwrap();
    eprintln!(
        "webhook burst: {} admitted, {refused} refused after kill -9",
        admitted.len()
    );
    for pod in &admitted {
        let name = pod.metadata.name.clone().unwrap();
        assert_injected(pod, &resolved(&cluster, "pd", &name, None));
    }
    // The survivor takes over by registering itself again (as a restarted replica would).
    drop(other);
    let mut third = start(&account);
    third.wait_registered(&client).await.unwrap();
    for i in 0..50 {
        let name = format!("worker-{i}");
        if pods.get_opt(&name).await.unwrap().is_none() {
            let (ok, created) = kubectl_create(&kubeconfig, &pod_yaml(&name, "", Some("pd")));
            assert!(ok, "{created}");
        }
        let pod = pods.get(&name).await.unwrap();
        assert_injected(&pod, &resolved(&cluster, "pd", &name, None));
    }

    // Admission latency over 200 labelled pods (10 are workers 50-59; the rest are deleted
    // and created again), with the webhook's own sync of nothing.
    let mut times = Vec::new();
    for i in 0..200 {
        let name = format!("worker-{}", 50 + i % 10);
        let _ = pods.delete(&name, &Default::default()).await;
        while pods.get_opt(&name).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let pod: Pod = serde_yaml::from_str(&pod_yaml(&name, "", Some("pd"))).unwrap();
        let started = Instant::now();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        times.push(started.elapsed());
    }
    // The same 200 creates of unlabelled pods (never sent to the webhook), for comparison.
    let mut plain = Vec::new();
    for i in 0..200 {
        let pod: Pod = serde_yaml::from_str(&pod_yaml(&format!("plain-{i}"), "", None)).unwrap();
        let started = Instant::now();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        plain.push(started.elapsed());
    }
    let quantiles = |mut times: Vec<Duration>| {
        times.sort();
        let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
        (p(0.5), p(0.99))
    };
    let (with, without) = (quantiles(times), quantiles(plain));
    eprintln!(
        "webhook: 200 pod creates, p50/p99: labelled (admitted by the webhook) {:?}/{:?}, \
         unlabelled {:?}/{:?}",
        with.0, with.1, without.0, without.1
    );

    // Its answers are counted in /metrics, which promtool accepts.
    let text = metrics(&third);
    let allowed = text
        .lines()
        .find_map(|l| l.strip_prefix("portalloc_admissions_total{result=\"allowed\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(allowed.is_some_and(|n| n >= 200), "{text}");
    let mut promtool = Command::new(tools::test_tool("promtool"));
    promtool.args(["check", "metrics"]);
    let lint = tools::run_with_input(promtool, &text);
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stderr)
    );

    // With the webhook stopped: unlabelled pods pass, labelled pods are refused (fail closed).
    drop(third);
    let (ok, name) = kubectl_create(&kubeconfig, &pod_yaml("plain", "", None));
    assert!(ok, "{name}");
    let (ok, message) = kubectl_create(&kubeconfig, &pod_yaml("prefill-0x", "", Some("pd")));
    assert!(
        !ok && message.contains("failed calling webhook"),
        "{message}"
    );
}

//! Status that health checks read right, against the real API server: the default status the
//! server gives an object nobody has synced, the kstatus conditions in every state, judged by
//! the library Flux uses (kstatus) and by Argo CD's Lua runtime with our health check, and
//! `kubectl wait --for=condition=Ready`.

use std::io::Write;
use std::process::{Command, Stdio};

use kube::Client;
use kube::api::{Api, PostParams};
use portalloc::api::{PortAllocation, PortPool};
use serde::Serialize;

use crate::support::{self, cli, tools};

/// `status: message` of one object as the tool judges it (the object on stdin, as JSON).
fn judge(tool: &str, args: &[&str], object: &impl Serialize) -> String {
    let mut child = Command::new(tools::test_tool(tool))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let json = serde_json::to_vec(object).unwrap();
    child.stdin.take().unwrap().write_all(&json).unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{tool}: {stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    format!(
        "{}: {}",
        line["status"].as_str().unwrap_or_default(),
        line["message"].as_str().unwrap_or_default()
    )
}

/// (kstatus, Argo CD) verdicts of an object as read from the API server.
fn health(kind: &str, object: &impl Serialize) -> (String, String) {
    let script = support::repo_root().join(format!(
        "integrations/argocd/resource_customizations/portalloc.dev/{kind}/health.lua"
    ));
    (
        judge("kstatus", &[], object),
        judge("argocd-lua", &["-script", script.to_str().unwrap()], object),
    )
}

fn status_of(verdict: &str) -> &str {
    verdict.split(':').next().unwrap_or_default()
}

async fn get(client: &Client, ns: &str, name: &str) -> PortAllocation {
    Api::<PortAllocation>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
}

/// `type=status/reason` of every condition.
fn conditions(pa: &PortAllocation) -> Vec<String> {
    pa.status
        .iter()
        .flat_map(|s| &s.conditions)
        .map(|c| format!("{}={}/{}", c.type_, c.status, c.reason))
        .collect()
}

fn wait_ready(ns: &str, name: &str, timeout: &str) -> std::process::Output {
    Command::new(tools::kubectl())
        .arg("--kubeconfig")
        .arg(&support::cluster().kubeconfig)
        .args(["wait", "--for=condition=Ready", "-n", ns])
        .arg(format!("portallocation.portalloc.dev/{name}"))
        .arg(format!("--timeout={timeout}"))
        .output()
        .expect("run kubectl wait")
}

#[tokio::test]
async fn every_state_carries_the_conditions_health_checks_read() {
    let client = support::client().await;
    let ns = support::namespace(&client, "health").await;
    let pool = support::unique_name("health");
    support::create_pool(&pool, "31820-31823");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);

    // Applied by GitOps, never synced: the API server defaults the status it does not store.
    let manifest = support::simple_allocation("app", &pool, "worker", 2, &["rpc"]);
    let pa: PortAllocation = serde_yaml::from_str(&manifest).unwrap();
    api.create(&PostParams::default(), &pa).await.unwrap();
    let unsynced = get(&client, &ns, "app").await;
    let status = unsynced.status.clone().expect("a defaulted status");
    assert_eq!(status.observed_generation, Some(0), "{status:?}");
    assert_eq!(
        status.phase.map(|p| p.to_string()).as_deref(),
        Some("Pending")
    );
    assert_eq!(unsynced.metadata.generation, Some(1));
    let waited = wait_ready(&ns, "app", "1s");
    assert!(!waited.status.success(), "Ready before any sync");
    let (kstatus, argocd) = health("PortAllocation", &unsynced);
    assert_eq!(
        (status_of(&kstatus), status_of(&argocd)),
        ("InProgress", "Progressing"),
        "{kstatus} / {argocd}"
    );

    // Synced: Ready, and kubectl wait returns at once.
    assert!(cli::run(&["sync", "app", "-n", &ns]).ok());
    let synced = get(&client, &ns, "app").await;
    assert_eq!(
        conditions(&synced),
        ["Allocated=True/Allocated", "Ready=True/Allocated"]
    );
    assert_eq!(
        synced.status.as_ref().unwrap().observed_generation,
        synced.metadata.generation
    );
    let waited = wait_ready(&ns, "app", "10s");
    assert!(
        waited.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let (kstatus, argocd) = health("PortAllocation", &synced);
    assert_eq!(status_of(&kstatus), "Current", "{kstatus}");
    assert_eq!(argocd, "Healthy: 2 ports allocated");

    // Spec changed, not yet synced: the status describes an older generation.
    let mut changed = synced.clone();
    changed.spec.roles[0].replicas = 3;
    let changed = api
        .replace("app", &PostParams::default(), &changed)
        .await
        .unwrap();
    let observed = changed
        .status
        .as_ref()
        .unwrap()
        .observed_generation
        .unwrap();
    assert!(observed < changed.metadata.generation.unwrap());
    let (kstatus, argocd) = health("PortAllocation", &changed);
    assert_eq!(
        (status_of(&kstatus), status_of(&argocd)),
        ("InProgress", "Progressing"),
        "{kstatus} / {argocd}"
    );

    // The pool (4 ports) cannot give 3 + 2: the second object stalls, with the reason.
    assert!(cli::run(&["sync", "app", "-n", &ns]).ok());
    let other = support::simple_allocation("other", &pool, "worker", 2, &["rpc"]);
    let pa: PortAllocation = serde_yaml::from_str(&other).unwrap();
    api.create(&PostParams::default(), &pa).await.unwrap();
    let run = cli::run(&["sync", "other", "-n", &ns]);
    assert_eq!(run.code, 4, "{run}");
    let stalled = get(&client, &ns, "other").await;
    assert_eq!(
        conditions(&stalled),
        [
            "Allocated=False/PoolFull",
            "Ready=False/PoolFull",
            "Stalled=True/PoolFull"
        ]
    );
    let message = &stalled.status.as_ref().unwrap().conditions[2].message;
    assert!(message.contains("pool is full"), "{message}");
    let (kstatus, argocd) = health("PortAllocation", &stalled);
    assert_eq!(kstatus, format!("Failed: {message}"));
    assert_eq!(argocd, format!("Degraded: {message}"));

    // A PortPool is current once created, and says its size.
    let pool_object = Api::<PortPool>::all(client.clone())
        .get(&pool)
        .await
        .unwrap();
    let (kstatus, argocd) = health("PortPool", &pool_object);
    assert_eq!(status_of(&kstatus), "Current", "{kstatus}");
    assert_eq!(argocd, "Healthy: PortPool of 4 ports");
}

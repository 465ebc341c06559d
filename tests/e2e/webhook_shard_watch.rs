//! The webhook watches the shards and so keeps the copies it remembers current: a pod checked
//! after the few seconds a remembered copy is trusted on its own costs no read of the shard,
//! and a write by another client (the CLI) reaches the copy without one: the new
//! allocation's pod is checked against it, with no read either. Without the watch both
//! admissions read the shard (`reads=1`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use crate::support::private_cluster::PrivateCluster;
use crate::support::webhook::{Log, Webhook, WebhookCommand};
use crate::support::{self};

/// Longer than the record check trusts a copy for on its own (`MAX_AGE`, 5 s).
const PAST_MAX_AGE: Duration = Duration::from_secs(6);

/// PortAllocation `name`, one role of the same name: its pods are `{name}-0` and `{name}-1`.
fn allocation(name: &str) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata: {{name: {name}, \
         namespace: apps}}\nspec:\n  pool: gpu\n  roles:\n  - name: {name}\n    replicas: 2\n    \
         ports: [{{name: http, env: HTTP_PORT}}]\n"
    )
}

fn pod(name: &str, allocation: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "namespace": "apps",
            "labels": {"portalloc.dev/allocation": allocation},
        },
        "spec": {"containers": [{"name": "engine", "image": "busybox"}]},
    }))
    .unwrap()
}

/// The `reads=` of the webhook's last `record check` line for `owner`.
fn last_reads(webhook: &Webhook, owner: &str) -> u64 {
    let log = webhook.log_text();
    let line = log
        .lines()
        .rfind(|l| l.contains("record check") && l.contains(owner))
        .unwrap_or_else(|| panic!("no record check of {owner} in the webhook's log:\n{log}"));
    line.split("reads=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no reads= in {line}"))
}

fn create(cluster: &PrivateCluster, name: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), allocation(name)).unwrap();
    let run = cluster.run(&["create", "-f", file.path().to_str().unwrap()]);
    assert!(run.ok(), "{run}");
}

#[tokio::test]
async fn copies_the_watch_keeps_current_spare_the_record_checks_reads() {
    let Some(cluster) = PrivateCluster::start("webhook-shard-watch", true) else {
        return;
    };
    let client = cluster.client().await;
    // One window: both allocations' ports lie in the same shard.
    let run = cluster.run(&["pool", "create", "gpu", "--range", "31000-31099"]);
    assert!(run.ok(), "{run}");
    for ns in ["apps", "quiet", "portalloc-system"] {
        support::create_namespace(&client, ns).await;
    }
    create(&cluster, "a");
    let logs = tempfile::tempdir().unwrap();
    let webhook = WebhookCommand::new(&cluster.kubeconfig)
        .args(&["-v", "2"])
        .env("NO_COLOR", "1")
        .log(Log::InDir(logs.path().to_path_buf()))
        .start(&client)
        .await
        .expect("start the webhook");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");

    // The first check reads the shard, or finds the copy the CLI has just written in the
    // cache directory they share; either way the webhook remembers it now.
    pods.create(&PostParams::default(), &pod("a-0", "a"))
        .await
        .unwrap();

    tokio::time::sleep(PAST_MAX_AGE).await;
    pods.create(&PostParams::default(), &pod("a-1", "a"))
        .await
        .unwrap();
    assert_eq!(
        last_reads(&webhook, "apps/a"),
        0,
        "a copy older than 5 s that the watch vouches for is read again"
    );

    // Another client writes the shard: B's ports reach the webhook's copy by the watch.
    create(&cluster, "b");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let admitted = pods
        .create(&PostParams::default(), &pod("b-0", "b"))
        .await
        .unwrap();
    assert!(
        admitted.spec.unwrap().containers[0]
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "HTTP_PORT"),
        "b-0 admitted without its port"
    );
    assert_eq!(
        last_reads(&webhook, "apps/b"),
        0,
        "the CLI's write did not reach the remembered copy: B's pod read the shard"
    );
    drop(webhook);
}

//! `sync --watch` as a process against a control plane of its own (a cluster-wide watcher
//! repairs every pool, which would disturb the other tests' deliberate leaks), running as the
//! ServiceAccount `deploy/watcher.yaml` ships, with its ClusterRole and a real token: apply, scale
//! and delete with nothing but the API (as GitOps does), probes, SIGTERM; kill -9 and restart
//! with deletions in the gap; two watchers racing eight CLI clients without a duplicate; and
//! without the binding, one clear Forbidden.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use portalloc::api::{ConfigMapTarget, PortAllocation};
use portalloc::ledger::{WindowRecord, recorded_holdings};

use crate::configmap::{assert_own_ports, files};
use crate::support::apply::{apply_value, apply_yaml};
use crate::support::cli::BIN;
use crate::support::poll::until_object;
use crate::support::private_cluster::PrivateCluster;
use crate::support::service_account::{
    service_account_kubeconfig, watcher_kubeconfig, watcher_role_without,
};
use crate::support::watcher_process::WatcherProcess;
use crate::support::{self, allocation};

/// The watcher's arguments in these tests: every namespace, a resync every 20 s.
const WATCH_ARGS: &[&str] = &["-A", "--resync", "20s", "-v", "1"];

/// A watcher as the ServiceAccount behind `kubeconfig`, expected to stop at start with
/// Forbidden (exit 5): what it printed.
fn refused_at_start(kubeconfig: &Path) -> String {
    let refused = Command::new(BIN)
        .args(["sync", "--watch", "-A"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(5), "{stderr}");
    stderr
}

/// Until `check` holds for PortAllocation `name`; the time it took.
async fn until(
    api: &Api<PortAllocation>,
    name: &str,
    check: impl Fn(Option<&PortAllocation>) -> bool,
) -> Duration {
    until_object(api, name, Duration::from_secs(30), check).await
}

fn ready_with(pa: Option<&PortAllocation>, ports: usize) -> bool {
    pa.and_then(|pa| pa.status.as_ref()).is_some_and(|s| {
        s.observed_generation == pa.unwrap().metadata.generation
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
            && recorded_holdings(s).len() == ports
    })
}

async fn record(client: &Client, pool: &str) -> WindowRecord {
    crate::support::invariants::window_record(client, pool).await
}

/// How many ports are held, if every pool entry belongs to a live object and says what its
/// status says, with no duplicates; else what is wrong.
async fn exactness(client: &Client, pool: &str, ns: &str) -> Result<usize, String> {
    let record = record(client, pool).await;
    if !record.anomalies.is_empty() {
        return Err(format!("{:?}", record.anomalies));
    }
    let live: BTreeMap<String, PortAllocation> =
        Api::<PortAllocation>::namespaced(client.clone(), ns)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|pa| (pa.metadata.uid.clone().unwrap(), pa))
            .collect();
    for (uid, entry) in &record.holders {
        let Some(pa) = live.get(uid) else {
            return Err(format!("leaked entry {}", entry.owner));
        };
        let recorded = pa
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default();
        if recorded != entry.holdings {
            return Err(format!(
                "{}: status {recorded:?} but pool {:?}",
                entry.owner, entry.holdings
            ));
        }
    }
    Ok(record.state.held_count() as usize)
}

/// Wait until the pool is exact with `held` ports held (the watcher may still be catching up).
async fn assert_exact(client: &Client, pool: &str, ns: &str, held: usize) {
    let started = Instant::now();
    loop {
        let now = exactness(client, pool, ns).await;
        if now == Ok(held) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "pool {pool} never became exact with {held} ports: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_watcher_allocates_scales_frees_and_survives_kill_9_and_a_rival() {
    let Some(cluster) = PrivateCluster::start("watch", true) else {
        return;
    };
    let client = cluster.client().await;
    let ns = "apps";
    assert!(
        cluster
            .run(&["pool", "create", "watched", "--range", "30100-30199"])
            .ok()
    );
    support::create_namespace(&client, ns).await;
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), ns);
    let dir = tempfile::tempdir().unwrap();

    // Without a binding: one clear Forbidden at start, naming the verb and the resource.
    support::create_namespace(&client, "portalloc-system").await;
    let unbound = dir.path().join("unbound");
    service_account_kubeconfig(
        &client,
        &cluster.kubeconfig,
        "portalloc-system",
        "nobody",
        &unbound,
    )
    .await;
    let stderr = refused_at_start(&unbound);
    assert!(
        stderr.contains("forbidden: you may not list portallocations.portalloc.dev")
            && stderr.contains("deploy/watcher.yaml"),
        "{stderr}"
    );

    // Every right but the ConfigMaps': the start-up check names the first one missing.
    for object in watcher_role_without("configmaps", "partial", "portalloc-system") {
        apply_value(&client, object, None).await;
    }
    let partial = dir.path().join("partial");
    service_account_kubeconfig(
        &client,
        &cluster.kubeconfig,
        "portalloc-system",
        "partial",
        &partial,
    )
    .await;
    let stderr = refused_at_start(&partial);
    assert!(
        stderr.contains("forbidden: you may not get configmaps")
            && stderr.contains("deploy/watcher.yaml"),
        "{stderr}"
    );

    // The shipped manifests: Namespace, ServiceAccount, ClusterRole, binding, Deployment (the
    // API server validates it; no kubelet runs it here, the watcher runs as a process instead).
    let manifests =
        std::fs::read_to_string(support::repo_root().join("deploy/watcher.yaml")).unwrap();
    apply_yaml(&client, &manifests, None).await;
    // The Argo CD PostSync hook runs as the same account: the API server accepts its Job.
    let hook =
        std::fs::read_to_string(support::repo_root().join("deploy/argocd-postsync-job.yaml"))
            .unwrap();
    let job: kube::api::DynamicObject = serde_yaml::from_str(&hook).unwrap();
    let jobs: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "portalloc-system",
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("batch", "v1", "Job")),
    );
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let accepted = jobs
        .create(&dry_run, &job)
        .await
        .expect("the hook Job is valid");
    assert_eq!(
        accepted.data["spec"]["template"]["spec"]["serviceAccountName"],
        "portalloc-watcher"
    );
    let kubeconfig = dir.path().join("watcher");
    watcher_kubeconfig(&client, &cluster.kubeconfig, &kubeconfig).await;

    // Apply, scale, delete: the watcher follows within the measured times.
    let watcher = WatcherProcess::start(&kubeconfig, "watcher", WATCH_ARGS, dir.path());
    api.create(&PostParams::default(), &allocation("a", "watched", 2))
        .await
        .unwrap();
    let applied = until(&api, "a", |pa| ready_with(pa, 2)).await;
    let mut a = api.get("a").await.unwrap();
    a.spec.roles[0].replicas = 5;
    api.replace("a", &PostParams::default(), &a).await.unwrap();
    let scaled = until(&api, "a", |pa| ready_with(pa, 5)).await;
    let started = Instant::now();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    while record(&client, "watched").await.state.held_count() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ports of a deleted object kept"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let freed = started.elapsed();
    eprintln!(
        "watch: apply -> Ready {applied:?}, scale -> new ports {scaled:?}, delete -> freed {freed:?}"
    );

    // The env follows: the ConfigMap appears with the allocation, changes with a scale, and
    // one deleted by hand is back at the next resync (20 s here) though the object is current.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let mut env = allocation("env", "watched", 2);
    env.spec.config_map = Some(ConfigMapTarget {
        name: "env-files".into(),
    });
    api.create(&PostParams::default(), &env).await.unwrap();
    let written = until_object(&configmaps, "env-files", Duration::from_secs(30), |cm| {
        cm.is_some_and(|cm| files(cm).len() == 2)
    })
    .await;
    until(&api, "env", |pa| ready_with(pa, 2)).await;
    let env = api.get("env").await.unwrap();
    let cm = configmaps.get("env-files").await.unwrap();
    assert_own_ports(&cm, &env);
    assert_eq!(
        cm.metadata.owner_references.as_ref().unwrap()[0].uid,
        env.metadata.uid.clone().unwrap()
    );
    let mut scaled_env = env.clone();
    scaled_env.spec.roles[0].replicas = 3;
    api.replace("env", &PostParams::default(), &scaled_env)
        .await
        .unwrap();
    let rescaled = until_object(&configmaps, "env-files", Duration::from_secs(30), |cm| {
        cm.is_some_and(|cm| files(cm).len() == 3)
    })
    .await;
    until(&api, "env", |pa| ready_with(pa, 3)).await;
    let env = api.get("env").await.unwrap();
    assert_own_ports(&configmaps.get("env-files").await.unwrap(), &env);
    configmaps
        .delete("env-files", &DeleteParams::default())
        .await
        .unwrap();
    let back = until_object(&configmaps, "env-files", Duration::from_secs(45), |cm| {
        cm.is_some_and(|cm| files(cm).len() == 3)
    })
    .await;
    assert_own_ports(&configmaps.get("env-files").await.unwrap(), &env);
    eprintln!(
        "watch: ConfigMap written {written:?} after apply, {rescaled:?} after a scale, back \
         {back:?} after a deletion by hand"
    );
    api.delete("env", &DeleteParams::default()).await.unwrap();
    let started = Instant::now();
    while record(&client, "watched").await.state.held_count() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ports of a deleted object kept"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, log) = watcher.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("watcher stopped"), "{log}");

    // kill -9 mid-stream, objects created and deleted while none runs, then a restart.
    let watcher = WatcherProcess::start(&kubeconfig, "killed", WATCH_ARGS, dir.path());
    for i in 0..6 {
        api.create(
            &PostParams::default(),
            &allocation(&format!("k{i}"), "watched", 2),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    watcher.kill_9();
    for i in 0..3 {
        api.delete(&format!("k{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let watcher = WatcherProcess::start(&kubeconfig, "restarted", WATCH_ARGS, dir.path());
    for i in 3..6 {
        until(&api, &format!("k{i}"), |pa| ready_with(pa, 2)).await;
    }
    assert_exact(&client, "watched", ns, 6).await;

    // A second watcher and eight CLI clients at once: never a duplicate.
    let rival = WatcherProcess::start(&kubeconfig, "rival", WATCH_ARGS, dir.path());
    let clients: Vec<Child> = (0..8)
        .map(|i| {
            let mut child = Command::new(BIN)
                .args(["create", "-f", "-", "-n", ns])
                .env("KUBECONFIG", &cluster.kubeconfig)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let manifest =
                support::simple_allocation(&format!("cli{i}"), "watched", "worker", 3, &["rpc"]);
            child
                .stdin
                .take()
                .unwrap()
                .write_all(manifest.as_bytes())
                .unwrap();
            child
        })
        .collect();
    for i in 0..8 {
        api.create(
            &PostParams::default(),
            &allocation(&format!("git{i}"), "watched", 2),
        )
        .await
        .unwrap();
    }
    for mut child in clients {
        assert!(child.wait().unwrap().success());
    }
    for i in 0..8 {
        until(&api, &format!("git{i}"), |pa| ready_with(pa, 2)).await;
    }
    // 3 kept from before, 8 x 3 by the CLI, 8 x 2 by the watchers.
    assert_exact(&client, "watched", ns, 6 + 24 + 16).await;
    let (code, _) = rival.terminate();
    assert_eq!(code, Some(0));
    let (code, _) = watcher.terminate();
    assert_eq!(code, Some(0));
}

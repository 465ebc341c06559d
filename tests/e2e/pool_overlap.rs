//! Two pools of one protocol never share a port unless both say so: after `install`, the API
//! server refuses an overlapping PortPool however it is written (the kube client as a plain
//! `kubectl apply` would, the real kubectl, `pool create`), and an overlap written before the
//! policy is reported by `pool describe`, `repair`, the watcher's `Overlap` condition (shown by
//! `kubectl get ppool`) and its `portalloc_pool_overlap_ports` metric.
//!
//! A control plane of its own: the policy is cluster-wide, and the other tests share pools'
//! ranges freely (their clusters have the policy unbound: tests/common/control_plane.rs).

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use portalloc::api::PortPool;

use crate::support::private_cluster::PrivateCluster;
use crate::support::tools;
use crate::support::watcher_process::WatcherProcess;

fn pool(name: &str, ranges: &[&str], protocol: &str, allow_overlap: bool) -> PortPool {
    let ranges: Vec<String> = ranges.iter().map(|r| format!("\"{r}\"")).collect();
    serde_yaml::from_str(&format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata:\n  name: {name}\nspec:\n  \
         ranges: [{}]\n  protocol: {protocol}\n  allowOverlap: {allow_overlap}\n",
        ranges.join(", ")
    ))
    .unwrap()
}

/// The API server's answer to creating `pool`: `Ok` or the message of its refusal.
async fn create(pools: &Api<PortPool>, pool: &PortPool) -> Result<(), String> {
    match pools.create(&PostParams::default(), pool).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(e) => panic!("creating a PortPool: {e}"),
    }
}

/// Create `pool` until the API server refuses it (the policy and its params reach the
/// admission plugin through informers, a moment after `install`), deleting each one it
/// accepted meanwhile; the refusal's message (30 s at most).
async fn refused_once_active(pools: &Api<PortPool>, pool: &PortPool) -> String {
    let started = Instant::now();
    let name = pool.metadata.name.clone().unwrap();
    loop {
        match create(pools, pool).await {
            Err(message) => return message,
            Ok(()) => {
                pools.delete(&name, &DeleteParams::default()).await.unwrap();
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the API server never refused PortPool {name}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Create `pool` until the API server accepts it: a param the policy reads (another pool)
/// reaches the admission plugin through an informer, a moment after it was written, so a pool
/// that an edit just made allowable may still be refused for a moment (30 s at most).
async fn accepted_once_seen(pools: &Api<PortPool>, pool: &PortPool) {
    let started = Instant::now();
    let name = pool.metadata.name.clone().unwrap();
    while let Err(message) = create(pools, pool).await {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the API server still refuses PortPool {name}: {message}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The `Overlap` condition's message on pool `name` once the watcher wrote `wanted` there.
async fn condition_until(pools: &Api<PortPool>, name: &str, wanted: Option<&str>) {
    let started = Instant::now();
    loop {
        let found = pools.get(name).await.unwrap();
        let message = found.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Overlap" && c.status == "True")
                .map(|c| c.message.clone())
        });
        if message.as_deref() == wanted {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "PortPool {name}'s Overlap condition is {message:?}, never {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(tools::kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl")
}

/// Whether the scrape has `portalloc_pool_overlap_ports` of 5 for `pool` and `other`, its
/// labels in either order.
fn has_sample(body: &str, pool: &str, other: &str) -> bool {
    [
        format!("portalloc_pool_overlap_ports{{pool=\"{pool}\",other=\"{other}\"}} 5"),
        format!("portalloc_pool_overlap_ports{{other=\"{other}\",pool=\"{pool}\"}} 5"),
    ]
    .iter()
    .any(|line| body.lines().any(|l| l == line))
}

async fn binding_deleted(client: &Client) {
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    bindings
        .delete("portalloc-pool-overlap", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_api_server_refuses_overlapping_pools_and_earlier_overlaps_are_reported() {
    let Some(cluster) = PrivateCluster::start("pool-overlap", false) else {
        return;
    };
    let installed = cluster.run(&["install", "--timeout", "60s"]);
    assert!(installed.ok(), "{installed}");
    assert!(
        installed.stdout.contains(
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/portalloc-pool-overlap installed"
        ),
        "{installed}"
    );
    let client = cluster.client().await;
    let pools: Api<PortPool> = Api::all(client.clone());
    create(&pools, &pool("a", &["49000-49009"], "TCP", false))
        .await
        .unwrap();

    // As `kubectl apply` writes it: refused, naming the other pool and the shared ports.
    let message = refused_once_active(&pools, &pool("b", &["49005-49014"], "TCP", false)).await;
    assert!(
        message.contains(
            "PortPool b would share TCP ports 49005-49009 with PortPool a (ranges 49000-49009)"
        ) && message.contains("spec.allowOverlap: true on both pools"),
        "{message}"
    );
    // Clear of it, or another protocol: accepted.
    create(&pools, &pool("c", &["49010-49019", "49100"], "TCP", false))
        .await
        .unwrap();
    create(&pools, &pool("u", &["49000-49009"], "UDP", false))
        .await
        .unwrap();
    // Several ranges meeting several: each run of shared ports named.
    let message = create(
        &pools,
        &pool("d", &["49008-49011", "49100-49101"], "TCP", false),
    )
    .await
    .unwrap_err();
    assert!(
        message.contains("PortPool d would share TCP ports 49008-49009 with PortPool a")
            || message
                .contains("PortPool d would share TCP ports 49010-49011,49100 with PortPool c"),
        "{message}"
    );

    // An update into an overlap: refused.
    let mut c = pools.get("c").await.unwrap();
    c.spec.ranges = vec!["49005-49019".into()];
    let refused = pools
        .replace("c", &PostParams::default(), &c)
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("PortPool c would share TCP ports 49005-49009 with PortPool a"),
        "{refused}"
    );

    // The real kubectl, as a GitOps repository is applied.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pool.yaml");
    std::fs::write(
        &file,
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata:\n  name: gitops\nspec:\n  ranges: [\"49015-49024\"]\n",
    )
    .unwrap();
    let applied = kubectl(
        &cluster.kubeconfig,
        &["apply", "-f", file.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&applied.stderr);
    assert!(
        !applied.status.success()
            && stderr.contains("PortPool gitops would share TCP ports 49015-49019 with PortPool c"),
        "{stderr}"
    );

    // Both allowing it: accepted.
    let mut a = pools.get("a").await.unwrap();
    a.spec.allow_overlap = true;
    pools
        .replace("a", &PostParams::default(), &a)
        .await
        .unwrap();
    accepted_once_seen(&pools, &pool("shared", &["49000-49004"], "TCP", true)).await;

    // pool create keeps its own refusal, before the API server's.
    let run = cluster.run(&["pool", "create", "e", "--range", "49008-49012"]);
    assert!(
        !run.ok()
            && run
                .stderr
                .contains("would share TCP ports 49008-49009 with PortPool \"a\""),
        "{run}"
    );

    // --allow-overlap skips the plugin's check and opts the new pool in; c does not opt in, so
    // the API server refuses it (exit code 7, invalid), and the plugin says so in its words.
    let run = cluster.run(&[
        "pool",
        "create",
        "e",
        "--range",
        "49016-49018",
        "--allow-overlap",
    ]);
    assert!(
        run.code == 7
            && run
                .stderr
                .contains("PortPool e would share TCP ports 49016-49018 with PortPool c")
            && !run.stderr.contains("{ "),
        "{run}"
    );

    // An overlap written while the policy is unbound (as before `install`).
    binding_deleted(&client).await;
    let started = Instant::now();
    while create(&pools, &pool("late", &["49015-49024"], "TCP", false))
        .await
        .is_err()
    {
        assert!(started.elapsed() < Duration::from_secs(30), "never unbound");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let shared = "PortPool late shares TCP ports 49015-49019 with PortPool c";
    let describe = cluster.run(&["pool", "describe", "late"]);
    assert!(
        describe.ok() && describe.stdout.contains(shared),
        "{describe}"
    );
    let describe = cluster.run(&["pool", "describe", "c"]);
    assert!(
        describe
            .stdout
            .contains("PortPool c shares TCP ports 49015-49019 with PortPool late"),
        "{describe}"
    );
    let repair = cluster.run(&["repair"]);
    assert!(
        repair.stdout.contains(
            "warning  pool/late  shares TCP ports 49015-49019 with PortPool c: each pool may hand"
        ) && repair.code == 10,
        "{repair}"
    );
    // Reported, never rewritten.
    let repair = cluster.run(&["repair", "--apply"]);
    assert!(repair.ok(), "{repair}");
    assert_eq!(
        pools.get("late").await.unwrap().spec.ranges,
        vec!["49015-49024".into()]
    );

    // The watcher's condition (a column of `kubectl get ppool`) and metric.
    let watcher = WatcherProcess::start(
        &cluster.kubeconfig,
        "watcher",
        &["-A", "--resync", "20s"],
        dir.path(),
    );
    condition_until(
        &pools,
        "late",
        Some("shares TCP ports 49015-49019 with PortPool c"),
    )
    .await;
    let listed = kubectl(&cluster.kubeconfig, &["get", "ppool", "late"]);
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(
        table.lines().next().unwrap_or_default().contains("OVERLAP")
            && table.contains("shares TCP ports 49015-49019 with PortPool c"),
        "{table}"
    );
    let started = Instant::now();
    loop {
        let body = watcher.get("/metrics").unwrap_or_default();
        if has_sample(&body, "late", "c") && has_sample(&body, "c", "late") {
            // The pools that share nothing have no series.
            let series: Vec<&str> = body
                .lines()
                .filter(|l| l.starts_with("portalloc_pool_overlap_ports{"))
                .collect();
            assert_eq!(series.len(), 2, "{body}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no overlap metric:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Bound again: the pool may still change in ways that add no shared port, not add one.
    let installed = cluster.run(&["install", "--timeout", "60s"]);
    assert!(installed.ok(), "{installed}");
    refused_once_active(&pools, &pool("b", &["49005-49014"], "TCP", false)).await;
    let mut late = pools.get("late").await.unwrap();
    late.metadata
        .labels
        .get_or_insert_default()
        .insert("team".into(), "gitops".into());
    let late = pools
        .replace("late", &PostParams::default(), &late)
        .await
        .unwrap();
    let mut wider = late.clone();
    wider.spec.ranges = vec!["49012-49024".into()];
    let refused = pools
        .replace("late", &PostParams::default(), &wider)
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("PortPool late would share TCP ports 49012-49019 with PortPool c"),
        "{refused}"
    );
    // Moved clear of c: the condition and the metric go.
    let mut moved = late;
    moved.spec.ranges = vec!["49030-49039".into()];
    pools
        .replace("late", &PostParams::default(), &moved)
        .await
        .unwrap();
    condition_until(&pools, "late", None).await;
    let (_, log) = watcher.terminate();
    assert!(!log.contains("panicked"), "{log}");
}

/// The policy is evaluated once per existing pool for each PortPool written; `celcost
/// --overlap-policy` runs it with the API server's admission code against 1,000 pools: every
/// evaluation within the limits (an expression over PerCallLimit fails the run), each write
/// decided as expected. The figures are in docs/performance.md.
#[test]
fn the_overlap_policy_is_within_the_cel_cost_limits_at_1000_pools() {
    let policy = crate::support::repo_root().join("rbac/portalloc-pool-overlap-policy.yaml");
    let out = std::process::Command::new(tools::celcost())
        .arg("--overlap-policy")
        .arg(&policy)
        .output()
        .expect("run celcost");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let heaviest: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  heaviest evaluation "))
        .collect();
    assert_eq!(heaviest.len(), 6, "one line per write: {text}");
    assert!(
        text.contains("64 ranges against 1,000 pools of 64 ranges each, none shared")
            && !text.contains("ERROR")
            && !text.contains("UNEXPECTED"),
        "{text}"
    );
}

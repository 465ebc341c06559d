//! The pod webhook gives a pod only ports the pool's record gives its PortAllocation, with two
//! real identities under rbac/ and the tenancy policy: tenant A (`portalloc-user`, namespace
//! tenant-a) and tenant B (`portalloc-user2`, tenant-b). A tenant may write its own
//! PortAllocation's status (client-side allocation needs it) and its own shard entries, so A can
//! write B's port into its status; the policy stops A from touching B's entry and from listing
//! B's port in its own (only an administrator can write a port held twice, which then denies it to
//! both). The real kube-apiserver calls the webhook (run as the watcher's ServiceAccount)
//! for every labelled pod, created as a workload controller would. Then the admission latency of
//! one burst of B's pods, with the check off and on, alternately.
//!
//! A control plane of its own: the webhook's configuration and the policies are cluster-wide.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use portalloc::api::{PortAllocation, PortPool, PortPoolShard};
use portalloc::core::{Holdings, SlotKey};
use portalloc::k8s::ShardStore;
use portalloc::ledger::{CopyRecord, PoolSnapshot, ShardKey, shard_name, window_of};

use crate::support::apply::{apply_yaml, bind, create_namespace};
use crate::support::cli::Run;
use crate::support::poll::until_refused;
use crate::support::private_cluster::{PrivateCluster, client_from};
use crate::support::service_account::watcher_kubeconfig;
use crate::support::webhook::{Log, Webhook, WebhookCommand};
use crate::support::{self, USER_CONTEXT, USER_NAME, tools};

const USER2_CONTEXT: &str = "portalloc-local-user2";
const USER2_NAME: &str = "portalloc-user2";
const POOL: &str = "gpu";
/// B's pods, created one after the other for the latency figures.
const BURST: u32 = 50;
/// Rounds of the burst per setting (off and on alternate).
const ROUNDS: usize = 6;

fn allocation(name: &str, replicas: u32, block: bool) -> String {
    let nixl = if block {
        ", {name: nixl, env: NIXL_PORT, count: 4}"
    } else {
        ""
    };
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata: {{name: {name}}}\n\
         spec:\n  pool: {POOL}\n  roles:\n  - name: web\n    replicas: {replicas}\n    \
         ports: [{{name: http, env: HTTP_PORT}}{nixl}]\n"
    )
}

fn pod(namespace: &str, name: &str, allocation: &str) -> Pod {
    serde_yaml::from_str(&format!(
        "metadata: {{name: {name}, namespace: {namespace}, labels: {{portalloc.dev/allocation: \
         {allocation}}}}}\nspec:\n  containers: [{{name: engine, image: busybox}}]\n"
    ))
    .unwrap()
}

fn env_of(pod: &Pod) -> BTreeMap<String, String> {
    pod.spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn as_user(cluster: &PrivateCluster, context: &str, args: &[&str]) -> Run {
    cluster.run(&[&["--context", context], args].concat())
}

/// `create -f` of `yaml` in `namespace` as the user of `context`.
fn create_as(cluster: &PrivateCluster, context: &str, namespace: &str, yaml: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    let path = file.path().to_str().unwrap();
    let run = as_user(cluster, context, &["create", "-n", namespace, "-f", path]);
    assert!(run.ok(), "{run}");
}

/// The first value of `role.port` in the status of `pa`.
fn value(pa: &PortAllocation, port: &str, index: usize) -> u16 {
    let status = pa.status.as_ref().unwrap();
    let assignment = status.assignments.iter().find(|a| a.port == port).unwrap();
    assignment.values[index] as u16
}

/// The webhook, as `sync --watch` of a namespace nobody uses serves it, logging to a file in
/// `dir`, registered and answering; the record check off unless `check`.
async fn start_webhook(kubeconfig: &Path, dir: &Path, check: bool, client: &Client) -> Webhook {
    let mut command = WebhookCommand::new(kubeconfig)
        .probes()
        .args(&["-v", "2"])
        .env("NO_COLOR", "1")
        .log(Log::InDir(dir.to_path_buf()))
        .register_timeout(Duration::from_secs(60));
    if !check {
        command = command.env("PORTALLOC_WEBHOOK_RECORD_CHECK", "off");
    }
    command.start(client).await.unwrap()
}

/// (sum of seconds, count) of the webhook's admission duration histogram.
fn admission_seconds(webhook: &Webhook) -> (f64, f64) {
    let text = webhook.get("/metrics").expect("its /metrics");
    let find = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} missing: {text}"))
    };
    (
        find("portalloc_admission_duration_seconds_sum"),
        find("portalloc_admission_duration_seconds_count"),
    )
}

/// The webhook's `record check` log lines for `owner`.
fn record_checks(webhook: &Webhook, owner: &str) -> Vec<String> {
    webhook
        .log_text()
        .lines()
        .filter(|l| l.contains("record check") && l.contains(owner))
        .map(str::to_string)
        .collect()
}

/// Create `pod`: the pod as admitted, or the API server's message.
async fn admit(pods: &Api<Pod>, pod: &Pod) -> Result<Pod, String> {
    pods.create(&PostParams::default(), pod)
        .await
        .map_err(|e| match e {
            kube::Error::Api(status) => status.message,
            other => other.to_string(),
        })
}

async fn delete_and_wait(pods: &Api<Pod>, names: &[String]) {
    for name in names {
        let _ = pods.delete(name, &Default::default()).await;
    }
    for name in names {
        while pods.get_opt(name).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// B's pods `web-0..BURST` created one after the other: each one's create time. Every pod
/// carries B's own ports.
async fn burst(pods: &Api<Pod>, b: &PortAllocation) -> Vec<Duration> {
    let mut times = Vec::new();
    for i in 0..BURST {
        let started = Instant::now();
        let admitted = admit(pods, &pod("tenant-b", &format!("web-{i}"), "b")).await;
        times.push(started.elapsed());
        let env = env_of(&admitted.unwrap_or_else(|e| panic!("B's web-{i}: {e}")));
        assert_eq!(
            env["HTTP_PORT"],
            value(b, "http", i as usize).to_string(),
            "web-{i}"
        );
        assert_eq!(env["NIXL_PORT"], value(b, "nixl", i as usize).to_string());
    }
    let names: Vec<String> = (0..BURST).map(|i| format!("web-{i}")).collect();
    delete_and_wait(pods, &names).await;
    times
}

fn quantiles(mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    (p(0.5), p(0.99))
}

#[tokio::test]
async fn a_pod_gets_only_ports_the_record_gives_its_allocation() {
    let Some(cluster) = PrivateCluster::start("webhook-record", true) else {
        return;
    };
    let root = cluster.client().await;
    let rbac = |name: &str| std::fs::read_to_string(support::repo_root().join(name)).unwrap();
    apply_yaml(&root, &rbac("rbac/portalloc-user.yaml"), None).await;
    for ns in ["tenant-a", "tenant-b", "quiet", "portalloc-system"] {
        create_namespace(&root, ns).await;
    }
    for (user, ns, cluster_binding) in [
        (USER_NAME, "tenant-a", "pool-user-a"),
        (USER2_NAME, "tenant-b", "pool-user-b"),
    ] {
        bind(&root, "portalloc-user", "portalloc-user", user, Some(ns)).await;
        bind(&root, cluster_binding, "portalloc-pool-user", user, None).await;
    }
    assert!(
        cluster
            .run(&["pool", "create", POOL, "--range", "30000-30999"])
            .ok()
    );
    apply_yaml(&root, &rbac("rbac/portalloc-tenancy-policy.yaml"), None).await;
    for file in ["deploy/watcher.yaml", "deploy/webhook.yaml"] {
        apply_yaml(&root, &rbac(file), None).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let account = dir.path().join("watcher");
    watcher_kubeconfig(&root, &cluster.kubeconfig, &account).await;

    // Each tenant allocates its own, client-side.
    create_as(
        &cluster,
        USER_CONTEXT,
        "tenant-a",
        &allocation("a", 3, false),
    );
    create_as(
        &cluster,
        USER2_CONTEXT,
        "tenant-b",
        &allocation("b", BURST, true),
    );
    let tenant_a = client_from(&cluster.kubeconfig, Some(USER_CONTEXT)).await;
    let a_allocations: Api<PortAllocation> = Api::namespaced(tenant_a.clone(), "tenant-a");
    let b = Api::<PortAllocation>::namespaced(root.clone(), "tenant-b")
        .get("b")
        .await
        .unwrap();
    let a = a_allocations.get("a").await.unwrap();
    let (a_port, b_port) = (value(&a, "http", 0), value(&b, "http", 0));
    let b_key = ShardKey::first(window_of(b_port));
    let b_shard = shard_name(POOL, b_key);

    // The policy: A cannot drop B's entry from B's shard...
    let shards_as_a: Api<PortPoolShard> = Api::all(tenant_a.clone());
    let refusal = until_refused("portalloc-pool-holders", || async {
        let mut shard = shards_as_a.get(&b_shard).await.unwrap();
        let status = shard.status.get_or_insert_with(Default::default);
        status.holders.retain(|h| h.owner != "tenant-b/b");
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        shards_as_a
            .replace_status(&b_shard, &dry_run, &shard)
            .await
            .map(|_| ())
    })
    .await;
    assert!(
        refusal.contains("'portalloc-pool-holders'") && refusal.contains("tenant-b/b"),
        "{refusal}"
    );
    // ...but may write B's port into its own status.
    let mut forged = a.clone();
    forged.status.as_mut().unwrap().assignments[0].values[0] = i32::from(b_port);
    a_allocations
        .replace_status("a", &PostParams::default(), &forged)
        .await
        .expect("RBAC and the tenancy policy let a tenant write its own status");
    eprintln!("tenant A wrote B's port {b_port} into its own status (its own: {a_port})");

    let a_pods: Api<Pod> = Api::namespaced(root.clone(), "tenant-a");
    let b_pods: Api<Pod> = Api::namespaced(root.clone(), "tenant-b");
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut inside: [(f64, f64); 2] = [(0.0, 0.0), (0.0, 0.0)];
    let (mut check_times, mut reads) = (Vec::new(), 0);
    for round in 0..2 * ROUNDS {
        let check = round % 2 == 1;
        let webhook = start_webhook(&account, dir.path(), check, &root).await;
        if round < 2 {
            if check {
                // With kubectl, as a person would see it.
                let yaml = serde_yaml::to_string(&pod("tenant-a", "web-0", "a")).unwrap();
                let mut kubectl = Command::new(tools::kubectl());
                kubectl
                    .arg("--kubeconfig")
                    .arg(&cluster.kubeconfig)
                    .args(["create", "-f", "-"]);
                let out = tools::run_with_input(kubectl, &yaml);
                assert!(!out.status.success(), "A's pod with B's port is denied");
                let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
                eprintln!("denial: {message}");
                assert!(
                    message.contains(&format!(
                        "the status of PortAllocation tenant-a/a gives pod web[0] port {b_port} \
                         (web.http), but pool gpu's record (PortPoolShard {b_shard}) gives that \
                         port to PortAllocation tenant-b/b"
                    )) && message.contains("Run kubectl portalloc sync a -n tenant-a"),
                    "{message}"
                );
            } else {
                // Today's webhook injects whatever the status says.
                let answer = admit(&a_pods, &pod("tenant-a", "web-0", "a")).await;
                let admitted = answer.expect("without the check, admitted");
                assert_eq!(env_of(&admitted)["HTTP_PORT"], b_port.to_string());
                delete_and_wait(&a_pods, &["web-0".into()]).await;
            }
            // A's other pods keep their own ports either way.
            let admitted = admit(&a_pods, &pod("tenant-a", "web-1", "a"))
                .await
                .unwrap();
            assert_eq!(
                env_of(&admitted)["HTTP_PORT"],
                value(&a, "http", 1).to_string()
            );
            delete_and_wait(&a_pods, &["web-1".into()]).await;
        }
        let before = admission_seconds(&webhook);
        times[check as usize].extend(burst(&b_pods, &b).await);
        let after = admission_seconds(&webhook);
        inside[check as usize].0 += after.0 - before.0;
        inside[check as usize].1 += after.1 - before.1;
        if check {
            // What the check itself took in each admission of the burst, by its log line.
            let checks = record_checks(&webhook, "tenant-b/b");
            assert_eq!(checks.len(), BURST as usize, "one check per pod");
            let field = |line: &str, name: &str| -> u64 {
                let value = line.split(&format!("{name}=")).nth(1).unwrap_or_default();
                let digits = value.split_whitespace().next().unwrap_or_default();
                digits
                    .parse()
                    .unwrap_or_else(|_| panic!("{name} in {line}"))
            };
            reads += checks.iter().map(|l| field(l, "reads")).sum::<u64>();
            check_times.extend(
                checks
                    .iter()
                    .map(|l| Duration::from_micros(field(l, "took_us"))),
            );
        }
    }
    let samples = times[0].len();
    let (off, on) = (quantiles(times[0].clone()), quantiles(times[1].clone()));
    let checked = quantiles(check_times);
    let mean_ms = |(sum, count): (f64, f64)| sum / count * 1000.0;
    eprintln!(
        "webhook record check: {samples} creates of B's labelled pods per setting ({ROUNDS} \
         rounds of {BURST}, alternating), p50/p99: check off {:?}/{:?}, check on {:?}/{:?}; \
         mean time inside the webhook: off {:.2} ms, on {:.2} ms; the check itself p50/p99 \
         {:?}/{:?}, {reads} shard reads in {samples} admissions",
        off.0,
        off.1,
        on.0,
        on.1,
        mean_ms(inside[0]),
        mean_ms(inside[1]),
        checked.0,
        checked.1,
    );

    // From here on the check is on. A's fix: sync rewrites its status from the record.
    let webhook = start_webhook(&account, dir.path(), true, &root).await;
    let run = as_user(&cluster, USER_CONTEXT, &["sync", "a", "-n", "tenant-a"]);
    assert!(run.ok(), "{run}");
    let admitted = admit(&a_pods, &pod("tenant-a", "web-0", "a"))
        .await
        .unwrap();
    assert_eq!(env_of(&admitted)["HTTP_PORT"], a_port.to_string());

    // A status newer than the webhook's remembered copy of the shard: A grows by one pod with
    // the CLI (the webhook has not seen that write); the new pod is admitted after a re-read.
    create_as(
        &cluster,
        USER_CONTEXT,
        "tenant-a",
        &allocation("a", 4, false),
    );
    let a = a_allocations.get("a").await.unwrap();
    let admitted = admit(&a_pods, &pod("tenant-a", "web-3", "a"))
        .await
        .unwrap();
    assert_eq!(
        env_of(&admitted)["HTTP_PORT"],
        value(&a, "http", 3).to_string()
    );
    eprintln!(
        "after A grew outside the webhook: {:?}",
        record_checks(&webhook, "tenant-a/a").last()
    );

    // A may write its own entries, but not B's port into them: a port two entries list is denied
    // to the pods of both owners, so A would block B's pods. The write is refused, naming the
    // port and its holder, and the record stays as it was.
    let pool = Api::<PortPool>::all(tenant_a.clone())
        .get(POOL)
        .await
        .unwrap();
    let record_as = |client: &Client| {
        let shards = ShardStore::new(client.clone());
        let snapshot = PoolSnapshot::of_pool(&pool);
        async move { CopyRecord::load(snapshot, shards.list(POOL).await.unwrap()).unwrap() }
    };
    let record = record_as(&tenant_a).await;
    let entries_before = record.shards[&b_key.window].record.entries().to_vec();
    let uid = a.metadata.uid.clone().unwrap();
    let mut holdings: Holdings = record.holdings_of(&uid);
    holdings.insert(SlotKey::new("web", "http", 0), b_port);
    let writes = record.writes_for(&uid, "tenant-a/a", &holdings);
    assert!(!writes.is_empty());
    let shards_a = ShardStore::new(tenant_a.clone());
    let mut refusals = Vec::new();
    for write in &writes {
        if let Err((e, _)) = shards_a.commit(&record.pool, write).await {
            refusals.push(e.to_string());
        }
    }
    eprintln!("A lists B's port in its own entry: {refusals:?}");
    assert!(
        refusals
            .iter()
            .any(|r| r.contains("'portalloc-pool-holders'")
                && r.contains(&format!(
                    "PortPoolShard {b_shard}: this update lists port {b_port} of PortAllocation \
                 tenant-a/a, which PortAllocation tenant-b/b holds"
                ))
                && r.contains("only pool administrators may write one")
                && r.contains(&format!("kubectl portalloc repair --pool {POOL}"))),
        "{refusals:?}"
    );
    let record = record_as(&root).await;
    assert!(record.anomalies.is_empty(), "{:?}", record.anomalies);
    assert_eq!(
        record.shards[&b_key.window].record.entries(),
        entries_before,
        "the refused write changed nothing"
    );
    assert!(!record.holdings_of(&uid).ports().any(|p| p == b_port));
    // A can still write B's port into its own status: A's pod is denied it, B's pods get it.
    let forge = || async {
        let mut forged = a_allocations.get("a").await.unwrap();
        let status = forged.status.as_mut().unwrap();
        status.assignments[0].values[0] = i32::from(b_port);
        if !status.shards.contains(&b_key.to_status()) {
            status.shards.push(b_key.to_status());
        }
        a_allocations
            .replace_status("a", &PostParams::default(), &forged)
            .await
            .unwrap();
    };
    forge().await;
    delete_and_wait(&a_pods, &["web-0".into()]).await;
    let message = admit(&a_pods, &pod("tenant-a", "web-0", "a"))
        .await
        .expect_err("A's pod with B's port");
    assert!(
        message.contains(&format!(
            "gives pod web[0] port {b_port} (web.http), but pool gpu's record (PortPoolShard \
             {b_shard}) gives that port to PortAllocation tenant-b/b:"
        )),
        "{message}"
    );
    let admitted = admit(&b_pods, &pod("tenant-b", "web-0", "b"))
        .await
        .unwrap();
    assert_eq!(env_of(&admitted)["HTTP_PORT"], b_port.to_string());
    delete_and_wait(&b_pods, &["web-0".into()]).await;

    // An administrator may list it twice (repair writes any entry): then neither pod gets that
    // port until a person decides which owner gives it up.
    let shards = ShardStore::new(root.clone());
    let record = record_as(&root).await;
    for write in record.writes_for(&uid, "tenant-a/a", &holdings) {
        shards
            .commit(&record.pool, &write)
            .await
            .expect("an administrator writes any entry");
    }
    forge().await;
    let message = admit(&a_pods, &pod("tenant-a", "web-0", "a"))
        .await
        .expect_err("A's pod: a port held twice");
    assert!(
        message.contains("gives that port to PortAllocation tenant-b/b as well"),
        "{message}"
    );
    let message = admit(&b_pods, &pod("tenant-b", "web-0", "b"))
        .await
        .expect_err("B's pod: a port held twice");
    eprintln!("a port held twice, B's pod: {message}");
    assert!(
        message.contains(&format!(
            "the status of PortAllocation tenant-b/b gives pod web[0] port {b_port} (web.http), \
             but pool gpu's record (PortPoolShard {b_shard}) gives that port to PortAllocation \
             tenant-a/a as well"
        )),
        "{message}"
    );
    // A person decides: A's ports are released and allocated again; both pods then pass.
    for args in [
        ["release", "a", "-n", "tenant-a"],
        ["sync", "a", "-n", "tenant-a"],
    ] {
        let run = cluster.run(&args);
        assert!(run.ok(), "{run}");
    }
    let admitted = admit(&b_pods, &pod("tenant-b", "web-0", "b"))
        .await
        .unwrap();
    assert_eq!(env_of(&admitted)["HTTP_PORT"], b_port.to_string());
    let admitted = admit(&a_pods, &pod("tenant-a", "web-0", "a"))
        .await
        .unwrap();
    assert_ne!(env_of(&admitted)["HTTP_PORT"], b_port.to_string());
    drop(webhook);
}

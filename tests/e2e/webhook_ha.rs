//! Two webhook replicas behind a Service, called by the real kube-apiserver, through rolling
//! restarts and a kill -9, on a control plane of its own.
//!
//! kube-apiserver calls the webhook Service through its EndpointSlices
//! (`--enable-aggregator-routing`), which [`Endpoints`] keeps as kubelet's readiness probe and
//! the EndpointSlice controller would; a replica "deleted" from the Deployment leaves them. A
//! draining replica is dropped through the slow path: its failed probe, not its pod's
//! deletion.
//!
//! Scenario A: a rolling restart of both replicas (SIGTERM one, start its replacement, wait
//! until it is in the endpoints, then the other) during a burst of 100 labelled pod creations:
//! none refused, each pod with its own ports, the CA Secret and the configuration never
//! rewritten (the replicas do not fight over them). Scenario B: a replica killed -9 during a
//! second burst: the creations it refused succeed when retried as a workload controller
//! retries them ([`create_like_a_controller`]; no kube-controller-manager runs here), and no
//! pod is admitted without its ports. Then a stale caBundle and a replaced CA Secret: the
//! replicas put both right, and agree; and a deleted configuration (an uninstall) stays
//! deleted.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use portalloc::api::PortAllocation;

use crate::support::endpoints::{Endpoints, routable_address};
use crate::support::private_cluster::PrivateCluster;
use crate::support::service_account::watcher_kubeconfig;
use crate::support::webhook::{Log, Webhook, WebhookCommand};
use crate::support::{self, apply::apply_yaml};

const SYSTEM: &str = "portalloc-system";
const SERVICE: &str = "portalloc-webhook";
/// How often a replica checks its certificate and the configuration (src/k8s/webhook/upkeep.rs).
const CHECK_EVERY: Duration = Duration::from_secs(10);
/// Pods per burst, as the issue asks.
const BURST: usize = 100;
/// A burst comes in waves, as a ReplicaSet creates pods in parallel batches: [`WAVE`] creations
/// at once every [`WAVE_EVERY`], 5 pods a second, so a burst lasts about as long as a rolling
/// restart of two replicas. Creations at once make the API server open several connections,
/// spread over the replicas it finds ready.
const WAVE: usize = 5;
const WAVE_EVERY: Duration = Duration::from_millis(1000);

/// One webhook replica as the Deployment runs it: behind the Service, with the default
/// shutdown delay; its probes on loopback (only the stand-in kubelet reads them).
struct Replica {
    name: String,
    webhook: Webhook,
}

impl Replica {
    fn start(name: &str, ip: Ipv4Addr, kubeconfig: &Path) -> Replica {
        let webhook = WebhookCommand::new(kubeconfig)
            .address(ip)
            .webhook_namespace(SYSTEM)
            .service(SERVICE)
            .probes()
            // As the chart runs them: one leads, and both serve the webhook.
            .args(&["-v", "1", "--leader-elect"])
            .env("POD_NAME", name)
            .env("NO_COLOR", "1")
            .log(Log::Piped)
            .spawn()
            .expect("spawn a webhook replica");
        Replica {
            name: name.to_string(),
            webhook,
        }
    }

    fn port(&self) -> u16 {
        self.webhook.port()
    }

    fn probes(&self) -> u16 {
        self.webhook.probes()
    }

    /// SIGTERM, as kubelet stops a pod; returns at once (the replica drains on its own).
    fn terminate(&self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.webhook.pid() as i32, libc::SIGTERM) };
    }

    /// Until it exits: its exit code, how long that took, and its log.
    fn wait(mut self, since: Instant) -> (Option<i32>, Duration, String) {
        use std::io::Read;
        let child = self.webhook.child();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "{} still running 30 s after SIGTERM (terminationGracePeriodSeconds)",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let took = since.elapsed();
        let mut log = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut log)
            .unwrap();
        (status.code(), took, log)
    }

    /// Its `/metrics` text, empty if it does not answer.
    fn metrics(&self) -> String {
        self.webhook.get("/metrics").unwrap_or_default()
    }

    /// The admissions it has answered (`portalloc_admissions_total`, all results).
    fn admissions(&self) -> u64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with("portalloc_admissions_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Whether it holds the watcher's Lease (`portalloc_leader`).
    fn leading(&self) -> bool {
        self.metrics().lines().any(|l| l == "portalloc_leader 1")
    }

    fn kill_9(self) {
        self.webhook.kill();
    }
}

/// The chart's leader Role and its binding for watchers of `namespace` alone (the Lease
/// `portalloc-watcher-<namespace>`), as `helm template --set watchNamespace=<namespace>`
/// renders them.
fn yaml_of_leader_role(namespace: &str) -> String {
    let rendered = crate::helm::template_text(&[&format!("watchNamespace={namespace}")], &[]);
    crate::helm::documents(&rendered)
        .into_iter()
        .filter(|d| d["metadata"]["name"] == "portalloc-watcher-leader")
        .map(|d| serde_yaml::to_string(&d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

/// A labelled pod `worker-<index>` of PortAllocation `w`.
fn worker(index: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("worker-{index}"),
            "namespace": "apps",
            "labels": {"portalloc.dev/allocation": "w"},
        },
        "spec": {"containers": [{"name": "engine", "image": "busybox"}]},
    }))
    .unwrap()
}

/// What one creation came to.
#[derive(Debug, Default)]
struct Outcome {
    /// Refusals before it was created (each one retried).
    refusals: Vec<String>,
    /// The latency of the create that succeeded.
    took: Duration,
}

/// Create `pod` as a workload controller does (the ReplicaSet and StatefulSet controllers
/// requeue a failed create with exponential backoff): retry a refusal after 100 ms, doubling
/// up to 5 s. With a kube-controller-manager in the test control plane, a ReplicaSet would
/// make these calls instead; the checks after it would stay as they are.
async fn create_like_a_controller(pods: &Api<Pod>, pod: &Pod) -> Outcome {
    let mut outcome = Outcome::default();
    let mut backoff = Duration::from_millis(100);
    let started = Instant::now();
    loop {
        let attempt = Instant::now();
        match pods.create(&PostParams::default(), pod).await {
            Ok(_) => {
                outcome.took = attempt.elapsed();
                return outcome;
            }
            // Created by an attempt whose answer was lost: done.
            Err(kube::Error::Api(status)) if status.is_already_exists() => return outcome,
            Err(kube::Error::Api(status)) => outcome.refusals.push(status.message),
            Err(e) => outcome.refusals.push(e.to_string()),
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{:?} still refused after 2 minutes of retries: {:?}",
            pod.metadata.name,
            outcome.refusals
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Create workers `range` in waves of [`WAVE`] every [`WAVE_EVERY`] (or when the previous wave
/// is done, if later); `signal` says when wave `n` has been sent.
async fn burst(
    pods: &Api<Pod>,
    range: std::ops::Range<usize>,
    mut signal: Option<(usize, tokio::sync::oneshot::Sender<()>)>,
) -> Vec<(usize, Outcome)> {
    let indexes: Vec<usize> = range.collect();
    let mut outcomes = Vec::new();
    for (n, wave) in indexes.chunks(WAVE).enumerate() {
        let started = Instant::now();
        let creations = wave.iter().map(|&index| {
            let pods = pods.clone();
            tokio::spawn(
                async move { (index, create_like_a_controller(&pods, &worker(index)).await) },
            )
        });
        let creations: Vec<_> = creations.collect();
        if signal.as_ref().is_some_and(|(at, _)| *at == n) {
            let _ = signal.take().unwrap().1.send(());
        }
        for creation in creations {
            outcomes.push(creation.await.unwrap());
        }
        tokio::time::sleep(WAVE_EVERY.saturating_sub(started.elapsed())).await;
    }
    outcomes
}

/// Print the burst's figures: admissions, refused, retried, latency p50/p99.
fn report(what: &str, outcomes: &[(usize, Outcome)]) -> usize {
    let refused: usize = outcomes.iter().map(|(_, o)| o.refusals.len()).sum();
    let retried = outcomes
        .iter()
        .filter(|(_, o)| !o.refusals.is_empty())
        .count();
    let mut times: Vec<Duration> = outcomes.iter().map(|(_, o)| o.took).collect();
    times.sort();
    let q = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    eprintln!(
        "webhook HA, {what}: {} pods, {} admitted, {refused} refused, {retried} created on a retry; \
         create latency p50 {:?}, p99 {:?}",
        outcomes.len(),
        outcomes.len(),
        q(0.5),
        q(0.99)
    );
    refused
}

/// Every pod in `apps` carries exactly its own port (the record's value for its index), and
/// no two carry the same one.
async fn assert_every_pod_has_its_ports(client: &Client, expected: usize) {
    let allocation = Api::<PortAllocation>::namespaced(client.clone(), "apps")
        .get("w")
        .await
        .unwrap();
    let values = allocation
        .status
        .unwrap()
        .assignments
        .into_iter()
        .find(|a| a.role == "worker" && a.port == "rpc")
        .unwrap()
        .values;
    let pods = Api::<Pod>::namespaced(client.clone(), "apps")
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(pods.items.len(), expected);
    let mut seen = std::collections::BTreeSet::new();
    for pod in pods.items {
        let name = pod.metadata.name.clone().unwrap();
        let index: usize = name.trim_start_matches("worker-").parse().unwrap();
        let env: BTreeMap<String, String> = pod.spec.unwrap().containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        let port = env.get("RPC_PORT").cloned();
        assert_eq!(
            port,
            Some(values[index].to_string()),
            "{name} admitted without its port"
        );
        assert!(seen.insert(values[index]), "{name}: a port given twice");
    }
}

/// The resourceVersions of the CA Secret and of the configuration.
async fn versions(client: &Client) -> (Option<String>, Option<String>) {
    let secret = Api::<Secret>::namespaced(client.clone(), SYSTEM)
        .get("portalloc-webhook-ca")
        .await
        .unwrap();
    let configuration = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("portalloc")
        .await
        .unwrap();
    (
        secret.metadata.resource_version,
        configuration.metadata.resource_version,
    )
}

/// The CA the configuration trusts, and the CA in the Secret.
async fn cas(client: &Client) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let configuration = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt("portalloc")
        .await
        .unwrap();
    let trusted = configuration
        .and_then(|c| c.webhooks?.into_iter().next()?.client_config.ca_bundle)
        .map(|b| b.0);
    let secret = Api::<Secret>::namespaced(client.clone(), SYSTEM)
        .get_opt("portalloc-webhook-ca")
        .await
        .unwrap();
    let ca = secret
        .and_then(|s| s.data?.get("ca.crt").cloned())
        .map(|b| b.0);
    (trusted, ca)
}

#[tokio::test]
async fn two_replicas_survive_rolling_restarts_and_a_kill_without_refusing_or_skipping_a_pod() {
    let Some(ip) = routable_address() else {
        eprintln!(
            "webhook HA: skipped, this machine has no IPv4 address but loopback (EndpointSlices \
             refuse loopback addresses)"
        );
        return;
    };
    let Some(cluster) =
        PrivateCluster::start_with("webhook-ha", true, &["--enable-aggregator-routing"])
    else {
        return;
    };
    let client = cluster.client().await;
    assert!(
        cluster
            .run(&["pool", "create", "gpu", "--range", "40000-40999"])
            .ok()
    );
    for ns in ["apps", "quiet", SYSTEM] {
        support::create_namespace(&client, ns).await;
    }
    // The replicas run as the ServiceAccount deploy/ ships, behind its Service.
    for file in ["deploy/watcher.yaml", "deploy/webhook.yaml"] {
        let yaml = std::fs::read_to_string(support::repo_root().join(file)).unwrap();
        apply_yaml(&client, &yaml, None).await;
    }
    // The replicas watch the empty namespace `quiet`: the chart with watchNamespace=quiet would
    // grant its Lease, portalloc-watcher-quiet.
    let chart_lease_role = yaml_of_leader_role("quiet");
    apply_yaml(&client, &chart_lease_role, None).await;
    let dir = tempfile::tempdir().unwrap();
    let account = dir.path().join("watcher");
    watcher_kubeconfig(&client, &cluster.kubeconfig, &account).await;
    let allocation: PortAllocation = serde_yaml::from_str(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata: {name: w, namespace: apps}\n\
         spec:\n  pool: gpu\n  roles:\n  - name: worker\n    replicas: 220\n    ports: [{name: rpc, env: RPC_PORT}]\n",
    )
    .unwrap();
    Api::<PortAllocation>::namespaced(client.clone(), "apps")
        .create(&PostParams::default(), &allocation)
        .await
        .unwrap();
    assert!(cluster.run(&["sync", "w", "-n", "apps"]).ok());

    let endpoints = Endpoints::new(client.clone(), ip, SYSTEM, SERVICE, "webhook");
    let mut replicas = Vec::new();
    for name in ["a", "b"] {
        let replica = Replica::start(name, ip, &account);
        endpoints.add(&replica.name, replica.port(), replica.probes());
        replicas.push(replica);
    }
    for name in ["a", "b"] {
        endpoints.wait_ready(name).await;
    }
    // One leads, the other stands by; both are ready, and both answer admissions (checked
    // below, as each is stopped).
    let started = Instant::now();
    while replicas.iter().filter(|r| r.leading()).count() != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not exactly one leader"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    // One pod first: the configuration and the route work at all.
    let first = create_like_a_controller(&pods, &worker(0)).await;
    assert!(first.refusals.is_empty(), "{:?}", first.refusals);
    let before = versions(&client).await;

    // Scenario A: a rolling restart of both during a burst of 100.
    let creations = tokio::spawn({
        let pods = pods.clone();
        async move { burst(&pods, 1..BURST + 1, None).await }
    });
    // A restart is worth something only once the burst reaches the replicas: 10 pods admitted
    // and, if the API server spreads them so, each replica called, however busy the machine.
    // It picks a replica per connection it dials and keeps connections open, so one replica
    // may see every pod: after 30 admitted the restart goes ahead regardless (a CI run saw
    // all 100 go to one replica).
    let burst_began = Instant::now();
    loop {
        let admitted = pods.list(&Default::default()).await.unwrap().items.len() - 1;
        let uncalled = replicas.iter().filter(|r| r.admissions() == 0).count();
        if admitted >= 30 || (admitted >= 10 && uncalled == 0) {
            break;
        }
        assert!(
            burst_began.elapsed() < Duration::from_secs(60),
            "60 s into the burst: {admitted} pods admitted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The busier replica first: it has the API server's connections when it is stopped.
    let order = if replicas[1].admissions() > replicas[0].admissions() {
        [("b", "b2"), ("a", "a2")]
    } else {
        [("a", "a2"), ("b", "b2")]
    };
    let mut stopped = Vec::new();
    for (turn, (old, new)) in order.into_iter().enumerate() {
        let position = replicas.iter().position(|r| r.name == old).unwrap();
        let replica = replicas.remove(position);
        let since = Instant::now();
        replica.terminate();
        // The old pod drains on its own while its replacement starts.
        let draining = std::thread::spawn(move || replica.wait(since));
        let replacement = Replica::start(new, ip, &account);
        endpoints.add(&replacement.name, replacement.port(), replacement.probes());
        replicas.push(replacement);
        endpoints.wait_ready(new).await;
        let (code, took, log) = tokio::task::spawn_blocking(move || draining.join().unwrap())
            .await
            .unwrap();
        endpoints.remove(old).await;
        assert_eq!(code, Some(0), "replica {old} after SIGTERM:\n{log}");
        assert!(
            log.contains("webhook: answering for 5s more") && log.contains("webhook stopped ("),
            "replica {old} did not drain:\n{log}"
        );
        // The first restart is worth something only if that replica had traffic; whether the
        // API server dialed the second before it is stopped, and how much came after SIGTERM
        // (while the endpoints caught up), are figures, not promises.
        let (life, drain) = log.split_once("shutting down").unwrap_or((&log, ""));
        let (before, after) = (
            life.matches("admission pod=").count(),
            drain.matches("admission pod=").count(),
        );
        assert!(
            turn > 0 || before + after > 0,
            "replica {old}, stopped first, was never called:\n{log}"
        );
        stopped.push(format!(
            "{old} exited {took:.1?} after SIGTERM, having answered {before} admissions before \
             it and {after} after"
        ));
    }
    let outcomes = creations.await.unwrap();
    let refused = report("rolling restart of 2 replicas", &outcomes);
    eprintln!("webhook HA: {}", stopped.join("; "));
    assert_eq!(
        refused,
        0,
        "refused during the rolling restart: {:?}",
        outcomes
            .iter()
            .flat_map(|(_, o)| o.refusals.iter())
            .collect::<Vec<_>>()
    );
    assert_every_pod_has_its_ports(&client, BURST + 1).await;
    // Four replicas started in all, none rewrote the CA Secret or the configuration.
    assert_eq!(versions(&client).await, before, "the replicas rewrote them");

    // Scenario B: one replica killed -9 in a second burst.
    let (sent, wave_sent) = tokio::sync::oneshot::channel();
    let creations = tokio::spawn({
        let pods = pods.clone();
        async move { burst(&pods, BURST + 1..2 * BURST + 1, Some((6, sent))).await }
    });
    // The busier replica (the API server reuses some connections more than others) is killed
    // while the seventh wave's reviews are in flight.
    wave_sent.await.unwrap();
    tokio::time::sleep(Duration::from_millis(15)).await;
    let busier = (0..replicas.len())
        .max_by_key(|&i| replicas[i].admissions())
        .unwrap();
    let victim = replicas.remove(busier);
    let victim_name = victim.name.clone();
    victim.kill_9();
    // Its pod restarts as kubelet would restart the container, once the burst has seen it gone.
    tokio::time::sleep(Duration::from_secs(4)).await;
    endpoints.remove(&victim_name).await;
    let restarted = Replica::start("a3", ip, &account);
    endpoints.add(&restarted.name, restarted.port(), restarted.probes());
    replicas.push(restarted);
    let outcomes = creations.await.unwrap();
    report("one of 2 replicas killed -9", &outcomes);
    for (index, outcome) in &outcomes {
        for refusal in &outcome.refusals {
            assert!(
                refusal.contains("failed calling webhook"),
                "worker-{index} refused for another reason than the killed replica: {refusal}"
            );
        }
    }
    assert_every_pod_has_its_ports(&client, 2 * BURST + 1).await;

    // A caBundle gone stale (an apply tool that wrote one, a hand edit): a replica puts the
    // Secret's CA back within its check period.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let stale = serde_json::json!({"webhooks": [{
        "name": "pods.portalloc.dev",
        "clientConfig": {"caBundle": "bm90IGEgQ0E="},
    }]});
    configurations
        .patch(
            "portalloc",
            &PatchParams::default(),
            &Patch::Strategic(stale),
        )
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let (trusted, ca) = cas(&client).await;
        if trusted.is_some() && trusted == ca {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the stale caBundle was not repaired"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "webhook HA: a stale caBundle was repaired after {:.1?}",
        started.elapsed()
    );

    // The CA Secret replaced (a rotation): both replicas serve certificates of the new CA and
    // the configuration trusts it; they agree, so nothing flaps back.
    let (_, old_ca) = cas(&client).await;
    Api::<Secret>::namespaced(client.clone(), SYSTEM)
        .delete("portalloc-webhook-ca", &DeleteParams::default())
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let (trusted, ca) = cas(&client).await;
        if ca.is_some() && ca != old_ca && trusted == ca {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no new CA trusted after the Secret was deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "webhook HA: a new CA in the Secret and in the caBundle {:.1?} after the Secret's deletion",
        started.elapsed()
    );
    // Both replicas have swapped by their next check; then every pod is admitted, whichever
    // replica the API server picks.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let (trusted, _) = cas(&client).await;
    let mut rotated = Vec::new();
    for index in 2 * BURST + 1..2 * BURST + 11 {
        rotated.push(create_like_a_controller(&pods, &worker(index)).await);
    }
    let refusals: Vec<_> = rotated.iter().flat_map(|o| o.refusals.iter()).collect();
    assert!(refusals.is_empty(), "after the CA rotation: {refusals:?}");
    assert_eq!(cas(&client).await.0, trusted, "the caBundle flapped");
    assert_every_pod_has_its_ports(&client, 2 * BURST + 11).await;

    // The configuration deleted (an uninstall deletes it first): replicas still running leave it
    // deleted through their next check, so no labelled pod is refused for want of a webhook.
    configurations
        .delete("portalloc", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(CHECK_EVERY + Duration::from_secs(1)).await;
    assert!(
        configurations.get_opt("portalloc").await.unwrap().is_none(),
        "a running replica created the deleted configuration again"
    );
}

//! The node simulation: each example applied to the real API server as its header says, then
//! every pod it describes run on this machine at once, as on one node with hostNetwork, with the
//! example's own command lines and the env files the plugin wrote; the engines replaced by a
//! stand-in (tests/simulation/standin.py) that binds every port its flags name and connects to
//! every address they name. Then a role (or the LWS group count) is scaled with one edit,
//! `kubectl apply` and `kubectl portalloc sync`, and everything runs again.

mod expand;
mod guarded;
pub mod netns;
pub mod pods;
pub mod run;
mod scenarios;
mod selftest;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use serde_json::Value;

use crate::support::{self, cli};
use pods::Manifest;
pub use run::Outcome;

/// One simulation at a time: they all bind ports of the same ranges on this machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The pools' range in the simulation. The examples' 20000-23999 is where this machine's test
/// control planes (every agent's) listen, on random ports the pool cannot know of; on a real
/// node that is what `exclude` is for. Above the ephemeral range nothing else listens.
const SIM_RANGE: &str = "61000-64999";

/// How long a stand-in keeps trying to reach a peer, and the harness waits for all to serve.
const TIMEOUT: Duration = Duration::from_secs(30);

/// LeaderWorkerSet's own CRD (from its pinned Go module, `scripts/fetch-lws-crd.sh`), so the
/// examples' LeaderWorkerSets pass LWS's real schema (no LWS controller runs: nothing here runs
/// pods anyway).
fn lws_crd() -> std::path::PathBuf {
    let output = Command::new(support::repo_root().join("scripts/fetch-lws-crd.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/fetch-lws-crd.sh");
    assert!(output.status.success(), "scripts/fetch-lws-crd.sh failed");
    String::from_utf8(output.stdout).unwrap().trim().into()
}

/// `kubectl` against the test cluster.
fn kubectl(args: &[&str], input: Option<&str>) -> cli::Run {
    kubectl_on(&support::cluster().kubeconfig, args, input)
}

/// `kubectl` (built from the pinned Kubernetes module, `support::tools`) against the cluster
/// of `kubeconfig`.
pub fn kubectl_on(kubeconfig: &std::path::Path, args: &[&str], input: Option<&str>) -> cli::Run {
    let mut child = Command::new(support::tools::kubectl())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    if let Some(input) = input {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    cli::Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The pod webhook as a process (`sync --watch` of an empty namespace, so only admission
/// syncs), registered by URL; returned once the API server's configuration points at it.
async fn start_webhook(client: &Client, ns: &str) -> std::process::Child {
    start_webhook_on(&support::cluster().kubeconfig, client, ns).await
}

/// The same on the cluster of `kubeconfig` (`client` is a client of it); see
/// `support::webhook`.
pub async fn start_webhook_on(
    kubeconfig: &std::path::Path,
    client: &Client,
    ns: &str,
) -> std::process::Child {
    support::webhook::start_webhook(kubeconfig, client, ns)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// One example, deployed in its own namespace with its pool renamed (pools are cluster-wide).
pub struct Scenario {
    /// The example's file name.
    pub example: String,
    client: Client,
    ns: String,
    allocation: String,
    file: PathBuf,
    pub manifest: Manifest,
    configmap: BTreeMap<String, String>,
    /// The ConfigMap's data before the last scaling.
    previous: BTreeMap<String, String>,
    /// With the pod webhook: the process, and each pod's spec as admitted.
    webhook: Option<std::process::Child>,
    admitted: BTreeMap<String, Value>,
    /// Each admitted pod as the API server returned it (its UID, its QoS class).
    created: BTreeMap<String, k8s_openapi::api::core::v1::Pod>,
    /// The node each pod is created on (`spec.nodeName`); None: no node, as a template.
    placement: Option<fn(&pods::Pod) -> String>,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if let Some(mut webhook) = self.webhook.take() {
            let _ = webhook.kill();
            let _ = webhook.wait();
            kubectl(
                &[
                    "delete",
                    "mutatingwebhookconfiguration",
                    "portalloc",
                    "--ignore-not-found",
                ],
                None,
            );
        }
    }
}

impl Scenario {
    /// `kubectl portalloc create -f`, then `kubectl apply -f` of the same file, as the example's
    /// header says; then the ConfigMap of env files, as the plugin wrote it.
    pub async fn deploy(example: &str, pool: &str) -> Scenario {
        let mut scenario = Scenario::prepare(example, pool).await;
        let file = scenario.file.to_str().unwrap().to_string();
        let run = cli::run(&["create", "-f", &file, "-n", &scenario.ns]);
        assert!(run.ok(), "{run}");
        let run = kubectl(&["apply", "-f", &file, "-n", &scenario.ns], None);
        assert!(run.ok(), "kubectl apply of the example: {run}");
        scenario.configmap = scenario.wait_for_configmap().await;
        scenario
    }

    /// `kubectl apply -f` alone, as its header says, with the pod webhook running (a process
    /// the API server calls): every pod the workloads would make is created as a Pod object,
    /// and runs with the env it was admitted with.
    pub async fn deploy_admitted(example: &str, pool: &str) -> Scenario {
        let mut scenario = Scenario::prepare(example, pool).await;
        scenario.apply_admitted().await;
        scenario
    }

    /// The second half of [`Scenario::deploy_admitted`], for a scenario whose manifest was
    /// edited after [`Scenario::prepare`]: the webhook, then `kubectl apply -f` of the example
    /// as it is now, then every pod created and admitted.
    async fn apply_admitted(&mut self) {
        self.webhook = Some(start_webhook(&self.client, &self.ns).await);
        std::fs::write(&self.file, self.manifest.to_yaml()).unwrap();
        let file = self.file.to_str().unwrap().to_string();
        let run = kubectl(&["apply", "-f", &file, "-n", &self.ns], None);
        assert!(run.ok(), "kubectl apply of the example: {run}");
        self.configmap = self.admit().await;
    }

    /// Create every pod (again) as the workload controllers would, and keep what was admitted;
    /// returns each pod's admitted env as the env file the ConfigMap form would give it
    /// (`<pod>.env`, a Deployment's pods `<deployment>.env`), so both forms are checked alike.
    async fn admit(&mut self) -> BTreeMap<String, String> {
        use k8s_openapi::api::core::v1::Pod;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        for pod in api.list(&Default::default()).await.unwrap() {
            let name = pod.metadata.name.unwrap();
            api.delete(&name, &Default::default()).await.unwrap();
        }
        self.admitted.clear();
        self.created.clear();
        let mut files = BTreeMap::new();
        for pod in pods::pods(&self.manifest, &self.ns) {
            // A Deployment's pods are named after admission (generateName).
            let identity = if pod.workload.starts_with("Deployment/") {
                let prefix = &pod.name[..=pod.name.rfind('-').unwrap()];
                serde_json::json!({"generateName": prefix})
            } else {
                serde_json::json!({"name": pod.name})
            };
            let mut metadata = identity;
            metadata["labels"] = serde_json::to_value(&pod.labels).unwrap();
            let mut spec = pod.spec.clone();
            if let Some(place) = self.placement {
                spec["nodeName"] = place(&pod).into();
            }
            let object: Pod = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
            }))
            .unwrap();
            let created = api
                .create(&Default::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("pod {} not admitted: {e}", pod.name));
            self.created.insert(pod.name.clone(), created.clone());
            let spec = created.spec.unwrap();
            let file = match pod.workload.strip_prefix("Deployment/") {
                Some(deployment) => format!("{deployment}.env"),
                None => format!("{}.env", pod.name),
            };
            let lines: String = spec.containers[0]
                .env
                .iter()
                .flatten()
                .map(|e| format!("{}={}\n", e.name, e.value.clone().unwrap_or_default()))
                .collect();
            files.insert(file, lines);
            self.admitted
                .insert(pod.name.clone(), serde_json::to_value(spec).unwrap());
        }
        files
    }

    async fn prepare(example: &str, pool: &str) -> Scenario {
        let turn = ONE_AT_A_TIME.lock().await;
        let client = support::client().await;
        let ns = support::namespace(&client, &format!("sim-{}", &example[..10])).await;
        let unique_pool = support::unique_name("sim");
        let path = support::repo_root().join("examples").join(example);
        let text = std::fs::read_to_string(path)
            .unwrap()
            .replace(
                &format!("name: {pool}\n"),
                &format!("name: {unique_pool}\n"),
            )
            .replace(
                &format!("pool: {pool}\n"),
                &format!("pool: {unique_pool}\n"),
            );
        let mut manifest = Manifest::parse(&text);
        for pool in manifest.docs.iter_mut().filter(|d| d["kind"] == "PortPool") {
            pool["spec"]["ranges"] = serde_json::json!([SIM_RANGE]);
            pool["spec"]["exclude"] = serde_json::json!([]);
        }
        let allocation = manifest
            .of_kind("PortAllocation")
            .next()
            .expect("a PortAllocation")["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        let file = std::env::temp_dir().join(format!("{ns}.yaml"));
        std::fs::write(&file, manifest.to_yaml()).unwrap();
        if manifest.of_kind("LeaderWorkerSet").next().is_some() {
            // Server-side: the CRD (1.3 MB) is too large for client-side apply's annotation.
            let crd = lws_crd();
            let run = kubectl(
                &["apply", "--server-side", "-f", crd.to_str().unwrap()],
                None,
            );
            assert!(run.ok(), "{run}");
            // `kubectl wait` fails outright while the new CRD has no conditions yet: poll.
            let started = Instant::now();
            loop {
                let run = kubectl(
                    &[
                        "wait",
                        "--for=condition=Established",
                        "--timeout=10s",
                        "crd/leaderworkersets.leaderworkerset.x-k8s.io",
                    ],
                    None,
                );
                if run.ok() {
                    break;
                }
                assert!(
                    started.elapsed() < TIMEOUT,
                    "LWS CRD not established: {run}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Scenario {
            example: example.to_string(),
            client,
            ns,
            allocation,
            file,
            manifest,
            configmap: BTreeMap::new(),
            previous: BTreeMap::new(),
            webhook: None,
            admitted: BTreeMap::new(),
            created: BTreeMap::new(),
            placement: None,
            _turn: turn,
        }
    }

    fn configmap_name(&self) -> String {
        let pa = self.manifest.of_kind("PortAllocation").next().unwrap();
        pa["spec"]["configMap"]["name"]
            .as_str()
            .expect("the example names its ConfigMap (spec.configMap.name)")
            .to_string()
    }

    /// The ConfigMap's data once it differs from what the last run used.
    async fn wait_for_configmap(&self) -> BTreeMap<String, String> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.ns);
        let name = self.configmap_name();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(cm) = api.get_opt(&name).await.unwrap() {
                let data = cm.data.unwrap_or_default();
                if data != self.configmap {
                    return data;
                }
            }
            assert!(
                Instant::now() < deadline,
                "ConfigMap {name} in {} never appeared or changed",
                self.ns
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Run every pod; print the env files and what the stand-ins did (`--nocapture` shows it).
    pub fn simulate(&self, label: &str) -> Outcome {
        let pods = pods::pods_admitted(&self.manifest, &self.ns, &self.admitted);
        self.simulate_pods(label, &pods, |pods, dns, configmaps| {
            run::run(pods, dns, configmaps, TIMEOUT)
        })
    }

    /// The same, each pod on the node it was created on (`nodes`: each node's network and
    /// address) and in its cgroup there (`cgroups`, by pod name).
    pub fn simulate_on(
        &self,
        label: &str,
        nodes: &netns::NodeNetworks,
        addresses: &BTreeMap<String, std::net::Ipv4Addr>,
        cgroups: &BTreeMap<String, PathBuf>,
    ) -> Outcome {
        let pods = pods::pods_placed(&self.manifest, &self.ns, &self.admitted, addresses);
        self.simulate_pods(label, &pods, |pods, dns, configmaps| {
            run::run_on_nodes_in_cgroups(pods, dns, configmaps, nodes, cgroups, TIMEOUT)
        })
    }

    fn simulate_pods(
        &self,
        label: &str,
        pods: &[pods::Pod],
        run: impl FnOnce(
            &[pods::Pod],
            &BTreeMap<String, BTreeSet<String>>,
            &BTreeMap<String, BTreeMap<String, String>>,
        ) -> Outcome,
    ) -> Outcome {
        let dns = pods::dns(&self.manifest, pods, &self.ns);
        // The webhook form mounts no ConfigMap: its env files stand for the admitted env.
        let configmaps = if self.webhook.is_some() {
            BTreeMap::new()
        } else {
            BTreeMap::from([(self.configmap_name(), self.configmap.clone())])
        };
        let outcome = run(pods, &dns, &configmaps);
        let mut files = String::new();
        for (key, text) in &self.configmap {
            files.push_str(&format!(
                "  {key}:\n    {}\n",
                text.trim_end().replace('\n', "\n    ")
            ));
        }
        eprintln!(
            "=== {label} (namespace {})\n--- env files\n{files}--- simulation\n{}",
            self.ns,
            outcome.summary()
        );
        outcome.assert_clean();
        outcome
    }

    /// The example's PortPool (renamed, with the simulation's range).
    fn pool_doc(&mut self) -> &mut Value {
        self.manifest
            .docs
            .iter_mut()
            .find(|d| d["kind"] == "PortPool")
            .expect("the example has a PortPool")
    }

    fn allocation_doc(&mut self) -> &mut Value {
        let name = self.allocation.clone();
        self.manifest
            .docs
            .iter_mut()
            .find(|d| d["kind"] == "PortAllocation" && d["metadata"]["name"] == name.as_str())
            .unwrap()
    }

    fn workload_doc(&mut self, kind: &str, name: &str) -> &mut Value {
        self.manifest
            .docs
            .iter_mut()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in the example"))
    }

    /// One edit: a role's replicas, in the PortAllocation and in its workload.
    pub async fn scale_role(&mut self, role: &str, replicas: u64) {
        let roles = self.allocation_doc()["spec"]["roles"]
            .as_array_mut()
            .unwrap();
        let entry = roles.iter_mut().find(|r| r["name"] == role).unwrap();
        entry["replicas"] = replicas.into();
        let workload = entry["workload"].clone();
        let (kind, name) = (
            workload["kind"].as_str().unwrap(),
            workload["name"].as_str().unwrap(),
        );
        self.workload_doc(kind, name)["spec"]["replicas"] = replicas.into();
        self.apply_and_sync().await;
    }

    /// One edit: the group count, in the PortAllocation and its LeaderWorkerSet.
    pub async fn scale_groups(&mut self, groups: u64) {
        let pa = self.allocation_doc();
        pa["spec"]["groups"] = groups.into();
        let names: BTreeSet<String> = pa["spec"]["roles"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["workload"]["kind"] == "LeaderWorkerSet")
            .map(|r| r["workload"]["name"].as_str().unwrap().to_string())
            .collect();
        for name in names {
            self.workload_doc("LeaderWorkerSet", &name)["spec"]["replicas"] = groups.into();
        }
        self.apply_and_sync().await;
    }

    /// `kubectl apply -f` of the edited file, `kubectl portalloc sync`, and the new ConfigMap.
    async fn apply_and_sync(&mut self) {
        std::fs::write(&self.file, self.manifest.to_yaml()).unwrap();
        let file = self.file.to_str().unwrap();
        let run = kubectl(&["apply", "-f", file, "-n", &self.ns], None);
        assert!(run.ok(), "kubectl apply: {run}");
        let now = if self.webhook.is_some() {
            // No sync: the pods' admission syncs the new spec.
            self.admit().await
        } else {
            let run = cli::run(&["sync", &self.allocation, "-n", &self.ns]);
            assert!(run.ok(), "{run}");
            self.wait_for_configmap().await
        };
        self.previous = std::mem::replace(&mut self.configmap, now);
    }

    /// Pods that were there before the last scaling kept their env files (their ports), except
    /// `changed`; the files of pods that went away are gone.
    pub fn assert_kept(&self, changed: &[&str]) {
        for (key, before) in self.previous.iter().filter(|(k, _)| k.ends_with(".env")) {
            let pod = key.trim_end_matches(".env");
            match self.configmap.get(key) {
                Some(now) if changed.contains(&pod) => {
                    assert_ne!(now, before, "{key} should follow the scaling")
                }
                Some(now) => assert_eq!(now, before, "{key} changed on scaling"),
                None => {}
            }
        }
    }

    /// The value of `key` in pod `pod`'s env file.
    pub fn env(&self, pod: &str, key: &str) -> String {
        let file = &self.configmap[&format!("{pod}.env")];
        let line = file
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key} not in {pod}.env:\n{file}"));
        line.trim_matches('\'').to_string()
    }
}

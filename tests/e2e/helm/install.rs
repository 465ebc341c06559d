//! The chart against a control plane of its own (its webhook configuration is cluster-wide and
//! fails closed for labelled pods): `helm template` (every option on, the node agent and the
//! CRDs included) and deploy/, alone and with its node-agent component, pass
//! `kubectl apply --dry-run=server`, the Prometheus Operator's own CRDs validating
//! the monitoring objects; then `helm install`, the watcher run as local processes from the
//! installed Deployment's container (its args and env, plus a ServiceAccount token's
//! kubeconfig, as a kubelet would; no kubelet runs pods here) until a PortAllocation is Ready,
//! two replicas sharing one CA and one configuration, `helm upgrade` of two values seen in the
//! cluster and in the restarted watcher, and `helm uninstall` leaving the CRDs, the
//! PortAllocations and nothing that fails closed. Prints helm install -> first Ready.

mod dry_runs;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::Client;
use kube::api::{Api, PostParams};
use portalloc::api::PortAllocation;
use portalloc::ledger::node_report::NODE_AGENT_NAMESPACE;

use super::{NAMESPACE, RELEASE, chart, documents, helm, show};
use crate::support::cli::BIN;
use crate::support::ports::free_port;
use crate::support::private_cluster::{PrivateCluster, client_from};
use crate::support::probe_http;
use crate::support::service_account::service_account_kubeconfig;
use crate::support::{self, tools};

use dry_runs::dry_runs;

fn kubectl(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    Command::new(tools::kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(support::repo_root())
        .output()
        .unwrap()
}

fn helm_on(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--kubeconfig", kubeconfig.to_str().unwrap()]);
    helm(&all)
}

/// A watcher replica: the installed Deployment's container run as a local process.
struct Replica {
    child: Child,
    probes: u16,
    log: PathBuf,
}

impl Replica {
    /// The container of `deployment` as a kubelet would start it: its args, its env (the
    /// downward API's namespace resolved), the ServiceAccount's token as the kubeconfig.
    /// `ports` replaces the probe and webhook ports, as a second pod's own network would allow
    /// the same ones.
    fn start(
        deployment: &Deployment,
        kubeconfig: &Path,
        ports: Option<(u16, u16)>,
        dir: &Path,
        name: &str,
    ) -> Replica {
        let pod = deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        let container = &pod.containers[0];
        let mut args = container.args.clone().unwrap();
        let port_of = |args: &[String], flag: &str| -> Option<u16> {
            let at = args.iter().position(|a| a == flag)?;
            args[at + 1].rsplit(':').next()?.parse().ok()
        };
        if let Some((probes, webhook)) = ports {
            for (flag, port) in [("--probe-address", probes), ("--webhook-address", webhook)] {
                if let Some(at) = args.iter().position(|a| a == flag) {
                    args[at + 1] = format!("0.0.0.0:{port}");
                }
            }
        }
        let probes = port_of(&args, "--probe-address").expect("a --probe-address");
        let mut command = Command::new(BIN);
        command.args(&args).arg("--kubeconfig").arg(kubeconfig);
        command.env_clear().env("NO_COLOR", "1");
        let namespace = deployment.metadata.namespace.clone().unwrap();
        for env in container.env.clone().unwrap_or_default() {
            let value = match (env.value, env.value_from) {
                (Some(value), _) => value,
                (None, Some(from)) => {
                    let path = from.field_ref.expect("only fieldRef env").field_path;
                    match path.as_str() {
                        "metadata.namespace" => namespace.clone(),
                        // The replica's pod name.
                        "metadata.name" => name.to_string(),
                        other => panic!("env {}: fieldRef {other}", env.name),
                    }
                }
                _ => String::new(),
            };
            command.env(env.name, value);
        }
        let log = dir.join(format!("{name}.log"));
        let child = command
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("start the watcher");
        let replica = Replica { child, probes, log };
        replica.wait_ready();
        replica
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        while probe_http::status(self.probes, "/readyz") != Some(200) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the watcher from the chart's args never got ready:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn deployment(client: &Client) -> Deployment {
    Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get("portalloc-watcher")
        .await
        .expect("the chart's Deployment")
}

fn args_of(deployment: &Deployment) -> Vec<String> {
    deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap()
}

fn allocation(name: &str, namespace: &str) -> PortAllocation {
    serde_yaml::from_str(&format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  pool: gpu\n  roles:\n  - name: worker\n    replicas: 2\n    ports: [{{name: rpc, env: RPC_PORT}}]\n"
    ))
    .unwrap()
}

fn is_ready(pa: &PortAllocation) -> bool {
    pa.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Create `name` in `namespace` as GitOps would (nobody syncs it but the watcher) and wait
/// until it is Ready.
async fn apply_and_wait_ready(client: &Client, name: &str, namespace: &str, replica: &Replica) {
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &allocation(name, namespace))
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        if is_ready(&api.get(name).await.unwrap()) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{namespace}/{name} never got Ready; the watcher logged:\n{}",
            replica.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The configuration once a watcher has filled its caBundle.
async fn registered(client: &Client) -> MutatingWebhookConfiguration {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let started = Instant::now();
    loop {
        if let Some(configuration) = api.get_opt("portalloc").await.unwrap() {
            let ca = configuration.webhooks.as_ref().unwrap()[0]
                .client_config
                .ca_bundle
                .clone();
            if ca.is_some_and(|ca| !ca.0.is_empty()) {
                return configuration;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no caBundle in the configuration"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn can(client: &Client, verb: &str, resource: &str, namespace: &str) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(sub.to_string())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some("portalloc.dev".into()),
                resource: Some(resource.into()),
                subresource,
                verb: Some(verb.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}

#[tokio::test]
async fn helm_installs_upgrades_and_uninstalls_the_chart_and_its_watcher_serves() {
    let Some(cluster) = PrivateCluster::start("helm", false) else {
        return;
    };
    let admin = cluster.kubeconfig.clone();
    let client = cluster.client().await;
    let dir = tempfile::tempdir().unwrap();
    // A dry run needs the namespaces it does not create, the node agent's among them (the
    // chart renders it, but a dry run creates nothing for the objects after it).
    for ns in [NAMESPACE, NODE_AGENT_NAMESPACE, "apps", "other", "argocd"] {
        support::create_namespace(&client, ns).await;
    }
    dry_runs(&admin, dir.path());

    // helm install: the CRDs from the chart's crds/, then the rest. The ports are values, set
    // to free ones (the watcher runs on this shared machine, not in a pod).
    let (probes, webhook) = (free_port(), free_port());
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let (set_probes, set_webhook) = (
        format!("watcher.probePort={probes}"),
        format!("webhook.port={webhook}"),
    );
    let started = Instant::now();
    let output = helm_on(
        &admin,
        &[
            "install",
            RELEASE,
            chart,
            "--namespace",
            NAMESPACE,
            "--set",
            &set_probes,
            "--set",
            &set_webhook,
        ],
    );
    let installed = started.elapsed();
    assert!(output.status.success(), "helm install: {}", show(&output));
    assert!(
        show(&output).contains("STATUS: deployed"),
        "{}",
        show(&output)
    );

    let installed_deployment = deployment(&client).await;
    assert_eq!(
        installed_deployment.spec.as_ref().unwrap().replicas,
        Some(2)
    );
    let account = dir.path().join("watcher.kubeconfig");
    service_account_kubeconfig(&client, &admin, NAMESPACE, "portalloc-watcher", &account).await;
    let first = Replica::start(&installed_deployment, &account, None, dir.path(), "first");
    let ready_watcher = started.elapsed();
    assert!(
        cluster
            .run(&["pool", "create", "gpu", "--range", "30000-30999"])
            .ok()
    );
    let pool_created = started.elapsed();
    apply_and_wait_ready(&client, "first", "apps", &first).await;
    let first_ready = started.elapsed();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "helm: install -> first Ready PortAllocation {:.0} ms (at {:.0} ms helm install done, \
         {:.0} ms watcher ready, {:.0} ms pool created with the plugin, then the PortAllocation \
         created and Ready in {:.0} ms)",
        ms(first_ready),
        ms(installed),
        ms(ready_watcher),
        ms(pool_created),
        ms(first_ready - pool_created),
    );

    // The second replica, with ports of its own: one CA, and a configuration that stays as the
    // first wrote it (the same apply of the same content changes nothing).
    let configuration = registered(&client).await;
    let version = configuration.metadata.resource_version.clone();
    let second = Replica::start(
        &installed_deployment,
        &account,
        Some((free_port(), free_port())),
        dir.path(),
        "second",
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let ca = secrets
        .get("portalloc-webhook-ca")
        .await
        .unwrap()
        .data
        .unwrap()["ca.crt"]
        .clone();
    let configuration = registered(&client).await;
    let hook = &configuration.webhooks.as_ref().unwrap()[0];
    assert_eq!(hook.client_config.ca_bundle.as_ref(), Some(&ca));
    assert_eq!(
        configuration.metadata.resource_version, version,
        "the second replica rewrote the configuration"
    );
    for replica in [&first, &second] {
        assert!(
            replica.logs().contains("serving the pod webhook"),
            "{}",
            replica.logs()
        );
    }
    // The chart's configuration is the watcher's, caBundle aside: neither rewrites the other.
    let manifest = helm_on(&admin, &["get", "manifest", RELEASE, "-n", NAMESPACE]);
    assert!(manifest.status.success(), "{}", show(&manifest));
    let manifest = documents(&String::from_utf8(manifest.stdout).unwrap());
    let chart_configuration = manifest
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .expect("the configuration is in the release");
    let mut live = serde_json::to_value(hook).unwrap();
    live["clientConfig"]
        .as_object_mut()
        .unwrap()
        .remove("caBundle");
    // Fields the API server defaults, which neither the chart nor the watcher sets.
    for defaulted in ["matchPolicy", "namespaceSelector"] {
        live.as_object_mut().unwrap().remove(defaulted);
    }
    assert_eq!(live, chart_configuration["webhooks"][0]);
    drop(second);

    // helm upgrade: three replicas, one watched namespace. The caBundle the watcher wrote
    // stays: the chart never sets it.
    let output = helm_on(
        &admin,
        &[
            "upgrade",
            RELEASE,
            chart,
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--set",
            "replicas=3",
            "--set",
            "watchNamespace=apps",
        ],
    );
    assert!(output.status.success(), "helm upgrade: {}", show(&output));
    assert!(show(&output).contains("REVISION: 2"), "{}", show(&output));
    let upgraded = deployment(&client).await;
    assert_eq!(upgraded.spec.as_ref().unwrap().replicas, Some(3));
    let args = args_of(&upgraded);
    let at = args.iter().position(|a| a == "-n").expect("-n in the args");
    assert_eq!(args[at + 1], "apps", "{args:?}");
    assert!(!args.contains(&"-A".to_string()), "{args:?}");
    let configuration = registered(&client).await;
    assert_eq!(
        configuration.webhooks.as_ref().unwrap()[0]
            .client_config
            .ca_bundle
            .as_ref(),
        Some(&ca)
    );
    let role = Api::<Role>::namespaced(client.clone(), "apps")
        .get("portalloc-watcher")
        .await
        .expect("the Role of the watched namespace");
    assert!(role.rules.unwrap().iter().any(|r| {
        r.resources
            .as_ref()
            .is_some_and(|r| r.contains(&"portallocations".to_string()))
    }));
    drop(first);
    // The API server's authorizer sees RBAC changes through its informers, a moment later.
    let watcher = client_from(&account, None).await;
    let started = Instant::now();
    loop {
        let in_apps = can(&watcher, "update", "portallocations/status", "apps").await;
        let elsewhere = can(&watcher, "list", "portallocations", "other").await;
        if in_apps && !elsewhere {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "after the upgrade the watcher may not update status in apps, or may still list \
             PortAllocations in other namespaces"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The watcher restarted from the new args serves the watched namespace.
    let restarted = Replica::start(&upgraded, &account, None, dir.path(), "upgraded");
    apply_and_wait_ready(&client, "second", "apps", &restarted).await;
    assert!(
        restarted.logs().contains("namespace apps"),
        "{}",
        restarted.logs()
    );
    drop(restarted);

    // helm uninstall: the watcher and everything of the webhook go, the configuration first,
    // so no labelled pod is refused by a webhook nobody serves; the CRDs and the
    // PortAllocations (ports included) stay.
    let output = helm_on(&admin, &["uninstall", RELEASE, "--namespace", NAMESPACE]);
    assert!(output.status.success(), "helm uninstall: {}", show(&output));
    assert!(
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .get_opt("portalloc")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
            .get_opt("portalloc-watcher")
            .await
            .unwrap()
            .is_none()
    );
    for name in ["portalloc-watcher", "portalloc-webhook"] {
        assert!(
            Api::<ClusterRole>::all(client.clone())
                .get_opt(name)
                .await
                .unwrap()
                .is_none(),
            "ClusterRole {name} left behind"
        );
    }
    let allocations: Api<PortAllocation> = Api::namespaced(client.clone(), "apps");
    for name in ["first", "second"] {
        assert!(is_ready(&allocations.get(name).await.unwrap()), "{name}");
    }
    let output = helm_on(&admin, &["list", "--all-namespaces", "-q"]);
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).trim().is_empty(),
        "{}",
        show(&output)
    );
}

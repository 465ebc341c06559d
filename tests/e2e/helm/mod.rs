//! The Helm chart (charts/kubectl-portalloc) with real Helm, built from its Go module by
//! `scripts/build-helm.sh`: `helm lint --strict`, what `helm template` renders by default and
//! with each option, its schema refusing bad values, deploy/ being exactly the chart rendered
//! (`scripts/gen-deploy.sh`), deploy/ with its node-agent component being the chart with the
//! agent on, the chart's copies of the CRDs and the Argo CD checks being their sources, and the
//! chart's version being Cargo.toml's. `install` applies it to a control plane.

mod deploy;
mod install;
mod node_agent;

pub use deploy::deploy_with_node_agent;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::{repo_root, tools};

pub const CHART: &str = "charts/kubectl-portalloc";
pub const RELEASE: &str = "portalloc";
pub const NAMESPACE: &str = "portalloc-system";

pub fn chart() -> PathBuf {
    repo_root().join(CHART)
}

pub fn helm(args: &[&str]) -> Output {
    Command::new(tools::helm())
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("run helm {args:?}: {e}"))
}

pub fn show(output: &Output) -> String {
    tools::all_output(output)
}

/// `helm template` of the chart in `portalloc-system` with `--set` values, as text.
pub fn template_text(sets: &[&str], extra: &[&str]) -> String {
    let chart = chart();
    let mut args = vec![
        "template",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    args.extend(extra);
    let output = helm(&args);
    assert!(output.status.success(), "helm {args:?}: {}", show(&output));
    String::from_utf8(output.stdout).unwrap()
}

/// Every document of a multi-document YAML text, empty ones left out.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| <Value as serde::Deserialize>::deserialize(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .collect()
}

/// `helm template` with `--set` values, as objects.
pub fn template(sets: &[&str]) -> Vec<Value> {
    documents(&template_text(sets, &[]))
}

pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn get<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    find(objects, kind, name).unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn cargo_version() -> String {
    let cargo = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("a version in Cargo.toml")
        .to_string()
}

#[test]
fn helm_lint_strict_accepts_the_chart_with_every_option() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    for sets in [
        vec![],
        vec![
            "monitoring.serviceMonitor.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "argocd.healthChecks.enabled=true",
            "watchNamespace=apps",
            "createNamespace=true",
            "replicas=3",
            "nodeAgent.enabled=true",
            "nodeAgent.cgroupDriver=systemd",
        ],
        vec!["webhook.enabled=false", "replicas=1"],
    ] {
        let mut args = vec!["lint", "--strict", chart];
        for set in &sets {
            args.extend(["--set", set]);
        }
        let output = helm(&args);
        let text = show(&output);
        assert!(output.status.success(), "helm {args:?}: {text}");
        assert!(
            text.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{text}"
        );
    }
}

/// values.schema.json: a typo or a wrong type fails at install time, naming the value.
#[test]
fn the_schema_refuses_unknown_keys_and_wrong_types() {
    let chart = chart();
    for (set, says) in [
        ("replica=3", "replica"),
        ("replicas=two", "replicas"),
        ("watcher.resync=often", "resync"),
        ("watchNamespace=Not_A_Namespace", "watchNamespace"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("nodeAgent.cgroupDriver=v1", "cgroupDriver"),
        ("nodeAgent.metricsPort=70000", "metricsPort"),
    ] {
        let output = helm(&["template", RELEASE, chart.to_str().unwrap(), "--set", set]);
        let text = show(&output);
        assert!(!output.status.success(), "--set {set} was accepted");
        assert!(text.contains(says), "--set {set}: {text}");
    }
}

#[test]
fn the_chart_is_versioned_as_the_plugin() {
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    let version = cargo_version();
    assert_eq!(chart["version"].as_str(), Some(version.as_str()));
    assert_eq!(chart["appVersion"].as_str(), Some(version.as_str()));
    // The image it runs by default is that release's.
    let objects = template(&[]);
    let deployment = get(&objects, "Deployment", "portalloc-watcher");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("ghcr.io/portalloc/kubectl-portalloc:v{version}")
    );
}

/// Issue 29: the webhook fails closed, so one replica must always serve it.
#[test]
fn by_default_two_replicas_spread_over_nodes_with_a_disruption_budget_and_surge_rollouts() {
    let objects = template(&[]);
    let deployment = get(&objects, "Deployment", "portalloc-watcher");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 2);
    assert_eq!(spec["strategy"]["type"], "RollingUpdate");
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxSurge"], 1);
    let selector = &spec["selector"]["matchLabels"];
    let pod = &spec["template"]["spec"];
    let spread = pod["topologySpreadConstraints"].as_array().unwrap();
    assert_eq!(spread.len(), 1, "{spread:?}");
    assert_eq!(spread[0]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(spread[0]["maxSkew"], 1);
    assert_eq!(spread[0]["labelSelector"]["matchLabels"], *selector);
    assert_eq!(
        spread[0]["matchLabelKeys"],
        serde_json::json!(["pod-template-hash"])
    );
    let budget = get(&objects, "PodDisruptionBudget", "portalloc-watcher");
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert_eq!(budget["spec"]["selector"]["matchLabels"], *selector);
    assert_eq!(
        spec["template"]["metadata"]["labels"], *selector,
        "the pods carry the selector's labels"
    );

    // One replica: a budget of one would block every drain of its node, so there is none.
    let single = template(&["replicas=1"]);
    assert!(find(&single, "PodDisruptionBudget", "portalloc-watcher").is_none());
    // A constraint of the user's own keeps its fields; the chart adds the selector.
    let zones = template(&[
        "topologySpreadConstraints[0].maxSkew=2",
        "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
    ]);
    let spread = &get(&zones, "Deployment", "portalloc-watcher")["spec"]["template"]["spec"]["topologySpreadConstraints"]
        [0];
    assert_eq!(spread["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(spread["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(spread["maxSkew"], 2);
    assert_eq!(spread["labelSelector"]["matchLabels"], *selector);
}

/// Leader election: on by default, with the Lease rights and nothing more (a create cannot be
/// limited by name; get and update are, to the one Lease); off, neither flag nor Role.
#[test]
fn the_replicas_elect_one_worker_through_a_lease_with_exactly_its_rights() {
    let objects = template(&[]);
    let container = &get(&objects, "Deployment", "portalloc-watcher")["spec"]["template"]["spec"]["containers"]
        [0];
    assert!(strings(&container["args"]).contains(&"--leader-elect".to_string()));
    let env = container["env"].as_array().unwrap();
    let pod_name = env.iter().find(|e| e["name"] == "POD_NAME").unwrap();
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    let role = get(&objects, "Role", "portalloc-watcher-leader");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["portalloc-watcher"], "verbs": ["get", "update"]},
        ])
    );
    let binding = get(&objects, "RoleBinding", "portalloc-watcher-leader");
    assert_eq!(binding["metadata"]["namespace"], NAMESPACE);
    assert_eq!(binding["roleRef"]["name"], "portalloc-watcher-leader");
    assert_eq!(binding["subjects"][0]["name"], "portalloc-watcher");
    // No Lease right anywhere else.
    for object in &objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        if !["Role", "ClusterRole"].contains(&kind) || name == "portalloc-watcher-leader" {
            continue;
        }
        let rules = object["rules"].as_array().cloned().unwrap_or_default();
        assert!(
            !rules
                .iter()
                .any(|r| strings(&r["resources"]).contains(&"leases".to_string())),
            "{kind} {name} grants leases"
        );
    }

    let off = template(&["watcher.leaderElect=false"]);
    let args = strings(
        &get(&off, "Deployment", "portalloc-watcher")["spec"]["template"]["spec"]["containers"][0]
            ["args"],
    );
    assert!(!args.contains(&"--leader-elect".to_string()), "{args:?}");
    assert!(find(&off, "Role", "portalloc-watcher-leader").is_none());
    assert!(find(&off, "RoleBinding", "portalloc-watcher-leader").is_none());
}

#[test]
fn values_reach_the_watcher_container_and_its_rights() {
    let objects = template(&[
        "watchNamespace=apps",
        "watcher.resync=1m",
        "watcher.verbosity=2",
        "watcher.probePort=18080",
        "webhook.port=19443",
        "watcher.extraArgs={--request-timeout,30s}",
        "image.tag=dev",
        "nodeSelector.pool=system",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
    ]);
    let deployment = get(&objects, "Deployment", "portalloc-watcher");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        strings(&container["args"]),
        [
            "sync",
            "--watch",
            "-n",
            "apps",
            "--resync",
            "1m",
            "--concurrency",
            "4",
            "--leader-elect",
            "--probe-address",
            "0.0.0.0:18080",
            "--webhook-address",
            "0.0.0.0:19443",
            "-v",
            "2",
            "--request-timeout",
            "30s"
        ]
    );
    assert_eq!(
        container["image"],
        "ghcr.io/portalloc/kubectl-portalloc:dev"
    );
    assert_eq!(container["ports"][0]["containerPort"], 18080);
    assert_eq!(container["ports"][1]["containerPort"], 19443);
    assert_eq!(pod["nodeSelector"]["pool"], "system");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    // One watched namespace: PortAllocations and ConfigMaps there only; pools stay cluster-wide.
    let cluster_role = get(&objects, "ClusterRole", "portalloc-watcher");
    let resources = |role: &Value| -> Vec<String> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| strings(&r["resources"]))
            .collect()
    };
    assert_eq!(
        resources(cluster_role),
        ["portpools", "portpoolshards", "portpoolshards/status"]
    );
    let role = get(&objects, "Role", "portalloc-watcher");
    assert_eq!(role["metadata"]["namespace"], "apps");
    assert_eq!(
        resources(role),
        [
            "portallocations",
            "portallocations/status",
            "configmaps",
            "events"
        ]
    );
    let binding = get(&objects, "RoleBinding", "portalloc-watcher");
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    // The Lease of the watchers of that namespace, by name.
    let leader = get(&objects, "Role", "portalloc-watcher-leader");
    assert_eq!(
        strings(&leader["rules"][1]["resourceNames"]),
        ["portalloc-watcher-apps"]
    );

    // Every namespace (the default): one ClusterRole with all of it, as deploy/ has, and the
    // pools' status, whose usage summary only a watcher of every namespace keeps.
    let all = template(&[]);
    assert_eq!(
        resources(get(&all, "ClusterRole", "portalloc-watcher")),
        [
            "portallocations",
            "portallocations/status",
            "portpools",
            "portpools/status",
            "portpoolshards",
            "portpoolshards/status",
            "configmaps",
            "events",
            // Read only: the nodes each pool with spec.followNodes counts (status.nodes).
            "nodes"
        ]
    );
    assert!(find(&all, "Role", "portalloc-watcher").is_none());
    // Events through both APIs, create and patch only (the recorder never reads them).
    let events = get(&all, "ClusterRole", "portalloc-watcher")["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| strings(&r["resources"]) == ["events"])
        .unwrap();
    assert_eq!(strings(&events["apiGroups"]), ["", "events.k8s.io"]);
    assert_eq!(strings(&events["verbs"]), ["create", "patch"]);
    let args = strings(
        &get(&all, "Deployment", "portalloc-watcher")["spec"]["template"]["spec"]["containers"][0]
            ["args"],
    );
    assert!(args.contains(&"-A".to_string()), "{args:?}");
}

#[test]
fn without_the_webhook_nothing_of_it_is_rendered() {
    let objects = template(&["webhook.enabled=false"]);
    for (kind, name) in [
        ("Service", "portalloc-webhook"),
        ("Role", "portalloc-webhook"),
        ("ClusterRole", "portalloc-webhook"),
        ("MutatingWebhookConfiguration", "portalloc"),
    ] {
        assert!(find(&objects, kind, name).is_none(), "{kind} {name}");
    }
    let container = &get(&objects, "Deployment", "portalloc-watcher")["spec"]["template"]["spec"]["containers"]
        [0];
    let args = strings(&container["args"]);
    assert!(!args.iter().any(|a| a.starts_with("--webhook")), "{args:?}");
    assert_eq!(container["ports"].as_array().unwrap().len(), 1);
}

/// The options off by default render nothing until asked for.
#[test]
fn monitoring_and_argocd_objects_only_when_enabled() {
    let defaults = template(&[]);
    for kind in ["ServiceMonitor", "PrometheusRule", "ConfigMap", "Namespace"] {
        assert!(
            !defaults.iter().any(|o| o["kind"] == kind),
            "{kind} rendered by default"
        );
    }
    let objects = template(&[
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
        "monitoring.prometheusRule.enabled=true",
    ]);
    let monitor = get(&objects, "ServiceMonitor", "portalloc-watcher");
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    // It selects the metrics Service, not the webhook's.
    let service = get(&objects, "Service", "portalloc-watcher");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][key], value);
    }
    let webhook = get(&objects, "Service", "portalloc-webhook");
    assert!(webhook["metadata"]["labels"]["app.kubernetes.io/component"].is_null());
    let rule = get(&objects, "PrometheusRule", "portalloc");
    let summary = rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]
        .as_str()
        .unwrap();
    assert!(summary.contains("{{ $labels.pool }}"), "{summary}");
}

/// The checks the chart renders for Argo CD are integrations/argocd's, key for key.
#[test]
fn argocd_health_checks_are_those_of_integrations_argocd() {
    let objects = template(&[
        "argocd.healthChecks.enabled=true",
        "argocd.healthChecks.namespace=gitops",
    ]);
    let rendered = get(&objects, "ConfigMap", "portalloc-argocd-health");
    assert_eq!(rendered["metadata"]["namespace"], "gitops");
    let shipped: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("integrations/argocd/argocd-cm.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(rendered["data"], shipped["data"]);
    assert_eq!(rendered["data"].as_object().unwrap().len(), 2);
}

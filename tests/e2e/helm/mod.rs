//! The Helm chart (charts/kubectl-portalloc) with real Helm, built from its Go module by
//! `scripts/build-helm.sh`: `helm lint --strict`, what `helm template` renders by default and
//! with each option, its schema refusing bad values, deploy/ being exactly the chart rendered
//! (`scripts/gen-deploy.sh`), deploy/ with its node-agent component being the chart with the
//! agent on, the chart's copies of the CRDs and the Argo CD checks being their sources, and the
//! chart's version being Cargo.toml's. `install` applies it to a control plane.

mod install;

use std::path::{Path, PathBuf};
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

/// The node agent: nothing of it by default; on, a DaemonSet with exactly what docs/node-agent.md
/// says it needs on a node, and the rights it uses.
#[test]
fn the_node_agent_only_when_enabled_with_what_it_needs_on_the_node() {
    let defaults = template(&[]);
    assert!(!defaults.iter().any(|o| o["kind"] == "DaemonSet"));
    assert!(
        !defaults
            .iter()
            .any(|o| o["metadata"]["name"] == "portalloc-node-agent")
    );

    let objects = template(&["nodeAgent.enabled=true", "createNamespace=true"]);
    let daemonset = get(&objects, "DaemonSet", "portalloc-node-agent");
    let spec = &daemonset["spec"];
    assert_eq!(spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 1);
    assert_eq!(
        spec["template"]["metadata"]["labels"],
        spec["selector"]["matchLabels"]
    );
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 0);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(
        pod["tolerations"],
        serde_json::json!([{"operator": "Exists"}])
    );
    assert_eq!(pod["serviceAccountName"], "portalloc-node-agent");
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert!(security["privileged"].is_null(), "{security}");
    assert_eq!(
        strings(&security["capabilities"]["add"]),
        ["BPF", "NET_ADMIN", "SYS_ADMIN"]
    );
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(
        container["image"],
        get(&objects, "Deployment", "portalloc-watcher")["spec"]["template"]["spec"]["containers"]
            [0]["image"]
    );
    let args = strings(&container["args"]);
    assert_eq!(args[0], "node-agent");
    let flag = |name: &str| {
        let at = args.iter().position(|a| a == name);
        at.map(|at| args[at + 1].clone())
    };
    assert_eq!(flag("--metrics-address").as_deref(), Some("0.0.0.0:9464"));
    assert_eq!(flag("--cgroup-driver"), None, "auto: the agent finds it");
    let reserved = flag("--reserved-ports-file").expect("--reserved-ports-file");
    let env: Vec<(String, String)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let path = e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap();
            (e["name"].as_str().unwrap().to_string(), path.to_string())
        })
        .collect();
    assert!(
        env.contains(&("NODE_NAME".into(), "spec.nodeName".into())),
        "{env:?}"
    );
    assert!(
        env.contains(&("POD_NAMESPACE".into(), "metadata.namespace".into())),
        "{env:?}"
    );
    // Each host path, mounted as the agent is told to find it.
    let volumes = pod["volumes"].as_array().unwrap();
    let mounts = container["volumeMounts"].as_array().unwrap();
    let mount_of = |host: &str| -> (&Value, &Value) {
        let volume = volumes
            .iter()
            .find(|v| v["hostPath"]["path"] == host)
            .unwrap_or_else(|| panic!("no hostPath {host}"));
        let mount = mounts
            .iter()
            .find(|m| m["name"] == volume["name"])
            .unwrap_or_else(|| panic!("{host} not mounted"));
        (volume, mount)
    };
    let (cgroup, cgroup_mount) = mount_of("/sys/fs/cgroup");
    assert_eq!(cgroup_mount["readOnly"], true);
    assert_eq!(
        Some(cgroup_mount["mountPath"].as_str().unwrap()),
        flag("--cgroup-root").as_deref()
    );
    assert_eq!(cgroup["hostPath"]["type"], "Directory");
    let (state, state_mount) = mount_of("/run/kubectl-portalloc");
    assert_eq!(state["hostPath"]["type"], "DirectoryOrCreate");
    assert!(state_mount["readOnly"].is_null());
    assert_eq!(
        Some(state_mount["mountPath"].as_str().unwrap()),
        flag("--state-dir").as_deref()
    );
    let (file, file_mount) = mount_of("/proc/sys/net/ipv4/ip_local_reserved_ports");
    assert_eq!(file["hostPath"]["type"], "File");
    assert!(file_mount["readOnly"].is_null());
    assert_eq!(file_mount["mountPath"], reserved);
    // Its pods are admitted only at Pod Security's privileged level.
    let namespace = get(&objects, "Namespace", NAMESPACE);
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    let restricted = template(&["createNamespace=true"]);
    assert_eq!(
        get(&restricted, "Namespace", NAMESPACE)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );

    // Its rights: read pools, shards, PortAllocations by name and pods; Events; its Lease in
    // its own namespace only.
    let rules = |role: &Value| -> Vec<(String, String, Vec<String>)> {
        let mut all = Vec::new();
        for rule in role["rules"].as_array().unwrap() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    all.push((group.clone(), resource, strings(&rule["verbs"])));
                }
            }
        }
        all
    };
    let verbs = |list: &[&str]| list.iter().map(|v| v.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules(get(&objects, "ClusterRole", "portalloc-node-agent")),
        [
            ("".into(), "pods".into(), verbs(&["get", "list", "watch"])),
            (
                "portalloc.dev".into(),
                "portpools".into(),
                verbs(&["get", "list", "watch"])
            ),
            (
                "portalloc.dev".into(),
                "portallocations".into(),
                verbs(&["get"])
            ),
            (
                "portalloc.dev".into(),
                "portpoolshards".into(),
                verbs(&["get", "list"])
            ),
            ("".into(), "events".into(), verbs(&["create", "patch"])),
            (
                "events.k8s.io".into(),
                "events".into(),
                verbs(&["create", "patch"])
            ),
        ]
    );
    let role = get(&objects, "Role", "portalloc-node-agent");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        rules(role),
        [(
            "coordination.k8s.io".into(),
            "leases".into(),
            verbs(&["get", "create", "update"])
        )]
    );
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        let binding = get(&objects, kind, "portalloc-node-agent");
        assert_eq!(binding["subjects"][0]["name"], "portalloc-node-agent");
        assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    }

    // Values reach it.
    let objects = template(&[
        "nodeAgent.enabled=true",
        "nodeAgent.cgroupDriver=systemd",
        "nodeAgent.metricsPort=19464",
        "nodeAgent.nodeSelector.pool=gpu",
        "nodeAgent.priorityClassName=",
        "image.tag=dev",
    ]);
    let pod = &get(&objects, "DaemonSet", "portalloc-node-agent")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = strings(&container["args"]);
    let at = args.iter().position(|a| a == "--cgroup-driver").unwrap();
    assert_eq!(args[at + 1], "systemd");
    assert!(args.contains(&"0.0.0.0:19464".to_string()), "{args:?}");
    assert_eq!(container["ports"][0]["containerPort"], 19464);
    assert_eq!(
        container["image"],
        "ghcr.io/portalloc/kubectl-portalloc:dev"
    );
    assert_eq!(pod["nodeSelector"]["pool"], "gpu");
    assert!(pod["priorityClassName"].is_null());
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// deploy/ is `scripts/gen-deploy.sh`'s rendering of the chart, and the chart's copies of the
/// CRDs and the Argo CD checks are their sources: regenerated here and compared byte for byte.
#[test]
fn deploy_and_the_charts_copies_are_generated_from_their_sources() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(repo_root().join("scripts/gen-deploy.sh"))
        .args(["--out", out.path().to_str().unwrap()])
        .env("HELM", tools::helm())
        .output()
        .unwrap();
    assert!(output.status.success(), "gen-deploy.sh: {}", show(&output));
    let generated = files_under(out.path());
    let names: Vec<String> = generated
        .iter()
        .map(|p| p.strip_prefix(out.path()).unwrap().display().to_string())
        .collect();
    for expected in [
        "deploy/watcher.yaml",
        "deploy/webhook.yaml",
        "deploy/webhook-configuration.yaml",
        "deploy/monitoring.yaml",
        "deploy/node-agent/node-agent.yaml",
        "charts/kubectl-portalloc/crds/portalloc-crds.yaml",
        "charts/kubectl-portalloc/files/argocd/PortAllocation.lua",
        "charts/kubectl-portalloc/files/argocd/PortPool.lua",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    for (path, name) in generated.iter().zip(&names) {
        let want = std::fs::read_to_string(path).unwrap();
        let have = std::fs::read_to_string(repo_root().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}; run scripts/gen-deploy.sh"));
        if let Some((line, (a, b))) = have
            .lines()
            .zip(want.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
        {
            panic!(
                "{name} differs from the chart at line {}: has\n  {a}\nwhere the chart renders\n  {b}\nrun scripts/gen-deploy.sh",
                line + 1
            );
        }
        assert_eq!(
            have.lines().count(),
            want.lines().count(),
            "{name} has a different length than the chart renders: run scripts/gen-deploy.sh"
        );
    }
}

/// deploy/ as `kubectl apply -k deploy` reads it: the watcher, its webhook and the webhook's
/// configuration, with two replicas, the budget and surge rollouts.
#[test]
fn kustomize_of_deploy_has_the_watcher_with_its_webhook() {
    let output = Command::new(tools::kubectl())
        .args(["kustomize", "deploy"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let objects = documents(&String::from_utf8(output.stdout).unwrap());
    let deployment = get(&objects, "Deployment", "portalloc-watcher");
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    get(&objects, "PodDisruptionBudget", "portalloc-watcher");
    get(&objects, "MutatingWebhookConfiguration", "portalloc");
    get(&objects, "Service", "portalloc-webhook");
    get(&objects, "Namespace", NAMESPACE);
    assert!(!objects.iter().any(|o| o["kind"] == "ServiceMonitor"));
    // The node agent is a component of its own, not in deploy/.
    assert!(!objects.iter().any(|o| o["kind"] == "DaemonSet"));
}

/// A kustomization of `dir` with deploy/ as its resource and deploy/node-agent as its
/// component, as docs/node-agent.md tells users to write it (kustomize wants relative paths).
pub fn deploy_with_node_agent(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut up = PathBuf::new();
    for _ in dir.components().skip(1) {
        up.push("..");
    }
    let repo = up.join(repo_root().strip_prefix("/").unwrap());
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {}\ncomponents:\n- {}\n",
        repo.join("deploy").display(),
        repo.join("deploy/node-agent").display()
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).unwrap();
    dir.to_path_buf()
}

/// deploy/ with `components: [node-agent]` is the chart with the agent on, object for object:
/// the agent's DaemonSet and RBAC, and the namespace at Pod Security's privileged level.
#[test]
fn deploy_with_the_node_agent_component_is_the_chart_with_the_agent_on() {
    let dir = tempfile::tempdir().unwrap();
    let overlay = deploy_with_node_agent(dir.path());
    let output = Command::new(tools::kubectl())
        .arg("kustomize")
        .arg(&overlay)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let key = |o: &Value| {
        format!(
            "{}/{}/{}",
            o["kind"].as_str().unwrap(),
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap()
        )
    };
    let sorted = |mut objects: Vec<Value>| {
        objects.sort_by_key(key);
        objects
    };
    let built = sorted(documents(&String::from_utf8(output.stdout).unwrap()));
    let rendered = sorted(template(&[
        "createNamespace=true",
        "nodeAgent.enabled=true",
    ]));
    assert_eq!(
        built.iter().map(key).collect::<Vec<_>>(),
        rendered.iter().map(key).collect::<Vec<_>>()
    );
    for (built, rendered) in built.iter().zip(&rendered) {
        assert_eq!(built, rendered, "{}", key(built));
    }
    get(&built, "DaemonSet", "portalloc-node-agent");
}

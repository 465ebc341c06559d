//! deploy/ and the chart's copies of the CRDs and the Argo CD checks, regenerated from their
//! sources and compared; deploy/ with its node-agent component against the chart with the
//! agent on.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::{NAMESPACE, documents, get, show, template};
use crate::support::{repo_root, tools};

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

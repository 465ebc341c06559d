//! The checked-in CRDs, applied by the real kubectl as the README and GitOps tools do, serve the
//! same schema that `kubectl portalloc install` applies, and the two never conflict.

use std::path::Path;
use std::process::{Command, Output};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::Api;
use portalloc::api::crds;

use crate::support::private_cluster::PrivateCluster;
use crate::support::{self, cli, tools};

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = Command::new(tools::kubectl())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .current_dir(support::repo_root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn show(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The live CRDs' versions (schemas, printer columns, subresources) and names equal the types'.
async fn assert_live_schemas_are_the_types(cluster: &PrivateCluster, how: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(cluster.client().await);
    for want in crds() {
        let live = api.get(&want.name_any()).await.unwrap();
        assert_eq!(
            serde_json::to_value(&live.spec.versions).unwrap(),
            serde_json::to_value(&want.spec.versions).unwrap(),
            "{} as served after {how} differs from the Rust types",
            want.name_any()
        );
        // The API server fills in listKind (`<Kind>List`).
        let mut names = live.spec.names.clone();
        names.list_kind = None;
        assert_eq!(names, want.spec.names, "{}", want.name_any());
    }
}

fn pool_with_guard(name: &str, guard: &str) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata: {{name: {name}}}\n\
         spec:\n  ranges: [\"19000-19009\"]\n  guard: {guard}\n"
    )
}

#[tokio::test]
async fn kubectl_applies_the_checked_in_crds_as_install_does_and_never_conflicts_with_it() {
    let Some(cluster) = PrivateCluster::start("crds-kubectl", false) else {
        return;
    };
    let kubeconfig = cluster.kubeconfig.clone();

    // As the GitOps walkthrough says: plain `kubectl apply -f crds/`.
    let applied = kubectl(&kubeconfig, &["apply", "-f", "crds/"], None);
    assert!(applied.status.success(), "{}", show(&applied));
    let established = kubectl(
        &kubeconfig,
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout",
            "60s",
            "crd",
            "--all",
        ],
        None,
    );
    assert!(established.status.success(), "{}", show(&established));
    assert_live_schemas_are_the_types(&cluster, "kubectl apply -f crds/").await;

    // Every guard word is taken as written, unquoted, by a YAML 1.1 reader.
    for (i, guard) in ["Disabled", "Audit", "Enforce"].iter().enumerate() {
        let pool = pool_with_guard(&format!("guard-word-{i}"), guard);
        let created = kubectl(&kubeconfig, &["create", "-f", "-"], Some(&pool));
        assert!(
            created.status.success(),
            "guard: {guard}\n{}",
            show(&created)
        );
    }
    let off = kubectl(
        &kubeconfig,
        &["create", "-f", "-"],
        Some(&pool_with_guard("guard-off", "Off")),
    );
    assert!(
        !off.status.success(),
        "`guard: Off` is YAML 1.1's false: {}",
        show(&off)
    );

    // The plugin's install over kubectl's, then kubectl's server-side apply over the plugin's.
    let install = cluster.run(&["install", "--timeout", "60s"]);
    assert!(install.ok(), "{install}");
    assert_live_schemas_are_the_types(&cluster, "kubectl portalloc install").await;
    let server_side = kubectl(
        &kubeconfig,
        &["apply", "--server-side", "-f", "crds/portalloc-crds.yaml"],
        None,
    );
    assert!(
        server_side.status.success(),
        "kubectl apply --server-side after install: {}",
        show(&server_side)
    );
    let again = cluster.run(&["install", "--timeout", "60s"]);
    assert!(again.ok(), "{again}");
    assert_live_schemas_are_the_types(&cluster, "both").await;
    // The plugin reads what kubectl wrote.
    let get = cli::run_with(&kubeconfig, &["pool", "get", "guard-word-0", "-o", "yaml"]);
    assert!(get.ok() && get.stdout.contains("guard: Disabled"), "{get}");
}

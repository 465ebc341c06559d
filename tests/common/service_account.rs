//! Running as a ServiceAccount, as a pod does: a kubeconfig with a token from the TokenRequest
//! API (what the kubelet mounts), and the watcher's shipped ClusterRole less one rule, bound to
//! an account of its own.

use std::path::Path;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// Write to `out` a kubeconfig for ServiceAccount `namespace/name` (created if missing) of the
/// cluster behind `admin`.
pub async fn service_account_kubeconfig(
    client: &Client,
    admin: &Path,
    namespace: &str,
    name: &str,
    out: &Path,
) {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    if accounts.get_opt(name).await.unwrap().is_none() {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        accounts
            .create(&PostParams::default(), &account)
            .await
            .unwrap();
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    token_kubeconfig(admin, &token, namespace, out);
}

/// Write to `out` a kubeconfig of the cluster behind `admin` that authenticates with `token`,
/// in `namespace`.
pub fn token_kubeconfig(admin: &Path, token: &str, namespace: &str, out: &Path) {
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(admin).unwrap()).unwrap();
    let cluster = config["clusters"][0]["name"].clone();
    config["users"] =
        serde_yaml::from_str(&format!("[{{name: sa, user: {{token: {token}}}}}]")).unwrap();
    config["contexts"] = serde_yaml::from_str(&format!(
        "[{{name: sa, context: {{cluster: {}, user: sa, namespace: {namespace}}}}}]",
        cluster.as_str().unwrap()
    ))
    .unwrap();
    config["current-context"] = "sa".into();
    std::fs::write(out, serde_yaml::to_string(&config).unwrap()).unwrap();
}

/// Write to `out` a kubeconfig for the ServiceAccount deploy/watcher.yaml ships
/// (`portalloc-system/portalloc-watcher`), of the cluster behind `admin`.
pub async fn watcher_kubeconfig(client: &Client, admin: &Path, out: &Path) {
    service_account_kubeconfig(client, admin, "portalloc-system", "portalloc-watcher", out).await;
}

/// The ClusterRole of deploy/watcher.yaml without its one rule on `resource`, named `name`, and
/// its binding to ServiceAccount `namespace/name`: the two objects to apply.
pub fn watcher_role_without(resource: &str, name: &str, namespace: &str) -> [Value; 2] {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/watcher.yaml");
    let manifests = std::fs::read_to_string(file).unwrap();
    let mut role = serde_yaml::Deserializer::from_str(&manifests)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|d| d["kind"] == "ClusterRole")
        .expect("a ClusterRole in deploy/watcher.yaml");
    let rules = role["rules"].as_array_mut().unwrap();
    let before = rules.len();
    rules.retain(|r| {
        !r["resources"]
            .as_array()
            .unwrap()
            .contains(&resource.into())
    });
    assert_eq!(rules.len(), before - 1, "one rule on {resource}");
    role["metadata"] = json!({"name": name});
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    });
    [role, binding]
}

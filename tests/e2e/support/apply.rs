//! Server-side apply of YAML documents (the files in rbac/), and RBAC bindings for test users.

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde::Deserialize;

/// The resource behind a kind this project's YAML uses.
fn resource_of(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = match kind {
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings",
        "Namespace" => "namespaces",
        "ServiceAccount" => "serviceaccounts",
        "Deployment" => "deployments",
        "Service" => "services",
        "PodDisruptionBudget" => "poddisruptionbudgets",
        other => panic!("no plural known for kind {other}"),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// Apply every document of `yaml` (server-side, forced); `namespace` for namespaced kinds that
/// name none.
pub async fn apply_yaml(client: &Client, yaml: &str, namespace: Option<&str>) {
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(document).expect("valid YAML");
        if value.is_null() {
            continue;
        }
        apply_value(client, serde_json::to_value(value).unwrap(), namespace).await;
    }
}

/// Apply one object given as JSON.
pub async fn apply_value(client: &Client, value: serde_json::Value, namespace: Option<&str>) {
    let object: DynamicObject = serde_json::from_value(value.clone()).expect("an object");
    let types = object.types.clone().expect("apiVersion and kind");
    let resource = resource_of(&types.api_version, &types.kind);
    let name = object.metadata.name.clone().expect("a name");
    let ns = object.metadata.namespace.as_deref().or(namespace);
    let api: Api<DynamicObject> = match (types.kind.as_str(), ns) {
        (
            "Role"
            | "RoleBinding"
            | "ServiceAccount"
            | "Deployment"
            | "Service"
            | "PodDisruptionBudget",
            Some(ns),
        ) => Api::namespaced_with(client.clone(), ns, &resource),
        _ => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        &name,
        &PatchParams::apply("portalloc-e2e").force(),
        &Patch::Apply(&value),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {} {name}: {e}", types.kind));
}

/// Bind ClusterRole `role` to user `user`: in `namespace` with a RoleBinding, or cluster-wide.
pub async fn bind(client: &Client, binding: &str, role: &str, user: &str, namespace: Option<&str>) {
    let kind = if namespace.is_some() {
        "RoleBinding"
    } else {
        "ClusterRoleBinding"
    };
    let mut metadata = serde_json::json!({"name": binding});
    if let Some(ns) = namespace {
        metadata["namespace"] = ns.into();
    }
    apply_value(
        client,
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }),
        namespace,
    )
    .await;
}

/// A namespace of that exact name.
pub async fn create_namespace(client: &Client, name: &str) {
    apply_value(
        client,
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        None,
    )
    .await;
}

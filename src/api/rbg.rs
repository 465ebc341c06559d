//! Importing the RoleBasedGroup port-allocator annotation into a PortAllocation.
//!
//! RBG reads `rolebasedgroup.workloads.x-k8s.io/port-allocator` from each role's pod template:
//! `{"allocations": [{name, env, annotationKey, scope}], "references": [{env, from}]}`. Its
//! `scope` is `PodScoped` or `RoleScoped` (an earlier draft said `policy: Dynamic|Static`, which
//! is accepted too). RBG resolves a reference to a PodScoped port from pod 0 of the target role,
//! so such references become `role.port[0]` here, which keeps their meaning.

use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use super::{PortAllocation, PortAllocationSpec, PortReference, PortRequest, Role, Scope};

pub const RBG_ANNOTATION: &str = "rolebasedgroup.workloads.x-k8s.io/port-allocator";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{object}: {field}: {message}")]
pub struct ImportError {
    pub object: String,
    pub field: String,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AllocatorConfig {
    #[serde(default)]
    allocations: Vec<RbgAllocation>,
    #[serde(default)]
    references: Vec<RbgReference>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RbgAllocation {
    name: String,
    env: String,
    #[serde(default)]
    annotation_key: Option<String>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    policy: Option<String>,
}

#[derive(Deserialize)]
struct RbgReference {
    env: String,
    from: String,
}

/// The result of one import: the PortAllocation and what could not be carried over.
#[derive(Debug, Clone)]
pub struct Imported {
    pub allocation: PortAllocation,
    /// Human-readable notes, e.g. annotation keys that have no equivalent here.
    pub notes: Vec<String>,
}

/// Convert one RoleBasedGroup (or RBG Instance, whose roles are `spec.components` with `size`)
/// into a PortAllocation on `pool`. Roles without the annotation get no ports but keep their
/// replicas, so references to them still resolve once they have ports.
pub fn import_rbg(object: &Value, pool: &str) -> Result<Imported, ImportError> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let kind = object["kind"].as_str().unwrap_or("object").to_string();
    let label = format!("{kind} {name:?}");
    let fail = |field: String, message: String| ImportError {
        object: label.clone(),
        field,
        message,
    };
    if name.is_empty() {
        return Err(fail("metadata.name".into(), "missing".into()));
    }
    let (list_field, size_field, roles_json) =
        match (&object["spec"]["roles"], &object["spec"]["components"]) {
            (Value::Array(roles), _) => ("spec.roles", "replicas", roles),
            (_, Value::Array(components)) => ("spec.components", "size", components),
            _ => {
                return Err(fail(
                    "spec.roles".into(),
                    "no roles found: is this a RoleBasedGroup?".into(),
                ));
            }
        };
    let mut roles = Vec::new();
    let mut notes = Vec::new();
    let mut pending_references = Vec::new();
    for (i, role_json) in roles_json.iter().enumerate() {
        let at = format!("{list_field}[{i}]");
        let role_name = role_json["name"].as_str().unwrap_or_default().to_string();
        if role_name.is_empty() {
            return Err(fail(format!("{at}.name"), "missing".into()));
        }
        let replicas = role_json[size_field].as_i64().unwrap_or(1) as i32;
        let annotation = &role_json["template"]["metadata"]["annotations"][RBG_ANNOTATION];
        let mut role = Role {
            name: role_name.clone(),
            replicas,
            ports: Vec::new(),
            references: Vec::new(),
        };
        if let Some(text) = annotation.as_str() {
            let field = format!("{at}.template.metadata.annotations[{RBG_ANNOTATION}]");
            let config: AllocatorConfig = serde_json::from_str(text)
                .map_err(|e| fail(field.clone(), format!("not valid port-allocator JSON: {e}")))?;
            for (j, allocation) in config.allocations.into_iter().enumerate() {
                let scope = match (allocation.scope.as_deref(), allocation.policy.as_deref()) {
                    (Some("PodScoped"), _) | (None, Some("Dynamic")) | (None, None) => {
                        Scope::PodScoped
                    }
                    (Some("RoleScoped"), _) | (None, Some("Static")) => Scope::RoleScoped,
                    (other, policy) => {
                        return Err(fail(
                            format!("{field}.allocations[{j}]"),
                            format!(
                                "scope {:?} is not PodScoped or RoleScoped",
                                other.or(policy).unwrap_or_default()
                            ),
                        ));
                    }
                };
                if let Some(key) = allocation.annotation_key {
                    notes.push(format!(
                        "{role_name}.{}: annotationKey {key:?} is not carried over; pods read their ports from env \
                         (`kubectl portalloc resolve`) or the ConfigMap (`resolve --all -o configmap`)",
                        allocation.name
                    ));
                }
                role.ports.push(PortRequest {
                    name: allocation.name,
                    scope,
                    env: allocation.env,
                    port: None,
                });
            }
            for reference in config.references {
                pending_references.push((roles.len(), reference));
            }
        }
        roles.push(role);
    }
    // References are translated once every role is known, so their target's scope is too.
    for (role_index, reference) in pending_references {
        let from = match reference.from.split_once('.') {
            Some((target_role, target_port)) if !reference.from.contains('[') => {
                let target = roles.iter().find(|r| r.name == target_role);
                let pod_scoped = target
                    .and_then(|r| r.ports.iter().find(|p| p.name == target_port))
                    .is_some_and(|p| p.scope == Scope::PodScoped);
                let multi = target.is_some_and(|r| r.replicas != 1);
                if pod_scoped && multi {
                    notes.push(format!(
                        "{}: reference {:?} is PodScoped on a role with several pods; RBG resolves it from pod 0, so it \
                         becomes {target_role}.{target_port}[0] (use [*] for every pod's port)",
                        roles[role_index].name, reference.from
                    ));
                    format!("{target_role}.{target_port}[0]")
                } else {
                    reference.from.clone()
                }
            }
            _ => reference.from.clone(),
        };
        roles[role_index].references.push(PortReference {
            env: reference.env,
            from,
        });
    }
    let mut allocation = PortAllocation::new(
        &name,
        PortAllocationSpec {
            pool: pool.to_string(),
            roles,
        },
    );
    allocation.metadata.namespace = object["metadata"]["namespace"].as_str().map(str::to_string);
    allocation
        .spec
        .validate()
        .map_err(|e| fail(e.field.clone(), format!("{} (after import)", e.message)))?;
    Ok(Imported { allocation, notes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rbg() -> Value {
        let leader = json!({"allocations": [{"name": "grpc", "env": "LEADER_PORT", "annotationKey": "x/grpc", "scope": "PodScoped"}]});
        let worker = json!({
            "allocations": [
                {"name": "rpc", "env": "WORKER_PORT", "scope": "PodScoped"},
                {"name": "shared", "env": "SHARED_PORT", "policy": "Static"}
            ],
            "references": [{"env": "LEADER_ADDR_PORT", "from": "leader.grpc"}]
        });
        json!({
            "apiVersion": "workloads.x-k8s.io/v1alpha1",
            "kind": "RoleBasedGroup",
            "metadata": {"name": "group", "namespace": "llm"},
            "spec": {"roles": [
                {"name": "leader", "replicas": 2, "template": {"metadata": {"annotations": {RBG_ANNOTATION: leader.to_string()}}}},
                {"name": "worker", "replicas": 3, "template": {"metadata": {"annotations": {RBG_ANNOTATION: worker.to_string()}}}},
                {"name": "router", "replicas": 1, "template": {"spec": {}}}
            ]}
        })
    }

    #[test]
    fn converts_roles_scopes_and_references() {
        let imported = import_rbg(&rbg(), "default").unwrap();
        let spec = &imported.allocation.spec;
        assert_eq!(
            imported.allocation.metadata.namespace.as_deref(),
            Some("llm")
        );
        assert_eq!(spec.pool, "default");
        assert_eq!(spec.roles.len(), 3);
        assert_eq!(spec.roles[0].ports[0].scope, Scope::PodScoped);
        assert_eq!(
            spec.roles[1].ports[1].scope,
            Scope::RoleScoped,
            "policy Static is RoleScoped"
        );
        assert_eq!(spec.roles[1].replicas, 3);
        assert_eq!(
            spec.roles[1].references[0].from, "leader.grpc[0]",
            "RBG resolves from pod 0"
        );
        assert!(spec.roles[2].ports.is_empty());
        assert!(
            imported
                .notes
                .iter()
                .any(|n| n.contains("annotationKey \"x/grpc\""))
        );
    }

    #[test]
    fn bad_annotations_name_the_field() {
        let mut object = rbg();
        object["spec"]["roles"][1]["template"]["metadata"]["annotations"][RBG_ANNOTATION] =
            json!("{not json");
        let err = import_rbg(&object, "p").unwrap_err();
        assert!(
            err.field
                .starts_with("spec.roles[1].template.metadata.annotations"),
            "{err}"
        );

        let mut object = rbg();
        object["spec"]["roles"][1]["template"]["metadata"]["annotations"][RBG_ANNOTATION] =
            json!(json!({"references": [{"env": "X", "from": "nobody.port"}]}).to_string());
        let err = import_rbg(&object, "p").unwrap_err();
        assert!(err.message.contains("names role \"nobody\""), "{err}");

        let err = import_rbg(
            &json!({"kind": "Pod", "metadata": {"name": "x"}, "spec": {}}),
            "p",
        )
        .unwrap_err();
        assert!(err.message.contains("is this a RoleBasedGroup"), "{err}");
    }
}

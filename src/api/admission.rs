//! What the pod webhook does to a pod, decided from the pod and its (allocated) PortAllocation
//! alone: which role and index the pod is (as `resolve --pod` finds it), the env it gets in
//! every container and init container, and the `portalloc.dev/ports` annotation, as a JSON
//! patch. No I/O: the Kubernetes layer reads the PortAllocation and answers the API server.

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

use super::{EnvVar, PortAllocation, WorkloadKind};

/// The label that sends a pod to the webhook: the PortAllocation (same namespace) it takes
/// its ports from. The same key labels the env-file ConfigMaps.
pub use super::env_file::ALLOCATION_LABEL as POD_ALLOCATION_LABEL;
/// Optional: the pod's role, when its name fits two roles or it has none yet (generateName).
pub const POD_ROLE_LABEL: &str = "portalloc.dev/role";
/// The pod's own ports, `name=port` (a block as `first-last`), comma-separated.
pub const PORTS_ANNOTATION: &str = "portalloc.dev/ports";

/// What the webhook would add to a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInjection {
    pub role: String,
    pub index: u32,
    pub env: Vec<EnvVar>,
    /// The value of [`PORTS_ANNOTATION`].
    pub ports: String,
}

impl PortAllocation {
    /// Which pod of this allocation `pod` is, and what it gets. The error is the one line the
    /// API server shows the workload controller when the pod is denied.
    pub fn pod_injection(&self, pod: &Pod) -> Result<PodInjection, String> {
        let role_label = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(POD_ROLE_LABEL))
            .map(String::as_str);
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let (role, index) = if name.is_empty() {
            self.unnamed_pod(pod, role_label)?
        } else {
            self.locate_pod(role_label, name)
                .map_err(|e| self.beyond_replicas(name).unwrap_or_else(|| e.to_string()))?
        };
        let env = self.resolve_env(&role, index).map_err(|e| e.to_string())?;
        let spec_role = self.spec.role(&role).expect("located in the spec");
        let ports = spec_role
            .ports
            .iter()
            .filter_map(|port| {
                let first: u32 = env
                    .iter()
                    .find(|e| e.name == port.env)?
                    .value
                    .parse()
                    .ok()?;
                Some(match port.count.unwrap_or(1) {
                    1 => format!("{}={first}", port.name),
                    n => format!("{}={first}-{}", port.name, first + n as u32 - 1),
                })
            })
            .collect::<Vec<_>>()
            .join(",");
        Ok(PodInjection {
            role,
            index,
            env,
            ports,
        })
    }

    /// For a pod named as a role's pod but past its replicas (a scale-up that raised the
    /// workload's replicas before the PortAllocation's): what to change.
    fn beyond_replicas(&self, name: &str) -> Option<String> {
        let groups = self.spec.group_count();
        self.spec.roles.iter().find_map(|role| {
            let flat = role.flat_of(name, 1 << 16)?;
            Some(format!(
                "pod {name} is pod {flat} of role {} of PortAllocation {}/{}, which has {} pods: raise \
                 the role's replicas (or groups) in the PortAllocation; the workload controller \
                 retries the pod",
                role.name,
                self.metadata.namespace.as_deref().unwrap_or_default(),
                self.metadata.name.as_deref().unwrap_or_default(),
                groups * role.per_group(),
            ))
        })
    }

    /// A pod with no name yet (a Deployment's, named by generateName after admission): the
    /// Deployment role its label names, else the one whose workload its generateName starts with.
    fn unnamed_pod(&self, pod: &Pod, role_label: Option<&str>) -> Result<(String, u32), String> {
        let generate = pod.metadata.generate_name.as_deref().unwrap_or_default();
        let deployments: Vec<&str> = self
            .spec
            .roles
            .iter()
            .filter(|r| {
                r.workload.as_ref().is_some_and(|w| {
                    w.kind == WorkloadKind::Deployment
                        && role_label.map_or(generate.starts_with(&format!("{}-", w.name)), |l| {
                            l == r.name
                        })
                })
            })
            .map(|r| r.name.as_str())
            .collect();
        match deployments.as_slice() {
            [role] => self.locate_pod(Some(role), role).map_err(|e| e.to_string()),
            [] => Err(format!(
                "pod {generate}* of PortAllocation {}/{} has no name yet and matches no Deployment \
                 role: label it {POD_ROLE_LABEL}=<role> with a role whose workload is a Deployment",
                self.metadata.namespace.as_deref().unwrap_or_default(),
                self.metadata.name.as_deref().unwrap_or_default(),
            )),
            many => Err(format!(
                "pod {generate}* fits the Deployment roles {}: label it {POD_ROLE_LABEL}=<role>",
                many.join(", ")
            )),
        }
    }
}

/// The JSON patch that adds `injection` to `pod`: each env var to every container and init
/// container that does not set that name itself, and the ports annotation.
pub fn pod_patch(pod: &Pod, injection: &PodInjection) -> Vec<Value> {
    let mut patch = Vec::new();
    if let Some(spec) = &pod.spec {
        let lists: [(&str, &[Container]); 2] = [
            ("containers", &spec.containers),
            (
                "initContainers",
                spec.init_containers.as_deref().unwrap_or_default(),
            ),
        ];
        for (list, containers) in lists {
            for (i, container) in containers.iter().enumerate() {
                container_patch(
                    &mut patch,
                    &format!("/spec/{list}/{i}/env"),
                    container,
                    &injection.env,
                );
            }
        }
    }
    let annotation = format!(
        "/metadata/annotations/{}",
        PORTS_ANNOTATION.replace('/', "~1")
    );
    if pod.metadata.annotations.is_none() {
        patch.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    patch.push(json!({"op": "add", "path": annotation, "value": injection.ports}));
    patch
}

fn container_patch(patch: &mut Vec<Value>, path: &str, container: &Container, env: &[EnvVar]) {
    let own: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    let added: Vec<Value> = env
        .iter()
        .filter(|e| !own.contains(&e.name.as_str()))
        .map(|e| json!({"name": e.name, "value": e.value}))
        .collect();
    if added.is_empty() {
        return;
    }
    if container.env.is_none() {
        patch.push(json!({"op": "add", "path": path, "value": added}));
    } else {
        // After the container's own variables, which keep their values.
        for value in added {
            patch.push(json!({"op": "add", "path": format!("{path}/-"), "value": value}));
        }
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;

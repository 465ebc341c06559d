//! What the pod webhook does to a pod, decided from the pod and its (allocated) PortAllocation
//! alone: which role and index the pod is (as `resolve --pod` finds it), the env it gets in
//! every container and init container, the `portalloc.dev/ports` annotation, and for a
//! hostNetwork pod its ports declared in its spec for kube-scheduler, as a JSON patch. No I/O:
//! the Kubernetes layer reads the PortAllocation (and the pool's protocol) and answers the API
//! server.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde_json::{Value, json};

use super::{EnvVar, PortAllocation, Protocol, ResolveError, WorkloadKind};

/// The label that sends a pod to the webhook: the PortAllocation (same namespace) it takes
/// its ports from. The same key labels the env-file ConfigMaps.
pub use super::env_file::ALLOCATION_LABEL as POD_ALLOCATION_LABEL;
/// Optional: the pod's role, when its name fits two roles or it has none yet (generateName).
pub const POD_ROLE_LABEL: &str = "portalloc.dev/role";
/// The pod's own ports, `name=port` (a block as `first-last`), comma-separated.
pub const PORTS_ANNOTATION: &str = "portalloc.dev/ports";
/// The annotation kubectl reads for a pod's main container; the declared ports go there.
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";

/// What the webhook would add to a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInjection {
    pub role: String,
    pub index: u32,
    pub env: Vec<EnvVar>,
    /// The pod's own ports (its role's, at its index), in the role's order.
    pub ports: Vec<PodPort>,
}

/// One port of a pod's role as the pod holds it, as the webhook injects it: a single port, or a
/// block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPort {
    /// The port's name in the role, e.g. `http`.
    pub name: String,
    pub first: u16,
    /// How many ports from `first` on (1: a single port).
    pub count: u16,
}

impl PodInjection {
    /// The value of [`PORTS_ANNOTATION`]: `http=30006,nixl=31010-31013`.
    pub fn annotation(&self) -> String {
        self.ports
            .iter()
            .map(|p| match p.count {
                1 => format!("{}={}", p.name, p.first),
                n => format!(
                    "{}={}-{}",
                    p.name,
                    p.first,
                    u32::from(p.first) + u32::from(n) - 1
                ),
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Why a pod is not one of a PortAllocation's pods. Its text is the one line the API server
/// shows the workload controller when the pod is denied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodInjectionError {
    /// Named as a role's pod but past its replicas (a scale-up that raised the workload's
    /// replicas before the PortAllocation's).
    #[error(
        "pod {pod} is pod {flat} of role {role} of PortAllocation {namespace}/{name}, which has \
         {pods} pods: raise the role's replicas (or groups) in the PortAllocation; the workload \
         controller retries the pod"
    )]
    BeyondReplicas {
        pod: String,
        flat: u32,
        role: String,
        namespace: String,
        name: String,
        pods: u32,
    },
    /// No name yet, and no Deployment role it could be.
    #[error(
        "pod {generate_name}* of PortAllocation {namespace}/{name} has no name yet and matches no \
         Deployment role: label it {POD_ROLE_LABEL}=<role> with a role whose workload is a \
         Deployment"
    )]
    NoDeploymentRole {
        generate_name: String,
        namespace: String,
        name: String,
    },
    /// No name yet, and several Deployment roles it could be.
    #[error(
        "pod {generate_name}* fits the Deployment roles {}: label it {POD_ROLE_LABEL}=<role>",
        roles.join(", ")
    )]
    ManyDeploymentRoles {
        generate_name: String,
        roles: Vec<String>,
    },
    /// Its role or index, or its env, cannot be resolved.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
}

impl PortAllocation {
    /// Which pod of this allocation `pod` is, and what it gets.
    pub fn pod_injection(&self, pod: &Pod) -> Result<PodInjection, PodInjectionError> {
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
                .map_err(|e| self.beyond_replicas(name).unwrap_or(e.into()))?
        };
        let env = self.resolve_env(&role, index)?;
        let spec_role = self.spec.role(&role).expect("located in the spec");
        // From the env it gets: exactly the ports `resolve --pod` hands this pod.
        let ports = spec_role
            .ports
            .iter()
            .filter_map(|port| {
                let first: u16 = env
                    .iter()
                    .find(|e| e.name == port.env)?
                    .value
                    .parse()
                    .ok()?;
                Some(PodPort {
                    name: port.name.clone(),
                    first,
                    count: port.count.unwrap_or(1).clamp(1, i32::from(u16::MAX)) as u16,
                })
            })
            .collect();
        Ok(PodInjection {
            role,
            index,
            env,
            ports,
        })
    }

    /// For a pod named as a role's pod but past its replicas (a scale-up that raised the
    /// workload's replicas before the PortAllocation's): what to change.
    fn beyond_replicas(&self, name: &str) -> Option<PodInjectionError> {
        let groups = self.spec.group_count();
        self.spec.roles.iter().find_map(|role| {
            let flat = role.flat_of(name, 1 << 16)?;
            Some(PodInjectionError::BeyondReplicas {
                pod: name.to_string(),
                flat,
                role: role.name.clone(),
                namespace: self.metadata.namespace.clone().unwrap_or_default(),
                name: self.metadata.name.clone().unwrap_or_default(),
                pods: groups * role.per_group(),
            })
        })
    }

    /// A pod with no name yet (a Deployment's, named by generateName after admission): the
    /// Deployment role its label names, else the one whose workload its generateName starts with.
    fn unnamed_pod(
        &self,
        pod: &Pod,
        role_label: Option<&str>,
    ) -> Result<(String, u32), PodInjectionError> {
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
            [role] => Ok(self.locate_pod(Some(role), role)?),
            [] => Err(PodInjectionError::NoDeploymentRole {
                generate_name: generate.to_string(),
                namespace: self.metadata.namespace.clone().unwrap_or_default(),
                name: self.metadata.name.clone().unwrap_or_default(),
            }),
            many => Err(PodInjectionError::ManyDeploymentRoles {
                generate_name: generate.to_string(),
                roles: many.iter().map(|r| r.to_string()).collect(),
            }),
        }
    }
}

/// Whether the webhook declares a pod's ports in its spec: only on hostNetwork. A pod on the
/// pod network binds its ports in its own network namespace, where they never collide, and a
/// `hostPort` there would open the port on the node (kube-proxy's or the CNI's port mapping).
pub fn declares_ports(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .is_some_and(|s| s.host_network == Some(true))
}

/// The JSON patch that adds `injection` to `pod`: each env var to every container and init
/// container that does not set that name itself, the ports annotation, and, for a pod that
/// [`declares_ports`] with its pool's `protocol` known, every port in its main container's
/// `ports` (see [`declared_ports`]).
pub fn pod_patch(pod: &Pod, injection: &PodInjection, protocol: Option<Protocol>) -> Vec<Value> {
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
        if let Some(protocol) = protocol.filter(|_| declares_ports(pod)) {
            declare_ports(&mut patch, pod, spec, injection, protocol);
        }
    }
    let annotation = format!(
        "/metadata/annotations/{}",
        PORTS_ANNOTATION.replace('/', "~1")
    );
    if pod.metadata.annotations.is_none() {
        patch.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    patch.push(json!({"op": "add", "path": annotation, "value": injection.annotation()}));
    patch
}

/// The ports a hostNetwork pod is given, as `containers[].ports` entries kube-scheduler's
/// NodePorts filter reads (it keeps a pod off a node where another pod declares one of its
/// ports): `hostPort` = `containerPort` (the API server requires it on hostNetwork) = each port
/// of each block, in the pool's `protocol`. None for a port the pod already declares itself
/// (same number and protocol, in a container or a sidecar, which the scheduler reads too: a
/// second entry there would be a duplicate the API server refuses; a one-shot init container's
/// ports count for neither). Each is named after its role's port (`http`, a block's
/// `nixl-0`...) when that name is a valid port name (15 characters at most) no container of
/// the pod uses yet; otherwise it has no name, which is allowed.
pub fn declared_ports(pod: &Pod, injection: &PodInjection, protocol: Protocol) -> Vec<Value> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let init = || spec.init_containers.iter().flatten();
    let protocol = protocol.to_string();
    let declared: BTreeSet<i32> = spec
        .containers
        .iter()
        .chain(init().filter(|c| c.restart_policy.as_deref() == Some("Always")))
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == protocol)
        .flat_map(|p| [p.container_port, p.host_port.unwrap_or(0)])
        .collect();
    let mut names: BTreeSet<String> = spec
        .containers
        .iter()
        .chain(init())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| p.name.clone())
        .collect();
    let mut out = Vec::new();
    for port in &injection.ports {
        for i in 0..port.count {
            let Some(number) = port.first.checked_add(i) else {
                break;
            };
            let number = i32::from(number);
            if declared.contains(&number) {
                continue;
            }
            let name = match port.count {
                1 => port.name.clone(),
                _ => format!("{}-{i}", port.name),
            };
            let mut entry =
                json!({"containerPort": number, "hostPort": number, "protocol": protocol});
            if is_port_name(&name) && names.insert(name.clone()) {
                entry["name"] = name.into();
            }
            out.push(entry);
        }
    }
    out
}

/// The container the ports are declared on: the one kubectl's default-container annotation
/// names, else the first. Which one does not matter to the scheduler (it reads every
/// container's ports); this one is where a reader of the pod looks first.
fn main_container(pod: &Pod, spec: &PodSpec) -> usize {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DEFAULT_CONTAINER_ANNOTATION))
        .and_then(|name| spec.containers.iter().position(|c| &c.name == name))
        .unwrap_or(0)
}

fn declare_ports(
    patch: &mut Vec<Value>,
    pod: &Pod,
    spec: &PodSpec,
    injection: &PodInjection,
    protocol: Protocol,
) {
    let index = main_container(pod, spec);
    let entries = declared_ports(pod, injection, protocol);
    let Some(container) = spec.containers.get(index).filter(|_| !entries.is_empty()) else {
        return;
    };
    let path = format!("/spec/containers/{index}/ports");
    if container.ports.is_none() {
        patch.push(json!({"op": "add", "path": path, "value": entries}));
    } else {
        // After the container's own ports, which stay as they are.
        for entry in entries {
            patch.push(json!({"op": "add", "path": format!("{path}/-"), "value": entry}));
        }
    }
}

/// A valid container port name (an IANA service name): 1-15 lowercase letters, digits and
/// single inner hyphens, with at least one letter.
fn is_port_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=15).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.iter().any(u8::is_ascii_lowercase)
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
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

//! The environment one pod should get: its own ports under their env names, plus every
//! reference of its role resolved against the allocated ports, inside the pod's own group.
//! Pure: spec + status in, env out.

use std::collections::BTreeMap;

use thiserror::Error;

use super::reference_check::{CheckedReference, ReferenceKind};
use super::{Pod, PortAllocation, PortScope, Role, find_pod};
use crate::core::{FormatPart, PortForm, Selector};

/// Why a pod's environment cannot be given.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResolveError {
    #[error("PortAllocation {owner} has no role {role:?} (roles: {roles})")]
    NoSuchRole {
        owner: String,
        role: String,
        roles: String,
    },

    #[error("pod index {index} is out of range: role {role:?} of {owner} has {pods} pods (indices 0..{last})", last = .pods.saturating_sub(1))]
    IndexOutOfRange {
        owner: String,
        role: String,
        index: u32,
        pods: u32,
    },

    #[error("pod name {pod:?} does not end in -<index> (e.g. {role}-0)")]
    BadPodName { pod: String, role: String },

    #[error(
        "PortAllocation {owner} has no pod {pod:?}{within} (its pods are named like {examples})"
    )]
    NoSuchPod {
        owner: String,
        pod: String,
        /// ` in role "r"` when the role was given.
        within: String,
        examples: String,
    },

    #[error("pod name {pod:?} fits roles {roles} of {owner}: say which with --role")]
    AmbiguousPod {
        owner: String,
        pod: String,
        roles: String,
    },

    #[error("{field}: {message}")]
    BadReference { field: String, message: String },

    #[error(
        "{what} of PortAllocation {owner} is not allocated yet: run `kubectl portalloc sync {name} -n {namespace}`"
    )]
    NotAllocated {
        owner: String,
        name: String,
        namespace: String,
        what: String,
    },
}

/// One environment variable and where its value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
    /// `own port prefill.http[1]` or `reference decode.http[*]`.
    pub source: String,
}

/// The pod index at the end of a pod name: `sglang-pd-decode-2` -> 2.
pub fn index_from_pod_name(pod: &str, role: &str) -> Result<u32, ResolveError> {
    pod.rsplit_once('-')
        .and_then(|(_, tail)| {
            (!tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit())).then_some(tail)
        })
        .and_then(|tail| tail.parse().ok())
        .ok_or_else(|| ResolveError::BadPodName {
            pod: pod.to_string(),
            role: role.to_string(),
        })
}

/// A port's allocated value for one slot: the first port and, for a block, how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) first: u16,
    pub(super) count: u16,
}

impl Held {
    pub(super) fn last(self) -> u16 {
        self.first.saturating_add(self.count.saturating_sub(1))
    }

    fn write(self, form: PortForm) -> String {
        match form {
            PortForm::First => self.first.to_string(),
            PortForm::Last => self.last().to_string(),
            PortForm::Range => format!("{}-{}", self.first, self.last()),
        }
    }
}

impl PortAllocation {
    fn owner(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }

    fn namespace_or_default(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("default")
    }

    /// The allocated values of `role.port`, in slot order (empty if none yet): per pod (flat
    /// index) for PodScoped, per group for RoleScoped; a block's first port.
    pub fn allocated_values(&self, role: &str, port: &str) -> Vec<u16> {
        self.assignment(role, port)
            .map(|a| {
                a.values
                    .iter()
                    .filter_map(|v| u16::try_from(*v).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn assignment(&self, role: &str, port: &str) -> Option<&super::PortAssignment> {
        self.status.as_ref().and_then(|s| {
            s.assignments
                .iter()
                .find(|a| a.role == role && a.port == port)
        })
    }

    fn role_or_error(&self, role: &str) -> Result<&Role, ResolveError> {
        self.spec
            .role(role)
            .ok_or_else(|| ResolveError::NoSuchRole {
                owner: self.owner(),
                role: role.to_string(),
                roles: self.role_names(),
            })
    }

    fn role_names(&self) -> String {
        self.spec
            .roles
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn not_allocated(&self, what: String) -> ResolveError {
        ResolveError::NotAllocated {
            owner: self.owner(),
            name: self.metadata.name.clone().unwrap_or_default(),
            namespace: self.metadata.namespace.clone().unwrap_or_default(),
            what,
        }
    }

    /// What `pod` of `role` holds of port `port_name`: its own value (PodScoped) or its
    /// group's (RoleScoped).
    pub(super) fn held(
        &self,
        role: &Role,
        port_name: &str,
        scope: PortScope,
        pod: &Pod,
    ) -> Result<Held, ResolveError> {
        let (slot, what) = match scope {
            PortScope::RoleScoped if self.spec.group_count() > 1 => (
                pod.group,
                format!("port {}.{} of group {}", role.name, port_name, pod.group),
            ),
            PortScope::RoleScoped => (0, format!("port {}.{}", role.name, port_name)),
            PortScope::PodScoped => (
                pod.flat,
                format!("port {}.{}[{}]", role.name, port_name, pod.flat),
            ),
        };
        let assignment = self.assignment(&role.name, port_name);
        let first = assignment
            .and_then(|a| a.values.get(slot as usize))
            .and_then(|v| u16::try_from(*v).ok())
            .ok_or_else(|| self.not_allocated(what))?;
        let count = assignment
            .and_then(|a| a.count)
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(1)
            .max(1);
        Ok(Held { first, count })
    }

    /// The environment of pod `index` (flat: `g * replicas + i`) of `role`, in spec order: own
    /// ports (with a block's last and range), then references.
    pub fn resolve_env(&self, role_name: &str, index: u32) -> Result<Vec<EnvVar>, ResolveError> {
        let role = self.role_or_error(role_name)?;
        let pods = self.spec.group_count() * role.per_group();
        if index >= pods {
            return Err(ResolveError::IndexOutOfRange {
                owner: self.owner(),
                role: role_name.to_string(),
                index,
                pods,
            });
        }
        let pod = role.pod(index);
        let mut env = Vec::new();
        for port in &role.ports {
            let held = self.held(role, &port.name, port.scope, &pod)?;
            let source = match port.scope {
                PortScope::RoleScoped => format!("own port {}.{}", role.name, port.name),
                PortScope::PodScoped => format!("own port {}.{}[{index}]", role.name, port.name),
            };
            let named = [
                (Some(&port.env), PortForm::First),
                (port.last_env.as_ref(), PortForm::Last),
                (port.range_env.as_ref(), PortForm::Range),
            ];
            for (name, form) in named {
                if let Some(name) = name {
                    env.push(EnvVar {
                        name: name.clone(),
                        value: held.write(form),
                        source: source.clone(),
                    });
                }
            }
        }
        let r = self
            .spec
            .roles
            .iter()
            .position(|r| r.name == role_name)
            .unwrap_or_default();
        for (k, reference) in role.references.iter().enumerate() {
            let at = format!("spec.roles[{r}].references[{k}]");
            let checked = self.spec.check_reference(&at, reference).map_err(|e| {
                ResolveError::BadReference {
                    field: e.field,
                    message: e.message,
                }
            })?;
            env.push(EnvVar {
                name: reference.env.clone(),
                value: self.reference_value(&checked, &pod)?,
                source: format!("reference {}", reference.from),
            });
        }
        Ok(env)
    }

    /// The value of reference `k` of role `r` (`spec.roles[r].references[k]`) as pod 0 of
    /// group 0 sees it (what `describe` shows).
    pub fn resolve_reference_at(&self, r: usize, k: usize) -> Result<String, ResolveError> {
        let at = format!("spec.roles[{r}].references[{k}]");
        let reference = self
            .spec
            .roles
            .get(r)
            .and_then(|role| role.references.get(k))
            .ok_or_else(|| ResolveError::BadReference {
                field: at.clone(),
                message: "no such reference".into(),
            })?;
        let checked =
            self.spec
                .check_reference(&at, reference)
                .map_err(|e| ResolveError::BadReference {
                    field: e.field,
                    message: e.message,
                })?;
        let viewer = self.spec.roles[r].pod(0);
        self.reference_value(&checked, &viewer)
    }

    /// A checked reference's value for `viewer`: the pods it selects are those of the viewer's
    /// group.
    fn reference_value(
        &self,
        checked: &CheckedReference<'_>,
        viewer: &Pod,
    ) -> Result<String, ResolveError> {
        let target = checked.target;
        let base = viewer.group * target.per_group();
        let selected: Vec<Pod> = match checked.reference.selector {
            Selector::Single => vec![target.pod(base)],
            Selector::Index(i) => vec![target.pod(base + i)],
            Selector::All => (0..target.per_group())
                .map(|i| target.pod(base + i))
                .collect(),
        };
        match &checked.kind {
            // One value for the group, whatever the selector (checked: [0] at most).
            ReferenceKind::Port {
                port,
                scope: PortScope::RoleScoped,
            } => Ok(self
                .held(target, port, PortScope::RoleScoped, &target.pod(base))?
                .write(PortForm::First)),
            ReferenceKind::Port { port, scope } => selected
                .iter()
                .map(|pod| Ok(self.held(target, port, *scope, pod)?.write(PortForm::First)))
                .collect::<Result<Vec<_>, ResolveError>>()
                .map(|values| values.join(&checked.join)),
            ReferenceKind::Pods(parts) => selected
                .iter()
                .map(|pod| self.format_pod(target, pod, parts))
                .collect::<Result<Vec<_>, ResolveError>>()
                .map(|values| values.join(&checked.join)),
        }
    }

    /// One pod written with a format's (checked) parts.
    fn format_pod(
        &self,
        role: &Role,
        pod: &Pod,
        parts: &[FormatPart],
    ) -> Result<String, ResolveError> {
        let mut out = String::new();
        for part in parts {
            match part {
                FormatPart::Literal(text) => out.push_str(text),
                FormatPart::Address => out.push_str(
                    &role
                        .address(pod, self.namespace_or_default())
                        .unwrap_or_default(),
                ),
                FormatPart::Pod => out.push_str(&pod.name),
                FormatPart::Index => out.push_str(&pod.index.to_string()),
                FormatPart::Port { name, form } => {
                    let scope = role
                        .ports
                        .iter()
                        .find(|p| &p.name == name)
                        .map(|p| p.scope)
                        .unwrap_or_default();
                    out.push_str(&self.held(role, name, scope, pod)?.write(*form));
                }
            }
        }
        Ok(out)
    }

    /// Which role and flat index a pod name stands for. With `role`, only that role is
    /// searched, and a role without workload takes the trailing `-<index>` of any name (a
    /// StatefulSet not named after the role).
    pub fn locate_pod(&self, role: Option<&str>, pod: &str) -> Result<(String, u32), ResolveError> {
        let groups = self.spec.group_count();
        if let Some(role_name) = role {
            let role = self.role_or_error(role_name)?;
            if role.workload.is_none() {
                return Ok((role.name.clone(), index_from_pod_name(pod, role_name)?));
            }
            return role
                .flat_of(pod, groups)
                .map(|flat| (role.name.clone(), flat))
                .ok_or_else(|| self.no_such_pod(pod, Some(role)));
        }
        let found = find_pod(&self.spec, pod);
        match found.as_slice() {
            [(r, flat)] => Ok((self.spec.roles[*r].name.clone(), *flat)),
            [] => Err(self.no_such_pod(pod, None)),
            many => Err(ResolveError::AmbiguousPod {
                owner: self.owner(),
                pod: pod.to_string(),
                roles: many
                    .iter()
                    .map(|(r, _)| self.spec.roles[*r].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    fn no_such_pod(&self, pod: &str, role: Option<&Role>) -> ResolveError {
        let groups = self.spec.group_count();
        let roles: Vec<&Role> = match role {
            Some(role) => vec![role],
            None => self.spec.roles.iter().collect(),
        };
        let examples: Vec<String> = roles
            .iter()
            .filter_map(|r| r.env_file_pods(groups).into_iter().next())
            .map(|p| p.name)
            .collect();
        ResolveError::NoSuchPod {
            owner: self.owner(),
            pod: pod.to_string(),
            within: role
                .map(|r| format!(" in role {:?}", r.name))
                .unwrap_or_default(),
            examples: if examples.is_empty() {
                "nothing: no role has pods".to_string()
            } else {
                examples.join(", ")
            },
        }
    }

    /// Every env file's environment, keyed by the file's name without `.env`: the pod's name,
    /// or a Deployment role's name (its pods share the file).
    pub fn resolve_all(&self) -> Result<BTreeMap<String, Vec<EnvVar>>, ResolveError> {
        let groups = self.spec.group_count();
        let mut all = BTreeMap::new();
        for (r, role) in self.spec.roles.iter().enumerate() {
            for pod in role.env_file_pods(groups) {
                let env = self.resolve_env(&role.name, pod.flat)?;
                if all.contains_key(&pod.name) {
                    return Err(ResolveError::BadReference {
                        field: format!("spec.roles[{r}]"),
                        message: format!(
                            "pod {} is also a pod of another role: their env files would be one",
                            pod.name
                        ),
                    });
                }
                all.insert(pod.name, env);
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
pub(crate) mod tests;

//! The environment one pod should get: its own ports under their env names, plus every
//! reference of its role resolved against the allocated ports. Pure: spec + status in, env out.

use std::collections::BTreeMap;

use thiserror::Error;

use super::{PortAllocation, Role, Scope};
use crate::core::{Reference, Selector};

/// Why a pod's environment cannot be given.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResolveError {
    #[error("PortAllocation {owner} has no role {role:?} (roles: {roles})")]
    NoSuchRole {
        owner: String,
        role: String,
        roles: String,
    },

    #[error("pod index {index} is out of range: role {role:?} of {owner} has {replicas} replicas (indices 0..{last})", last = .replicas.saturating_sub(1))]
    IndexOutOfRange {
        owner: String,
        role: String,
        index: u32,
        replicas: u32,
    },

    #[error("pod name {pod:?} does not end in -<index> (e.g. {role}-0)")]
    BadPodName { pod: String, role: String },

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

impl PortAllocation {
    fn owner(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// The allocated values of `role.port`, in pod-index order (empty if none yet).
    pub fn allocated_values(&self, role: &str, port: &str) -> Vec<u16> {
        self.status
            .as_ref()
            .and_then(|s| {
                s.assignments
                    .iter()
                    .find(|a| a.role == role && a.port == port)
            })
            .map(|a| {
                a.values
                    .iter()
                    .filter_map(|v| u16::try_from(*v).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn role_or_error(&self, role: &str) -> Result<&Role, ResolveError> {
        self.spec
            .role(role)
            .ok_or_else(|| ResolveError::NoSuchRole {
                owner: self.owner(),
                role: role.to_string(),
                roles: self
                    .spec
                    .roles
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    fn not_allocated(&self, what: String) -> ResolveError {
        ResolveError::NotAllocated {
            owner: self.owner(),
            name: self.metadata.name.clone().unwrap_or_default(),
            namespace: self.metadata.namespace.clone().unwrap_or_default(),
            what,
        }
    }

    /// The value a port has for pod `index` of its role: RoleScoped ports have one value for all.
    fn value_for(
        &self,
        role: &Role,
        port_name: &str,
        scope: Scope,
        index: u32,
    ) -> Result<u16, ResolveError> {
        let values = self.allocated_values(&role.name, port_name);
        let at = match scope {
            Scope::RoleScoped => 0,
            Scope::PodScoped => index as usize,
        };
        values.get(at).copied().ok_or_else(|| match scope {
            Scope::RoleScoped => self.not_allocated(format!("port {}.{}", role.name, port_name)),
            Scope::PodScoped => {
                self.not_allocated(format!("port {}.{}[{index}]", role.name, port_name))
            }
        })
    }

    /// The environment of pod `index` of `role`, in spec order: own ports, then references.
    pub fn resolve_env(&self, role_name: &str, index: u32) -> Result<Vec<EnvVar>, ResolveError> {
        let role = self.role_or_error(role_name)?;
        let replicas = role.replicas.max(0) as u32;
        if index >= replicas {
            return Err(ResolveError::IndexOutOfRange {
                owner: self.owner(),
                role: role_name.to_string(),
                index,
                replicas,
            });
        }
        let mut env = Vec::new();
        for port in &role.ports {
            let value = self.value_for(role, &port.name, port.scope, index)?;
            let source = match port.scope {
                Scope::RoleScoped => format!("own port {}.{}", role.name, port.name),
                Scope::PodScoped => format!("own port {}.{}[{index}]", role.name, port.name),
            };
            env.push(EnvVar {
                name: port.env.clone(),
                value: value.to_string(),
                source,
            });
        }
        let r = self
            .spec
            .roles
            .iter()
            .position(|r| r.name == role_name)
            .unwrap_or_default();
        for (i, reference) in role.references.iter().enumerate() {
            let field = format!("spec.roles[{r}].references[{i}].from");
            let value = self.resolve_reference(&field, &reference.from)?;
            env.push(EnvVar {
                name: reference.env.clone(),
                value,
                source: format!("reference {}", reference.from),
            });
        }
        Ok(env)
    }

    /// The value of one reference: a port, or comma-separated ports for `[*]`.
    pub fn resolve_reference(&self, field: &str, text: &str) -> Result<String, ResolveError> {
        let bad = |message: String| ResolveError::BadReference {
            field: field.to_string(),
            message,
        };
        let reference = Reference::parse(text).map_err(|e| bad(e.to_string()))?;
        let role = self.spec.role(&reference.role).ok_or_else(|| {
            bad(format!(
                "reference {text:?} names role {:?}, which does not exist",
                reference.role
            ))
        })?;
        let port = role
            .ports
            .iter()
            .find(|p| p.name == reference.port)
            .ok_or_else(|| {
                bad(format!(
                    "reference {text:?} names port {:?}, which role {:?} does not have",
                    reference.port, role.name
                ))
            })?;
        let replicas = role.replicas.max(0) as u32;
        match (port.scope, reference.selector) {
            (Scope::RoleScoped, Selector::Single | Selector::All)
            | (Scope::RoleScoped, Selector::Index(0)) => Ok(self
                .value_for(role, &port.name, Scope::RoleScoped, 0)?
                .to_string()),
            (Scope::RoleScoped, Selector::Index(_)) => Err(bad(format!(
                "reference {text:?} indexes a RoleScoped port, which has one value"
            ))),
            (Scope::PodScoped, Selector::Single) if replicas != 1 => Err(bad(format!(
                "reference {text:?} is ambiguous: {}.{} is PodScoped and role {:?} has {replicas} replicas; write [i] or [*]",
                role.name, port.name, role.name
            ))),
            (Scope::PodScoped, Selector::Single) => Ok(self
                .value_for(role, &port.name, Scope::PodScoped, 0)?
                .to_string()),
            (Scope::PodScoped, Selector::Index(i)) if i >= replicas => Err(bad(format!(
                "reference {text:?} is out of range: role {:?} has {replicas} replicas",
                role.name
            ))),
            (Scope::PodScoped, Selector::Index(i)) => Ok(self
                .value_for(role, &port.name, Scope::PodScoped, i)?
                .to_string()),
            (Scope::PodScoped, Selector::All) => {
                let values = (0..replicas)
                    .map(|i| {
                        self.value_for(role, &port.name, Scope::PodScoped, i)
                            .map(|v| v.to_string())
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(values.join(","))
            }
        }
    }

    /// Every pod's environment, keyed `<role>-<index>`, for the ConfigMap pattern.
    pub fn resolve_all(&self) -> Result<BTreeMap<String, Vec<EnvVar>>, ResolveError> {
        let mut all = BTreeMap::new();
        for role in &self.spec.roles {
            for index in 0..role.replicas.max(0) as u32 {
                all.insert(
                    format!("{}-{index}", role.name),
                    self.resolve_env(&role.name, index)?,
                );
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{pd_roles, port, reference};
    use super::super::{PortAllocationSpec, PortAllocationStatus, PortAssignment};
    use super::*;

    fn assignment(role: &str, port: &str, scope: Scope, values: &[i32]) -> PortAssignment {
        PortAssignment {
            role: role.into(),
            port: port.into(),
            scope,
            env: String::new(),
            values: values.to_vec(),
            ..Default::default()
        }
    }

    fn pd() -> PortAllocation {
        let mut roles = pd_roles(2, 2);
        roles[2]
            .ports
            .push(port("metrics", Scope::RoleScoped, "METRICS_PORT"));
        roles[2].references = vec![
            reference("ROUTER", "router.http"),
            reference("BOOTSTRAPS", "prefill.bootstrap[*]"),
            reference("FIRST", "prefill.bootstrap[0]"),
        ];
        let mut pa = PortAllocation::new(
            "pd",
            PortAllocationSpec {
                pool: "p".into(),
                roles,
                ..Default::default()
            },
        );
        pa.metadata.namespace = Some("llm".into());
        pa.status = Some(PortAllocationStatus {
            assignments: vec![
                assignment("router", "http", Scope::RoleScoped, &[20001]),
                assignment("prefill", "bootstrap", Scope::PodScoped, &[20010, 20011]),
                assignment("decode", "http", Scope::PodScoped, &[20020, 20021]),
                assignment("decode", "metrics", Scope::RoleScoped, &[20009]),
            ],
            ..Default::default()
        });
        pa
    }

    fn pairs(env: &[EnvVar]) -> Vec<(&str, &str)> {
        env.iter()
            .map(|e| (e.name.as_str(), e.value.as_str()))
            .collect()
    }

    #[test]
    fn a_pod_gets_its_own_ports_and_resolved_references() {
        let env = pd().resolve_env("decode", 1).unwrap();
        assert_eq!(
            pairs(&env),
            vec![
                ("DECODE_PORT", "20021"),
                ("METRICS_PORT", "20009"),
                ("ROUTER", "20001"),
                ("BOOTSTRAPS", "20010,20011"),
                ("FIRST", "20010")
            ]
        );
        assert_eq!(env[0].source, "own port decode.http[1]");
    }

    #[test]
    fn pod_names_give_the_index() {
        assert_eq!(index_from_pod_name("sglang-pd-decode-12", "decode"), Ok(12));
        assert!(matches!(
            index_from_pod_name("decode", "decode"),
            Err(ResolveError::BadPodName { .. })
        ));
        assert!(matches!(
            index_from_pod_name("decode-x", "decode"),
            Err(ResolveError::BadPodName { .. })
        ));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let pa = pd();
        assert!(matches!(
            pa.resolve_env("nobody", 0),
            Err(ResolveError::NoSuchRole { .. })
        ));
        let err = pa.resolve_env("decode", 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pod index 2 is out of range: role \"decode\" of llm/pd has 2 replicas (indices 0..1)"
        );
        let mut unallocated = pd();
        unallocated.status = None;
        let err = unallocated.resolve_env("router", 0).unwrap_err();
        assert!(
            err.to_string()
                .contains("run `kubectl portalloc sync pd -n llm`"),
            "{err}"
        );
        let err = pa.resolve_reference("f", "prefill.bootstrap").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("f: reference \"prefill.bootstrap\" is ambiguous"),
            "{err}"
        );
    }

    #[test]
    fn resolve_all_covers_every_pod() {
        let all = pd().resolve_all().unwrap();
        assert_eq!(
            all.keys().collect::<Vec<_>>(),
            vec!["decode-0", "decode-1", "prefill-0", "prefill-1", "router-0"]
        );
    }
}

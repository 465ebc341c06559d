//! Importing RoleBasedGroup port settings into a PortAllocation.
//!
//! RBG reads `rolebasedgroup.workloads.x-k8s.io/port-allocator` from each component's pod
//! template: `{"allocations": [{name, env, annotationKey, scope}], "references": [{env, from}]}`,
//! `scope` being `PodScoped` (default) or `RoleScoped` (an earlier draft said
//! `policy: Dynamic|Static`, accepted too). `component-discovery` (customComponentsPattern)
//! adds `portRefs` and `addressRefs` to components of the same role instance.
//!
//! Mapping: each (role, component) becomes one role here — the role's own name for a standalone
//! role, `<role>-leader` / `<role>-worker` for leaderWorkerPattern, `<role>-<component>` for
//! customComponentsPattern — with replicas = role replicas × component size, pods numbered
//! instance by instance. RBG resolves a v1alpha2 reference `<role>.<component>.<port>` from pod
//! 0 of that component *in the referencing pod's own role instance*; here it becomes
//! `<our role>.<port>[0]`, which is exact for one instance and is instance 0's port otherwise
//! (a note says so: groups are not expressible yet). v1alpha1's `<role>.<port>` names another
//! role, so it maps to that role's port unchanged.

mod config;
mod shape;

use serde_json::Value;
use thiserror::Error;

use super::{PortAllocation, PortAllocationSpec, PortReference, PortRequest, PortScope, Role};
use config::{ComponentRef, parse_allocator, parse_discovery};
use shape::{Annotation, Pattern, RbgRole};

pub const RBG_ANNOTATION: &str = "rolebasedgroup.workloads.x-k8s.io/port-allocator";
pub const RBG_DISCOVERY_ANNOTATION: &str = "rolebasedgroup.workloads.x-k8s.io/component-discovery";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{object}: {field}: {message}")]
pub struct ImportError {
    pub object: String,
    pub field: String,
    pub message: String,
}

/// An error before the object's label is attached.
pub(super) struct Failure {
    field: String,
    message: String,
}

impl Failure {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Keys under RBG's two annotation prefixes: each is translated or named in a note.
fn is_rbg_key(key: &str) -> bool {
    key.starts_with("rbg.workloads.x-k8s.io/")
        || key.starts_with("rolebasedgroup.workloads.x-k8s.io/")
}

/// The result of one import: the PortAllocation and what could not be carried over.
#[derive(Debug, Clone)]
pub struct Imported {
    pub allocation: PortAllocation,
    /// Human-readable notes, e.g. annotation keys that have no equivalent here.
    pub notes: Vec<String>,
}

/// A reference waiting for every role's ports to be known.
struct Pending {
    /// Our role that gets the env.
    role: usize,
    /// The RBG role it belongs to.
    rbg_role: usize,
    env: String,
    target: Target,
    field: String,
}

enum Target {
    /// A port-allocator `from`, as written.
    From(String),
    /// A component-discovery portRef.
    PortRef {
        component: String,
        port: String,
        index: i32,
    },
}

/// Convert one RoleBasedGroup (v1alpha1 or v1alpha2, or an RBG Instance, whose roles are
/// `spec.components` with `size`) into a PortAllocation on `pool`. Components without ports
/// keep their replicas, so references to them still resolve once they have ports.
pub fn import_rbg(object: &Value, pool: &str) -> Result<Imported, ImportError> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let kind = object["kind"].as_str().unwrap_or("object").to_string();
    let label = format!("{kind} {name:?}");
    let labelled = |f: Failure| ImportError {
        object: label.clone(),
        field: f.field,
        message: f.message,
    };
    if name.is_empty() {
        return Err(labelled(Failure::new("metadata.name", "missing")));
    }
    let (roles, notes) = translate(object).map_err(labelled)?;
    let mut allocation = PortAllocation::new(
        &name,
        PortAllocationSpec {
            pool: pool.to_string(),
            roles,
            ..Default::default()
        },
    );
    allocation.metadata.namespace = object["metadata"]["namespace"].as_str().map(str::to_string);
    allocation.spec.validate().map_err(|e| ImportError {
        object: label.clone(),
        field: e.field.clone(),
        message: format!("{} (after import)", e.message),
    })?;
    Ok(Imported { allocation, notes })
}

fn translate(object: &Value) -> Result<(Vec<Role>, Vec<String>), Failure> {
    let shape = shape::read(object)?;
    let mut done = Translation {
        notes: shape
            .untranslated
            .iter()
            .map(|(key, field)| {
                format!("{field}: annotation {key:?} is not translated (no equivalent here)")
            })
            .collect(),
        ..Translation::default()
    };
    for (r, rbg_role) in shape.roles.iter().enumerate() {
        if rbg_role.pattern == Pattern::LeaderWorker {
            let workers = rbg_role.components.get(1).map_or(0, |c| c.size);
            done.notes.push(format!(
                "{}: leaderWorkerPattern with {} group(s) of {} pod(s) becomes roles {}-leader and {}-worker \
                 (pods numbered group by group); RBG's per-group leader address (RBG_LWP_LEADER_ADDRESS) is not expressible yet",
                rbg_role.at,
                rbg_role.replicas,
                workers + 1,
                rbg_role.name,
                rbg_role.name
            ));
        }
        for c in 0..rbg_role.components.len() {
            done.add_component(r, rbg_role, c)?;
        }
    }
    let Translation {
        mut roles,
        origin,
        pending,
        mut notes,
    } = done;
    resolve_references(&shape, &mut roles, &origin, pending, &mut notes)?;
    Ok((roles, notes))
}

/// What the translation gathers, component by component. References wait in `pending` until
/// every role's ports are known, since they may name a role translated later.
#[derive(Default)]
struct Translation {
    roles: Vec<Role>,
    /// (RBG role, component) of each of our roles.
    origin: Vec<(usize, usize)>,
    pending: Vec<Pending>,
    notes: Vec<String>,
}

impl Translation {
    /// Component `c` of RBG role `r` as one of our roles, from its pod-template annotations.
    fn add_component(&mut self, r: usize, rbg_role: &RbgRole, c: usize) -> Result<(), Failure> {
        let component = &rbg_role.components[c];
        let pods = i64::from(rbg_role.replicas) * i64::from(component.size);
        if pods > i64::from(super::MAX_REPLICAS) {
            return Err(Failure::new(
                format!("{}.replicas", rbg_role.at),
                format!(
                    "{} replicas × {} pods of component {:?} = {pods} pods, more than {}",
                    rbg_role.replicas,
                    component.size,
                    component.name,
                    super::MAX_REPLICAS
                ),
            ));
        }
        let mut role = Role {
            name: component.role.clone(),
            replicas: pods as i32,
            ports: Vec::new(),
            references: Vec::new(),
            ..Default::default()
        };
        for (key, annotation) in &component.annotations {
            let field = &annotation.field;
            if key == RBG_ANNOTATION {
                self.add_allocator(r, &mut role, annotation)?;
            } else if key == RBG_DISCOVERY_ANNOTATION {
                self.add_discovery(r, rbg_role, annotation)?;
            } else if is_rbg_key(key) {
                self.notes.push(format!(
                    "{field}: annotation {key:?} is not translated (no equivalent here)"
                ));
            }
        }
        self.roles.push(role);
        self.origin.push((r, c));
        Ok(())
    }

    /// The port-allocator annotation: its allocations become `role`'s ports, its references
    /// wait for every role.
    fn add_allocator(
        &mut self,
        r: usize,
        role: &mut Role,
        annotation: &Annotation,
    ) -> Result<(), Failure> {
        let config = parse_allocator(&annotation.value, &annotation.field)?;
        for allocation in config.allocations {
            if let Some(key) = allocation.annotation_key {
                self.notes.push(format!(
                    "{}.{}: annotationKey {key:?} is not carried over; pods read their ports from env \
                     (`kubectl portalloc resolve`) or the ConfigMap (`resolve --all -o configmap`)",
                    role.name, allocation.name
                ));
            }
            role.ports.push(PortRequest {
                name: allocation.name,
                scope: allocation.scope,
                env: allocation.env,
                port: None,
                ..Default::default()
            });
        }
        for reference in config.references {
            self.pending.push(Pending {
                role: self.roles.len(),
                rbg_role: r,
                env: reference.env,
                target: Target::From(reference.from),
                field: reference.field,
            });
        }
        Ok(())
    }

    /// The component-discovery annotation: its portRefs become references, waiting for every
    /// role; its addressRefs are checked and named in a note, since references carry ports.
    fn add_discovery(
        &mut self,
        r: usize,
        rbg_role: &RbgRole,
        annotation: &Annotation,
    ) -> Result<(), Failure> {
        let field = &annotation.field;
        if rbg_role.pattern != Pattern::Custom {
            self.notes.push(format!(
                "{field}: RBG applies component-discovery to customComponentsPattern roles only; not translated"
            ));
            return Ok(());
        }
        let discovery = parse_discovery(&annotation.value, field)?;
        for address in &discovery.address_refs {
            let target = find_component(rbg_role, address)?;
            self.notes.push(format!(
                "{}: addressRef {} (address of pod {} of component {:?}, {}) is not carried over: \
                 references carry ports only",
                address.field, address.env, address.index, address.component, target.role
            ));
        }
        for port_ref in discovery.port_refs {
            find_component(rbg_role, &port_ref)?;
            self.pending.push(Pending {
                role: self.roles.len(),
                rbg_role: r,
                env: port_ref.env,
                target: Target::PortRef {
                    component: port_ref.component,
                    port: port_ref.port_name,
                    index: port_ref.index,
                },
                field: port_ref.field,
            });
        }
        Ok(())
    }
}

/// The component a portRef or addressRef names, in the same role, with the pod in range.
fn find_component<'a>(
    rbg_role: &'a RbgRole,
    reference: &ComponentRef,
) -> Result<&'a shape::Component, Failure> {
    let Some(component) = rbg_role
        .components
        .iter()
        .find(|c| c.name == reference.component)
    else {
        return Err(Failure::new(
            format!("{}.component", reference.field),
            format!(
                "names component {:?}, which role {:?} does not have (components: {})",
                reference.component,
                rbg_role.name,
                names(rbg_role.components.iter().map(|c| c.name.as_str()))
            ),
        ));
    };
    if reference.index >= component.size {
        return Err(Failure::new(
            format!("{}.index", reference.field),
            format!(
                "pod {} of component {:?} does not exist: it has {} pod(s) per instance",
                reference.index, component.name, component.size
            ),
        ));
    }
    Ok(component)
}

fn names<'a>(list: impl Iterator<Item = &'a str>) -> String {
    list.collect::<Vec<_>>().join(", ")
}

fn resolve_references(
    shape: &shape::Shape,
    roles: &mut [Role],
    origin: &[(usize, usize)],
    pending: Vec<Pending>,
    notes: &mut Vec<String>,
) -> Result<(), Failure> {
    let role_of = |r: usize, c: usize| origin.iter().position(|o| *o == (r, c));
    // RBG roles with several instances whose intra-instance references were translated.
    let mut grouped: Vec<(usize, Vec<String>)> = Vec::new();
    for p in pending {
        let own = &shape.roles[p.rbg_role];
        let (target, port, index, intra) = match &p.target {
            Target::PortRef {
                component,
                port,
                index,
            } => {
                let c = own.components.iter().position(|c| &c.name == component);
                (
                    c.and_then(|c| role_of(p.rbg_role, c)),
                    port.clone(),
                    *index,
                    true,
                )
            }
            Target::From(from) => {
                let (target, port, intra) =
                    target_of_from(shape, p.rbg_role, from, &p.field, notes)?;
                (role_of(target.0, target.1), port, 0, intra)
            }
        };
        let target = target.expect("every component is a role");
        let target_role = &roles[target];
        let Some(request) = target_role.ports.iter().find(|q| q.name == port) else {
            return Err(Failure::new(
                p.field,
                format!(
                    "names port {port:?}, which role {:?} does not have (ports: {})",
                    target_role.name,
                    names(target_role.ports.iter().map(|q| q.name.as_str()))
                ),
            ));
        };
        let from = match request.scope {
            PortScope::RoleScoped => {
                if shape.v1alpha2 && matches!(p.target, Target::From(_)) {
                    notes.push(format!(
                        "{}: {} names RoleScoped port {}.{port}, which RBG's port-allocator does not resolve \
                         (it looks up PodScoped ports only); here it reads the shared port",
                        p.field, p.env, target_role.name
                    ));
                }
                format!("{}.{port}", target_role.name)
            }
            PortScope::PodScoped if target_role.replicas == 1 && index == 0 => {
                format!("{}.{port}", target_role.name)
            }
            PortScope::PodScoped => {
                if matches!(p.target, Target::From(_)) {
                    notes.push(format!(
                        "{}: {} is a PodScoped port of a role with several pods; RBG resolves it from pod 0, so it \
                         becomes {}.{port}[0] (use [*] for every pod's port)",
                        roles[p.role].name, p.env, target_role.name
                    ));
                }
                format!("{}.{port}[{index}]", target_role.name)
            }
        };
        if intra && own.replicas > 1 {
            match grouped.iter_mut().find(|(r, _)| *r == p.rbg_role) {
                Some((_, envs)) => envs.push(p.env.clone()),
                None => grouped.push((p.rbg_role, vec![p.env.clone()])),
            }
        }
        roles[p.role].references.push(PortReference {
            env: p.env,
            from,
            ..Default::default()
        });
    }
    for (r, envs) in grouped {
        let role = &shape.roles[r];
        notes.push(format!(
            "{}: role {:?} has {} instances and RBG resolves {} within each instance; here every instance's pods \
             get instance 0's ports (groups are not expressible yet)",
            role.at,
            role.name,
            role.replicas,
            envs.join(", ")
        ));
    }
    Ok(())
}

/// The (RBG role, component) and port a port-allocator `from` names, and whether it resolves
/// within the referencing role instance.
fn target_of_from(
    shape: &shape::Shape,
    own: usize,
    from: &str,
    field: &str,
    notes: &mut Vec<String>,
) -> Result<((usize, usize), String, bool), Failure> {
    let role_names = || names(shape.roles.iter().map(|r| r.name.as_str()));
    let find_role = |name: &str| shape.roles.iter().position(|r| r.name == name);
    let own_role = &shape.roles[own];
    let in_own = |component: &str| own_role.components.iter().position(|c| c.name == component);
    let parts: Vec<&str> = from.split('.').collect();
    match parts.as_slice() {
        [role, component, port] if parts.iter().all(|p| !p.is_empty()) => {
            if find_role(role).is_none() {
                return Err(Failure::new(
                    field,
                    format!(
                        "{from:?} names role {role:?}, which this RoleBasedGroup does not have (roles: {})",
                        role_names()
                    ),
                ));
            }
            let Some(c) = in_own(component) else {
                return Err(Failure::new(
                    field,
                    format!(
                        "{from:?} names component {component:?}, which role {:?} does not have (components: {}); \
                         RBG resolves references within the referencing role's instance",
                        own_role.name,
                        names(own_role.components.iter().map(|c| c.name.as_str()))
                    ),
                ));
            };
            if *role != own_role.name {
                notes.push(format!(
                    "{field}: {from:?} names role {role:?}, but RBG resolves it within role {:?}'s own instance, \
                     so it reads {}'s port",
                    own_role.name, own_role.components[c].role
                ));
            }
            Ok(((own, c), port.to_string(), true))
        }
        [_, _] if shape.v1alpha2 => Err(Failure::new(
            field,
            format!("{from:?}: RBG v1alpha2 expects <role>.<component>.<port>"),
        )),
        // v1alpha1: `<role>.<port>` names a one-component role, or a component of this role.
        [name, port] if !name.is_empty() && !port.is_empty() => {
            if let Some(r) = find_role(name) {
                if shape.roles[r].components.len() != 1 {
                    return Err(Failure::new(
                        field,
                        format!(
                            "{from:?}: role {name:?} has several components; write {name}.<component>.{port}"
                        ),
                    ));
                }
                return Ok(((r, 0), port.to_string(), false));
            }
            if let Some(c) = in_own(name) {
                return Ok(((own, c), port.to_string(), true));
            }
            Err(Failure::new(
                field,
                format!(
                    "{from:?} names role {name:?}, which this RoleBasedGroup does not have (roles: {})",
                    role_names()
                ),
            ))
        }
        _ => Err(Failure::new(
            field,
            format!("{from:?} is not <role>.<component>.<port>"),
        )),
    }
}

#[cfg(test)]
#[path = "rbg_tests.rs"]
mod tests;

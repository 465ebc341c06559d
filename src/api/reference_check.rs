//! A role's references checked against the spec: the role, port and placeholders they name
//! exist, indices are in range, and addresses exist where `{address}` asks for one. What comes
//! out is what resolving needs, so a reference that passes here resolves once allocated.

use super::validate::{SpecError, spec_error};
use super::{PortAllocationSpec, PortReference, PortScope, Role, WorkloadKind};
use crate::core::{FormatPart, Reference, Selector, parse_format};

/// What a reference resolves to, once checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CheckedReference<'a> {
    pub reference: Reference,
    /// The role it points at.
    pub target: &'a Role,
    pub kind: ReferenceKind,
    /// What goes between values of `[*]`.
    pub join: String,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReferenceKind {
    /// `role.port...`: the port's scope.
    Port { port: String, scope: PortScope },
    /// `role`, `role[i]`, `role[*]`: each pod written with these parts.
    Pods(Vec<FormatPart>),
}

const DEFAULT_FORMAT: &str = "{address}";

impl PortAllocationSpec {
    /// Checks reference `k` of role `r` (`at` is its field path, `spec.roles[r].references[k]`).
    pub(crate) fn check_reference<'a>(
        &'a self,
        at: &str,
        reference: &PortReference,
    ) -> Result<CheckedReference<'a>, SpecError> {
        let from = format!("{at}.from");
        let text = reference.from.as_str();
        let parsed = Reference::parse(text).map_err(|e| spec_error(&from, e.to_string()))?;
        let Some(target) = self.role(&parsed.role) else {
            return Err(spec_error(
                &from,
                format!(
                    "reference {text:?} names role {:?}, which does not exist (roles: {})",
                    parsed.role,
                    names(self.roles.iter().map(|r| r.name.as_str()))
                ),
            ));
        };
        let join = reference.join.clone().unwrap_or_else(|| ",".to_string());
        let kind = match &parsed.port {
            Some(port) => {
                if reference.format.is_some() {
                    return Err(spec_error(
                        format!("{at}.format"),
                        format!(
                            "format applies to pod references (role, role[i], role[*]); {text:?} is a port"
                        ),
                    ));
                }
                let scope = check_port_reference(&from, text, target, port, parsed.selector)?;
                ReferenceKind::Port {
                    port: port.clone(),
                    scope,
                }
            }
            None => {
                check_selector(&from, text, target, parsed.selector, "")?;
                // Errors about the format name the field that holds it, the default one `from`.
                let (field, format) = match &reference.format {
                    Some(format) => (format!("{at}.format"), format.as_str()),
                    None => (from.clone(), DEFAULT_FORMAT),
                };
                ReferenceKind::Pods(check_format(&field, format, target)?)
            }
        };
        Ok(CheckedReference {
            reference: parsed,
            target,
            kind,
            join,
        })
    }
}

fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

/// Replicas here are per group: a reference selects pods of the referencing pod's own group.
fn check_selector(
    field: &str,
    text: &str,
    target: &Role,
    selector: Selector,
    port: &str,
) -> Result<(), SpecError> {
    let name = &target.name;
    match selector {
        Selector::Single if target.replicas != 1 => Err(spec_error(
            field,
            format!(
                "reference {text:?} is ambiguous: role {name:?} has {} replicas; \
                 write {name}{port}[i] for one pod or {name}{port}[*] for all",
                target.replicas
            ),
        )),
        Selector::Index(i) if i >= target.per_group() => Err(spec_error(
            field,
            format!(
                "reference {text:?} is out of range: role {name:?} has {} replicas (indices 0..{})",
                target.replicas,
                target.replicas.saturating_sub(1)
            ),
        )),
        _ => Ok(()),
    }
}

fn check_port_reference(
    field: &str,
    text: &str,
    target: &Role,
    port: &str,
    selector: Selector,
) -> Result<PortScope, SpecError> {
    let Some(request) = target.ports.iter().find(|p| p.name == port) else {
        return Err(spec_error(
            field,
            format!(
                "reference {text:?} names port {port:?}, which role {:?} does not have (ports: {})",
                target.name,
                names(target.ports.iter().map(|p| p.name.as_str()))
            ),
        ));
    };
    match (request.scope, selector) {
        (PortScope::PodScoped, _) => {
            check_selector(field, text, target, selector, &format!(".{port}"))?
        }
        (PortScope::RoleScoped, Selector::Index(i)) if i != 0 => {
            return Err(spec_error(
                field,
                format!(
                    "reference {text:?} indexes a RoleScoped port, which has one value: write {}.{port}",
                    target.name
                ),
            ));
        }
        (PortScope::RoleScoped, _) => {}
    }
    Ok(request.scope)
}

/// The format's parts, each placeholder known for `target`'s pods.
fn check_format(field: &str, format: &str, target: &Role) -> Result<Vec<FormatPart>, SpecError> {
    let parts = parse_format(format).map_err(|e| spec_error(field, e.to_string()))?;
    for part in &parts {
        match part {
            FormatPart::Address if !target.has_address() => {
                return Err(spec_error(field, target.no_address_reason()));
            }
            FormatPart::Pod
                if target
                    .workload
                    .as_ref()
                    .is_some_and(|w| w.kind == WorkloadKind::Deployment) =>
            {
                return Err(spec_error(
                    field,
                    format!(
                        "{{pod}}: role {}'s pods belong to a Deployment, whose pod names are random",
                        target.name
                    ),
                ));
            }
            FormatPart::Port { name, .. } if !target.ports.iter().any(|p| &p.name == name) => {
                return Err(spec_error(
                    field,
                    format!(
                        "format {format:?} has an unknown placeholder {{{name}}}: role {:?} has no such port (ports: {}; other placeholders: {{address}}, {{pod}}, {{index}})",
                        target.name,
                        names(target.ports.iter().map(|p| p.name.as_str()))
                    ),
                ));
            }
            _ => {}
        }
    }
    Ok(parts)
}

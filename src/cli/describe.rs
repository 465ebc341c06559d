//! `kubectl portalloc describe NAME`: every role, pod, port, env and reference of one
//! PortAllocation, with its conditions.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use clap::Args;
use kube::ResourceExt;

use super::output::{Paint, age};
use super::{GlobalArgs, Session};
use crate::api::{PortAllocation, PortAllocationStatus, PortScope, Role};
use crate::k8s::get_allocation;
use crate::ledger::{recorded_copies, recorded_holdings};

/// Show every role, pod index, port, env name and resolved reference of a PortAllocation.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  kubectl portalloc describe sglang-pd -n llm")]
pub struct DescribeArgs {
    pub name: String,
}

pub async fn run(global: &GlobalArgs, args: DescribeArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let pa = get_allocation(&session.client, &session.namespace, &args.name).await?;
    print!("{}", describe_text(&pa, &Paint::for_stdout()));
    Ok(())
}

/// The describe page. Pure, so it is tested without a cluster.
pub fn describe_text(pa: &PortAllocation, paint: &Paint) -> String {
    let status = pa.status.clone().unwrap_or_default();
    let mut out = String::new();
    write_summary(&mut out, pa, &status, paint);
    let _ = writeln!(out, "Roles:");
    for (r, role) in pa.spec.roles.iter().enumerate() {
        write_role(&mut out, pa, r, role, paint);
    }
    write_conditions(&mut out, pa, &status);
    write_notes(&mut out, pa, paint);
    out
}

/// The lines above the roles: what the object is, where it allocates from, and how far it got.
fn write_summary(
    out: &mut String,
    pa: &PortAllocation,
    status: &PortAllocationStatus,
    paint: &Paint,
) {
    let _ = writeln!(out, "Name:         {}", pa.name_any());
    let _ = writeln!(out, "Namespace:    {}", pa.namespace().unwrap_or_default());
    let pool_uid = status
        .pool_uid
        .as_deref()
        .map(|u| format!(" (uid {u})"))
        .unwrap_or_default();
    let _ = writeln!(out, "Pool:         {}{pool_uid}", pa.spec.pool);
    let phase = status
        .phase
        .map(|p| p.to_string())
        .unwrap_or_else(|| "Pending".into());
    let _ = writeln!(out, "Phase:        {}", paint.phase(&phase));
    let desired = pa.spec.desired_port_count();
    let _ = writeln!(
        out,
        "Ports:        {}",
        status
            .ports
            .clone()
            .unwrap_or_else(|| format!("0/{desired}"))
    );
    write_copies(out, status);
    let _ = writeln!(
        out,
        "Age:          {}",
        age(pa.metadata.creation_timestamp.as_ref())
    );
}

/// Which copies of a pool with reuse hold its ports (nothing when copy 0 holds them all): one
/// copy past the first, or several for a workload bigger than one copy.
fn write_copies(out: &mut String, status: &PortAllocationStatus) {
    let holdings = recorded_holdings(status);
    let mut ports: BTreeMap<u16, u32> = BTreeMap::new();
    for (slot, copy) in recorded_copies(status) {
        *ports.entry(copy).or_default() += holdings.block(&slot).map_or(0, |b| u32::from(b.count));
    }
    let shared = "pods on other nodes hold the same ports; each pod declares its own as hostPorts";
    match ports.keys().collect::<Vec<_>>()[..] {
        [] | [0] => {}
        [copy] => {
            let _ = writeln!(out, "Copy:         {copy} ({shared})");
        }
        _ => {
            let each: Vec<String> = ports
                .iter()
                .map(|(copy, n)| format!("{copy} ({n} ports)"))
                .collect();
            let _ = writeln!(
                out,
                "Copies:       {}: pods spread over copies, each pod's ports in one ({shared})",
                each.join(", ")
            );
        }
    }
}

/// Role `r`: a table of its ports per pod, then its references resolved.
fn write_role(out: &mut String, pa: &PortAllocation, r: usize, role: &Role, paint: &Paint) {
    let plural = if role.replicas == 1 { "" } else { "s" };
    let _ = writeln!(out, "  {} ({} replica{plural})", role.name, role.replicas);
    if role.ports.is_empty() && role.references.is_empty() {
        let _ = writeln!(out, "    <no ports>");
    }
    if !role.ports.is_empty() {
        let group = if pa.spec.group_count() > 1 {
            format!("{:<6} ", "GROUP")
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "    {group}{:<6} {:<16} {:<11} {:<7} ENV",
            "POD", "PORT", "SCOPE", "VALUE"
        );
    }
    write_port_rows(out, pa, role, paint);
    if role.replicas == 0 && !role.ports.is_empty() {
        let _ = writeln!(out, "    (no pods: nothing allocated)");
    }
    if !role.references.is_empty() {
        let _ = writeln!(out, "    References:");
        for (i, reference) in role.references.iter().enumerate() {
            let value = match pa.resolve_reference_at(r, i) {
                Ok(value) => value,
                Err(e) => paint.warn(&format!("<{e}>")),
            };
            let _ = writeln!(
                out,
                "      {} = {}  (from {})",
                reference.env, value, reference.from
            );
        }
    }
}

/// One row per pod and port, group by group; a RoleScoped port is one port for all pods of a
/// group, so one row per group. With groups the POD column is the pod's index in the workload
/// (`group * replicas + index`, as `resolve --index` takes it).
fn write_port_rows(out: &mut String, pa: &PortAllocation, role: &Role, paint: &Paint) {
    let groups = pa.spec.group_count();
    let per_group = role.per_group();
    for group in 0..groups {
        let group_column = if groups > 1 {
            format!("{group:<6} ")
        } else {
            String::new()
        };
        for index in 0..per_group {
            for port in &role.ports {
                let values = pa.allocated_values(&role.name, &port.name);
                let flat = group * per_group + index;
                let (pod, value) = match port.scope {
                    PortScope::RoleScoped if index > 0 => continue,
                    PortScope::RoleScoped => ("all".to_string(), values.get(group as usize)),
                    PortScope::PodScoped => (flat.to_string(), values.get(flat as usize)),
                };
                let value = value
                    .map(u16::to_string)
                    .unwrap_or_else(|| paint.warn("<none>"));
                let requested = if port.port.is_some() {
                    " (requested)"
                } else {
                    ""
                };
                let _ = writeln!(
                    out,
                    "    {group_column}{pod:<6} {:<16} {:<11} {value:<7} {}{requested}",
                    port.name,
                    port.scope.to_string(),
                    port.env
                );
            }
        }
    }
}

/// The conditions, or the command that would set them.
fn write_conditions(out: &mut String, pa: &PortAllocation, status: &PortAllocationStatus) {
    let _ = writeln!(out, "Conditions:");
    if status.conditions.is_empty() {
        let _ = writeln!(
            out,
            "  <none>: run `kubectl portalloc sync {} -n {}`",
            pa.name_any(),
            pa.namespace().unwrap_or_default()
        );
    }
    for condition in &status.conditions {
        let _ = writeln!(
            out,
            "  {}={}  reason {}  since {}",
            condition.type_,
            condition.status,
            condition.reason,
            age(Some(&condition.last_transition_time))
        );
        let _ = writeln!(out, "    {}", condition.message);
    }
}

/// A warning for each role whose pods share a RoleScoped port: two of them on one node's host
/// network would collide on it.
fn write_notes(out: &mut String, pa: &PortAllocation, paint: &Paint) {
    let role_scoped: Vec<&str> = pa
        .spec
        .roles
        .iter()
        .filter(|role| {
            role.ports.iter().any(|p| p.scope == PortScope::RoleScoped) && role.replicas > 1
        })
        .map(|role| role.name.as_str())
        .collect();
    if role_scoped.is_empty() {
        return;
    }
    let _ = writeln!(out, "Notes:");
    for role in role_scoped {
        let _ = writeln!(
            out,
            "  - {}",
            paint.warn(&format!(
                "role {role} has RoleScoped ports shared by all its pods: on hostNetwork give the role \
                 pod anti-affinity (kubernetes.io/hostname) so two of its pods never share a node"
            ))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PortAssignment;

    fn status(values: Vec<i32>, copies: Vec<i32>, shards: Vec<i32>) -> PortAllocationStatus {
        PortAllocationStatus {
            assignments: vec![PortAssignment {
                role: "engine".into(),
                port: "http".into(),
                scope: PortScope::PodScoped,
                env: "HTTP_PORT".into(),
                values,
                copies,
                ..Default::default()
            }],
            shards,
            ..Default::default()
        }
    }

    fn copies_line(status: &PortAllocationStatus) -> String {
        let mut out = String::new();
        write_copies(&mut out, status);
        out
    }

    #[test]
    fn every_group_has_its_rows() {
        let mut pa: PortAllocation = serde_yaml::from_str(
            "apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: lws, namespace: llm}
spec:
  pool: p
  groups: 2
  roles:
  - name: worker
    replicas: 2
    ports:
    - {name: http, scope: PodScoped, env: HTTP_PORT}
    - {name: dist, scope: RoleScoped, env: DIST_PORT}
",
        )
        .unwrap();
        pa.status = Some(PortAllocationStatus {
            assignments: vec![
                PortAssignment {
                    role: "worker".into(),
                    port: "http".into(),
                    scope: PortScope::PodScoped,
                    env: "HTTP_PORT".into(),
                    values: vec![100, 101, 102, 103],
                    ..Default::default()
                },
                PortAssignment {
                    role: "worker".into(),
                    port: "dist".into(),
                    scope: PortScope::RoleScoped,
                    env: "DIST_PORT".into(),
                    values: vec![200, 201],
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let text = describe_text(&pa, &Paint::default());
        let rows: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| l.contains("_PORT"))
            .map(|l| l.split_whitespace().collect())
            .collect();
        let values: Vec<(&str, &str, &str)> = rows.iter().map(|r| (r[0], r[1], r[4])).collect();
        assert_eq!(
            values,
            [
                ("0", "0", "100"),
                ("0", "all", "200"),
                ("0", "1", "101"),
                ("1", "2", "102"),
                ("1", "all", "201"),
                ("1", "3", "103"),
            ],
            "{text}"
        );
        assert!(text.contains("GROUP  POD"), "{text}");
    }

    #[test]
    fn copies_are_told_only_past_the_first_and_spread_ones_by_ports() {
        assert_eq!(copies_line(&status(vec![100, 101], vec![], vec![0])), "");
        let one = copies_line(&status(vec![100, 101], vec![], vec![256]));
        assert!(
            one.starts_with("Copy:         1 (pods on other nodes"),
            "{one}"
        );
        let spread = copies_line(&status(vec![100, 101, 100], vec![0, 0, 1], vec![0, 256]));
        assert!(
            spread.starts_with("Copies:       0 (2 ports), 1 (1 ports): pods spread over copies"),
            "{spread}"
        );
    }
}

//! Client-side checks of specs, and their translation into the pure core's terms.
//!
//! The API server enforces what its schema and CEL can express; these checks repeat the parts the
//! core relies on (so input from any source is safe) and add what CEL cannot see: references
//! resolved against the other roles. Every error carries the field path it is about.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use super::{
    GuardMode, LwsMember, PortAllocationSpec, PortPoolSpec, PortRequest, PortScope, Protocol, Role,
    StaticBandSetting, WorkloadKind,
};
use crate::core::{self, PortDemand, PortSet, SlotKey};

/// A spec that cannot be used as written, with the field that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// JSON path, e.g. `spec.roles[1].references[0].from`.
    pub field: String,
    pub message: String,
}

pub(crate) fn spec_error(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

impl PortPoolSpec {
    /// The ports this pool hands out: its ranges (which must not overlap) minus its exclusions
    /// (which must lie inside the ranges).
    pub fn port_set(&self) -> Result<PortSet, SpecError> {
        self.check_copies()?;
        if self.ranges.is_empty() {
            return Err(spec_error(
                "spec.ranges",
                "a pool needs at least one range, e.g. \"30000-32767\"",
            ));
        }
        let ranges =
            PortSet::parse_disjoint(&self.ranges.iter().map(|r| r.as_str()).collect::<Vec<_>>())
                .map_err(|e| spec_error("spec.ranges", e.to_string()))?;
        let mut excluded = PortSet::empty();
        for (i, text) in self.exclude.iter().enumerate() {
            let one = PortSet::parse_list(&[text.as_str()])
                .map_err(|e| spec_error(format!("spec.exclude[{i}]"), e.to_string()))?;
            if !one.is_subset_of(&ranges) {
                return Err(spec_error(
                    format!("spec.exclude[{i}]"),
                    format!("exclusion {text:?} is not inside the pool's ranges {ranges}"),
                ));
            }
            excluded = PortSet::from_ranges(excluded.ranges().iter().chain(one.ranges()).copied());
        }
        Ok(ranges.subtract(&excluded))
    }

    pub fn core_static_band(&self) -> core::StaticBand {
        match self.static_band {
            StaticBandSetting::Auto => core::StaticBand::Auto,
            StaticBandSetting::None => core::StaticBand::None,
            StaticBandSetting::Count(n) => core::StaticBand::Count(n),
        }
    }

    /// A fixed number of copies or copies that follow the nodes, not both (the schema's CEL
    /// rule, repeated for specs from any source).
    pub fn check_copies(&self) -> Result<(), SpecError> {
        match (self.node_reuse, &self.follow_nodes) {
            (Some(n), Some(_)) if n > 1 => Err(spec_error(
                "spec.followNodes",
                format!(
                    "nodeReuse is {n} and followNodes is set: a pool has either a fixed number \
                     of copies or copies that follow the nodes. Keep followNodes and remove \
                     nodeReuse (the copies then follow the nodes counted), or keep nodeReuse and \
                     remove followNodes"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// No guard on an SCTP pool (the schema's CEL rule, repeated for specs from any source):
    /// the kernel hands an SCTP bind to `sctp_bind`, which runs no cgroup `bind4`/`bind6` hook,
    /// so a guard there would be described as judging binds it never sees.
    pub fn check_guard(&self) -> Result<(), SpecError> {
        match (self.protocol, self.guard_mode()) {
            (Protocol::Sctp, mode @ (GuardMode::Audit | GuardMode::Enforce)) => Err(spec_error(
                "spec.guard",
                format!(
                    "guard {mode} cannot be set on an SCTP pool: the kernel hands an SCTP bind to \
                     sctp_bind, which runs no cgroup bind4/bind6 hook, so the node agent can \
                     neither see nor refuse it. Set guard to Off or remove it; the agent still \
                     keeps the pool's ports out of the kernel's ephemeral choice"
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl From<PortScope> for core::Scope {
    fn from(scope: PortScope) -> Self {
        match scope {
            PortScope::RoleScoped => core::Scope::RoleScoped,
            PortScope::PodScoped => core::Scope::PodScoped,
        }
    }
}

impl PortAllocationSpec {
    /// Every check, then the demands the planner works from.
    pub fn demands(&self) -> Result<Vec<PortDemand>, SpecError> {
        self.validate()?;
        let mut demands = Vec::new();
        // One demand per group: slots are keyed by (group, index in group), so a pod keeps
        // its port when the replicas per group change.
        for group in 0..self.group_count() {
            for role in &self.roles {
                for port in &role.ports {
                    demands.push(PortDemand {
                        role: SlotKey::in_group(&role.name, "", group, 0).role,
                        port: port.name.clone(),
                        scope: port.scope.into(),
                        replicas: role.per_group(),
                        requested: port.port.map(|p| p as u16),
                        count: port.count.map_or(1, |c| c.max(1) as u32),
                    });
                }
            }
        }
        Ok(demands)
    }

    /// How many slots (held ports, or blocks) `port` of `role` takes: one per pod for PodScoped
    /// (G x replicas, flat pod index), one per group for RoleScoped (none without pods).
    pub fn slot_count(&self, role: &Role, port: &PortRequest) -> u32 {
        match port.scope {
            PortScope::RoleScoped if role.replicas > 0 => self.group_count(),
            PortScope::RoleScoped => 0,
            PortScope::PodScoped => self.group_count() * role.per_group(),
        }
    }

    /// Checks that do not need the cluster: names, bounds, uniqueness, requested ports,
    /// and every reference resolved against the roles.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.pool.is_empty() {
            return Err(spec_error(
                "spec.pool",
                "name the PortPool to allocate from",
            ));
        }
        if self.roles.is_empty() {
            return Err(spec_error("spec.roles", "at least one role is needed"));
        }
        if let Some(groups) = self.groups
            && !(1..=super::MAX_REPLICAS).contains(&groups)
        {
            return Err(spec_error(
                "spec.groups",
                format!("{groups} is outside 1..{}", super::MAX_REPLICAS),
            ));
        }
        // Role names and requested ports are unique across the roles, so both are gathered
        // over all of them.
        let mut role_names = BTreeSet::new();
        let mut requested: BTreeMap<i32, String> = BTreeMap::new();
        for (r, role) in self.roles.iter().enumerate() {
            self.check_role(r, role, &mut role_names, &mut requested)?;
        }
        self.check_pod_names()
    }

    /// One role: its name, replicas, workload, ports and references. An env name is set once
    /// per role, whether by a port or a reference.
    fn check_role<'a>(
        &self,
        r: usize,
        role: &'a Role,
        role_names: &mut BTreeSet<&'a str>,
        requested: &mut BTreeMap<i32, String>,
    ) -> Result<(), SpecError> {
        let at = format!("spec.roles[{r}]");
        check_name(&format!("{at}.name"), &role.name)?;
        if !role_names.insert(role.name.as_str()) {
            return Err(spec_error(
                format!("{at}.name"),
                format!("role {:?} is listed twice", role.name),
            ));
        }
        if !(0..=super::MAX_REPLICAS).contains(&role.replicas) {
            return Err(spec_error(
                format!("{at}.replicas"),
                format!("{} is outside 0..{}", role.replicas, super::MAX_REPLICAS),
            ));
        }
        self.check_workload(&at, role)?;
        let mut port_names = BTreeSet::new();
        let mut envs = BTreeMap::new();
        for (p, port) in role.ports.iter().enumerate() {
            let at = format!("{at}.ports[{p}]");
            check_name(&format!("{at}.name"), &port.name)?;
            if !port_names.insert(port.name.as_str()) {
                return Err(spec_error(
                    format!("{at}.name"),
                    format!(
                        "port {:?} is listed twice in role {:?}",
                        port.name, role.name
                    ),
                ));
            }
            let named = [
                ("env", Some(&port.env)),
                ("lastEnv", port.last_env.as_ref()),
                ("rangeEnv", port.range_env.as_ref()),
            ];
            for (key, env) in named {
                if let Some(env) = env {
                    claim_env(&mut envs, format!("{at}.{key}"), env, &role.name)?;
                }
            }
            self.check_port_numbers(&at, role, port, requested)?;
        }
        for (i, reference) in role.references.iter().enumerate() {
            let at = format!("{at}.references[{i}]");
            claim_env(&mut envs, format!("{at}.env"), &reference.env, &role.name)?;
            self.check_reference(&at, reference)?;
        }
        Ok(())
    }

    /// A port's block size, and its requested first port if any: in range, RoleScoped, one
    /// group only, and not requested by another port.
    fn check_port_numbers(
        &self,
        at: &str,
        role: &Role,
        port: &PortRequest,
        requested: &mut BTreeMap<i32, String>,
    ) -> Result<(), SpecError> {
        let count = port.count.unwrap_or(1);
        if !(1..=i32::from(core::MAX_BLOCK)).contains(&count) {
            return Err(spec_error(
                format!("{at}.count"),
                format!("{count} is outside 1..{}", core::MAX_BLOCK),
            ));
        }
        let Some(value) = port.port else {
            return Ok(());
        };
        if (1..=65535).contains(&value) && value + count - 1 > 65535 {
            return Err(spec_error(
                format!("{at}.count"),
                format!(
                    "a block of {count} ports from port {value} would run past 65535: request a lower first port"
                ),
            ));
        }
        if !(1..=65535).contains(&value) {
            return Err(spec_error(
                format!("{at}.port"),
                format!("{value} is outside 1..65535"),
            ));
        }
        if port.scope == PortScope::PodScoped {
            return Err(spec_error(
                format!("{at}.port"),
                "a requested port must be RoleScoped: one fixed port cannot be unique per pod",
            ));
        }
        if self.group_count() > 1 {
            return Err(spec_error(
                format!("{at}.port"),
                format!(
                    "a requested port cannot serve {} groups: each group holds its own port",
                    self.group_count()
                ),
            ));
        }
        let here = format!("{}.{}", role.name, port.name);
        if let Some(other) = requested.insert(value, here.clone()) {
            return Err(spec_error(
                format!("{at}.port"),
                format!(
                    "port {value} is requested by both {other} and {here}: a port can be held once"
                ),
            ));
        }
        Ok(())
    }

    /// Each pod's env file is named after the pod, so two roles must not name the same pod.
    fn check_pod_names(&self) -> Result<(), SpecError> {
        let Some((r, pod, first)) = super::pods::colliding_pod(self) else {
            return Ok(());
        };
        let role = &self.roles[r];
        let field = if role.workload.is_some() {
            format!("spec.roles[{r}].workload.name")
        } else {
            format!("spec.roles[{r}].name")
        };
        Err(spec_error(
            field,
            format!(
                "pod {pod} of role {} is also a pod of role {}: their env files ({pod}.env) would be one",
                role.name, self.roles[first].name
            ),
        ))
    }

    /// What a role's workload allows: pod names a per-pod file can be found by, one leader per
    /// LWS group.
    fn check_workload(&self, at: &str, role: &Role) -> Result<(), SpecError> {
        let Some(workload) = &role.workload else {
            return Ok(());
        };
        check_name(&format!("{at}.workload.name"), &workload.name)?;
        let lws = workload.kind == WorkloadKind::LeaderWorkerSet;
        if lws != workload.member.is_some() {
            return Err(spec_error(
                format!("{at}.workload.member"),
                "member (Leader or Workers) is required for a LeaderWorkerSet and allowed only there",
            ));
        }
        if workload.member == Some(LwsMember::Leader) && role.replicas != 1 {
            return Err(spec_error(
                format!("{at}.replicas"),
                format!(
                    "role {} is a LeaderWorkerSet's leader: one pod per group, so replicas must be 1, not {}",
                    role.name, role.replicas
                ),
            ));
        }
        if workload.kind == WorkloadKind::Deployment {
            if self.group_count() > 1 {
                return Err(spec_error(
                    format!("{at}.workload.kind"),
                    format!(
                        "role {} is a Deployment, whose randomly named pods cannot be told apart by group; spec.groups is {}",
                        role.name,
                        self.group_count()
                    ),
                ));
            }
            if role.replicas > 1
                && let Some(p) = role
                    .ports
                    .iter()
                    .position(|p| p.scope == PortScope::PodScoped)
            {
                return Err(spec_error(
                    format!("{at}.ports[{p}].scope"),
                    format!(
                        "role {} is a Deployment with {} replicas: its pods have random names and share one env file, so a PodScoped port cannot reach each pod; use RoleScoped or a StatefulSet",
                        role.name, role.replicas
                    ),
                ));
            }
        }
        Ok(())
    }

    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| r.name == name)
    }

    /// How many ports the spec asks for in all.
    pub fn desired_port_count(&self) -> usize {
        self.roles
            .iter()
            .flat_map(|role| role.ports.iter().map(move |port| (role, port)))
            .map(|(role, port)| self.slot_count(role, port) as usize)
            .sum()
    }
}

fn check_name(field: &str, name: &str) -> Result<(), SpecError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(spec_error(
            field,
            format!(
                "{name:?} is not a valid name: use 1-63 lowercase letters, digits and '-', starting with a letter"
            ),
        ))
    }
}

/// Records that `env` is set in `role`, refusing a second use across ports (env, lastEnv,
/// rangeEnv) and references.
fn claim_env<'a>(
    envs: &mut BTreeMap<&'a str, String>,
    field: String,
    env: &'a str,
    role: &str,
) -> Result<(), SpecError> {
    check_env(&field, env)?;
    if let Some(first) = envs.get(env) {
        return Err(spec_error(
            field,
            format!("env {env:?} is used twice in role {role:?}: {first} sets it too"),
        ));
    }
    envs.insert(env, field);
    Ok(())
}

fn check_env(field: &str, env: &str) -> Result<(), SpecError> {
    let valid = env.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(spec_error(
            field,
            format!("{env:?} is not a valid environment variable name"),
        ))
    }
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;

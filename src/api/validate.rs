//! Client-side checks of specs, and their translation into the pure core's terms.
//!
//! The API server enforces what its schema and CEL can express; these checks repeat the parts the
//! core relies on (so input from any source is safe) and add what CEL cannot see: references
//! resolved against the other roles. Every error carries the field path it is about.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use super::{PortAllocationSpec, PortPoolSpec, Role, Scope, StaticBandSetting};
use crate::core::{self, PortDemand, PortSet, Reference, Selector};

/// A spec that cannot be used as written, with the field that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// JSON path, e.g. `spec.roles[1].references[0].from`.
    pub field: String,
    pub message: String,
}

fn spec_error(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

impl PortPoolSpec {
    /// The ports this pool hands out: its ranges (which must not overlap) minus its exclusions
    /// (which must lie inside the ranges).
    pub fn port_set(&self) -> Result<PortSet, SpecError> {
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
}

impl From<Scope> for core::Scope {
    fn from(scope: Scope) -> Self {
        match scope {
            Scope::RoleScoped => core::Scope::RoleScoped,
            Scope::PodScoped => core::Scope::PodScoped,
        }
    }
}

impl PortAllocationSpec {
    /// Every check, then the demands the planner works from.
    pub fn demands(&self) -> Result<Vec<PortDemand>, SpecError> {
        self.validate()?;
        let mut demands = Vec::new();
        for role in &self.roles {
            for port in &role.ports {
                demands.push(PortDemand {
                    role: role.name.clone(),
                    port: port.name.clone(),
                    scope: port.scope.into(),
                    replicas: role.replicas as u32,
                    requested: port.port.map(|p| p as u16),
                    count: port.count.map_or(1, |c| c.max(1) as u32),
                });
            }
        }
        Ok(demands)
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
        let mut role_names = BTreeSet::new();
        let mut requested: BTreeMap<i32, String> = BTreeMap::new();
        for (r, role) in self.roles.iter().enumerate() {
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
            let mut port_names = BTreeSet::new();
            let mut envs = BTreeSet::new();
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
                check_env(&format!("{at}.env"), &port.env)?;
                if !envs.insert(port.env.as_str()) {
                    return Err(spec_error(
                        format!("{at}.env"),
                        format!("env {:?} is used twice in role {:?}", port.env, role.name),
                    ));
                }
                let count = port.count.unwrap_or(1);
                if !(1..=i32::from(core::MAX_BLOCK)).contains(&count) {
                    return Err(spec_error(
                        format!("{at}.count"),
                        format!("{count} is outside 1..{}", core::MAX_BLOCK),
                    ));
                }
                if let Some(value) = port.port {
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
                    if port.scope == Scope::PodScoped {
                        return Err(spec_error(
                            format!("{at}.port"),
                            "a requested port must be RoleScoped: one fixed port cannot be unique per pod",
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
                }
            }
            for (i, reference) in role.references.iter().enumerate() {
                let at = format!("{at}.references[{i}]");
                check_env(&format!("{at}.env"), &reference.env)?;
                if !envs.insert(reference.env.as_str()) {
                    return Err(spec_error(
                        format!("{at}.env"),
                        format!(
                            "env {:?} is used twice in role {:?}",
                            reference.env, role.name
                        ),
                    ));
                }
                self.check_reference(&format!("{at}.from"), &reference.from)?;
            }
        }
        Ok(())
    }

    /// The role a reference points at, with the port, once it is known to resolve.
    fn check_reference(&self, field: &str, text: &str) -> Result<(), SpecError> {
        let reference = Reference::parse(text).map_err(|e| spec_error(field, e.to_string()))?;
        let Some(role) = self.role(&reference.role) else {
            return Err(spec_error(
                field,
                format!(
                    "reference {text:?} names role {:?}, which does not exist (roles: {})",
                    reference.role,
                    self.roles
                        .iter()
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        let Some(port) = role.ports.iter().find(|p| p.name == reference.port) else {
            return Err(spec_error(
                field,
                format!(
                    "reference {text:?} names port {:?}, which role {:?} does not have (ports: {})",
                    reference.port,
                    role.name,
                    role.ports
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        match (port.scope, reference.selector) {
            (Scope::PodScoped, Selector::Single) if role.replicas != 1 => Err(spec_error(
                field,
                format!(
                    "reference {text:?} is ambiguous: {}.{} is PodScoped and role {:?} has {} replicas; \
                     write {}.{}[i] for one pod or {}.{}[*] for all",
                    role.name,
                    port.name,
                    role.name,
                    role.replicas,
                    role.name,
                    port.name,
                    role.name,
                    port.name
                ),
            )),
            (Scope::PodScoped, Selector::Index(i)) if i >= role.replicas as u32 => Err(spec_error(
                field,
                format!(
                    "reference {text:?} is out of range: role {:?} has {} replicas (indices 0..{})",
                    role.name,
                    role.replicas,
                    role.replicas.saturating_sub(1)
                ),
            )),
            (Scope::RoleScoped, Selector::Index(i)) if i != 0 => Err(spec_error(
                field,
                format!(
                    "reference {text:?} indexes a RoleScoped port, which has one value: write {}.{}",
                    role.name, port.name
                ),
            )),
            _ => Ok(()),
        }
    }

    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| r.name == name)
    }

    /// How many ports the spec asks for in all.
    pub fn desired_port_count(&self) -> usize {
        self.roles
            .iter()
            .flat_map(|role| role.ports.iter().map(move |port| (role, port)))
            .map(|(role, port)| match port.scope {
                Scope::RoleScoped => usize::from(role.replicas > 0),
                Scope::PodScoped => role.replicas.max(0) as usize,
            })
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
mod tests {
    use super::super::PortReference;
    use super::super::PortRequest;
    use super::super::fixtures::{pd_roles, port};
    use super::*;

    fn spec() -> PortAllocationSpec {
        PortAllocationSpec {
            pool: "default".into(),
            roles: pd_roles(2, 1),
            ..Default::default()
        }
    }

    fn with_reference(from: &str) -> PortAllocationSpec {
        let mut spec = spec();
        spec.roles[2].references.push(PortReference {
            env: "REF".into(),
            from: from.into(),
            ..Default::default()
        });
        spec
    }

    #[test]
    fn good_references_resolve() {
        for from in [
            "router.http",
            "prefill.bootstrap[1]",
            "prefill.bootstrap[*]",
            "decode.http",
            "router.http[0]",
        ] {
            assert_eq!(with_reference(from).validate(), Ok(()), "{from}");
        }
    }

    #[test]
    fn bad_references_name_the_field_and_the_problem() {
        let cases = [
            (
                "nobody.http",
                "names role \"nobody\", which does not exist (roles: router, prefill, decode)",
            ),
            (
                "router.grpc",
                "names port \"grpc\", which role \"router\" does not have (ports: http)",
            ),
            ("prefill.bootstrap", "is ambiguous"),
            (
                "prefill.bootstrap[2]",
                "out of range: role \"prefill\" has 2 replicas",
            ),
            ("router.http[1]", "indexes a RoleScoped port"),
            ("router", "malformed"),
        ];
        for (from, expected) in cases {
            let err = with_reference(from).validate().unwrap_err();
            assert_eq!(err.field, "spec.roles[2].references[0].from", "{from}");
            assert!(err.message.contains(expected), "{from}: {err}");
        }
    }

    #[test]
    fn duplicates_and_bounds_are_caught() {
        let mut s = spec();
        s.roles[1].name = "router".into();
        assert_eq!(s.validate().unwrap_err().field, "spec.roles[1].name");

        let mut s = spec();
        s.roles[0]
            .ports
            .push(port("http", Scope::RoleScoped, "OTHER"));
        assert_eq!(
            s.validate().unwrap_err().field,
            "spec.roles[0].ports[1].name"
        );

        let mut s = spec();
        s.roles[0].replicas = 5000;
        assert_eq!(s.validate().unwrap_err().field, "spec.roles[0].replicas");

        let mut s = spec();
        s.roles[0].ports[0].port = Some(30009);
        s.roles[1].ports.push(PortRequest {
            port: Some(30009),
            ..port("fixed", Scope::RoleScoped, "FIXED")
        });
        let err = s.validate().unwrap_err();
        assert!(
            err.message
                .contains("requested by both router.http and prefill.fixed"),
            "{err}"
        );
    }

    #[test]
    fn demands_follow_the_spec() {
        let demands = spec().demands().unwrap();
        assert_eq!(demands.len(), 3);
        assert_eq!(demands[1].replicas, 2);
        assert_eq!(demands[1].scope, core::Scope::PodScoped);
        assert_eq!(spec().desired_port_count(), 1 + 2 + 1);
    }

    #[test]
    fn pool_ports_subtract_exclusions() {
        let pool = PortPoolSpec {
            ranges: vec!["30000-30009".into(), "30020".into()],
            exclude: vec!["30005".into(), "30008-30009".into()],
            protocol: Default::default(),
            static_band: StaticBandSetting::Auto,
        };
        assert_eq!(
            pool.port_set().unwrap().to_string(),
            "30000-30004,30006-30007,30020"
        );
        let mut outside = pool.clone();
        outside.exclude.push("40000".into());
        assert_eq!(outside.port_set().unwrap_err().field, "spec.exclude[2]");
        let mut overlapping = pool;
        overlapping.ranges.push("30009-30010".into());
        assert_eq!(overlapping.port_set().unwrap_err().field, "spec.ranges");
    }
}

//! What a PortAllocation's status says, computed from its spec and its holdings in the pool.
//! Pure, so the status is a function of the committed pool state and can be recomputed any time.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::{Phase, PortAllocation, PortAllocationStatus, PortAssignment, Scope};
use crate::core::{Holdings, SlotKey};

pub const CONDITION_ALLOCATED: &str = "Allocated";

/// Why the last allocation attempt did not complete, for the `Allocated` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// CamelCase reason: `PoolFull`, `PortHeld`, `PoolNotFound`, `InvalidSpec`, `Released`.
    pub reason: String,
    pub message: String,
}

/// The status for `pa` given what it holds in its pool. Conditions keep their transition time
/// when nothing about them changed, so re-running a sync writes nothing new.
pub fn allocation_status(
    pa: &PortAllocation,
    holdings: &Holdings,
    pool_uid: Option<&str>,
    failure: Option<&Failure>,
) -> PortAllocationStatus {
    let previous = pa.status.clone().unwrap_or_default();
    let mut assignments = Vec::new();
    let mut desired = 0usize;
    for role in &pa.spec.roles {
        for port in &role.ports {
            let slots = match port.scope {
                Scope::RoleScoped => u32::from(role.replicas > 0),
                Scope::PodScoped => role.replicas.max(0) as u32,
            };
            desired += slots as usize;
            let values: Vec<i32> = (0..slots)
                .map_while(|index| {
                    holdings.get(&SlotKey::new(role.name.clone(), port.name.clone(), index))
                })
                .map(i32::from)
                .collect();
            if !values.is_empty() {
                assignments.push(PortAssignment {
                    role: role.name.clone(),
                    port: port.name.clone(),
                    scope: port.scope,
                    env: port.env.clone(),
                    values,
                });
            }
        }
    }
    let allocated: usize = assignments.iter().map(|a| a.values.len()).sum();
    let (phase, condition_status, reason, message) = match failure {
        Some(f) if f.reason == "Released" => {
            (Phase::Pending, "False", f.reason.clone(), f.message.clone())
        }
        Some(f) => (Phase::Failed, "False", f.reason.clone(), f.message.clone()),
        None if allocated == desired => (
            Phase::Allocated,
            "True",
            "Allocated".to_string(),
            format!("{allocated} ports allocated"),
        ),
        None => (
            Phase::Pending,
            "False",
            "Pending".to_string(),
            format!("{allocated} of {desired} ports allocated: run `kubectl portalloc sync`"),
        ),
    };
    let generation = pa.metadata.generation;
    let condition = Condition {
        type_: CONDITION_ALLOCATED.to_string(),
        status: condition_status.to_string(),
        reason,
        message,
        observed_generation: generation,
        last_transition_time: Time(Timestamp::now()),
    };
    let conditions = vec![keep_transition_time(condition, &previous.conditions)];
    PortAllocationStatus {
        observed_generation: generation,
        phase: Some(phase),
        pool_uid: pool_uid.map(str::to_string).or(previous.pool_uid),
        roles: Some(
            pa.spec
                .roles
                .iter()
                .map(|r| format!("{}:{}", r.name, r.replicas))
                .collect::<Vec<_>>()
                .join(","),
        ),
        ports: Some(format!("{allocated}/{desired}")),
        assignments,
        conditions,
    }
}

/// A condition's transition time moves only when its status does (Kubernetes API conventions).
fn keep_transition_time(mut condition: Condition, previous: &[Condition]) -> Condition {
    if let Some(old) = previous.iter().find(|c| c.type_ == condition.type_)
        && old.status == condition.status
    {
        condition.last_transition_time = old.last_transition_time.clone();
    }
    condition
}

/// The holdings a PortAllocation's status records (the mirror of its pool entry).
pub fn recorded_holdings(status: &PortAllocationStatus) -> Holdings {
    let mut holdings = Holdings::new();
    for assignment in &status.assignments {
        for (index, value) in assignment.values.iter().enumerate() {
            if let Ok(port) = u16::try_from(*value) {
                holdings.insert(
                    SlotKey::new(
                        assignment.role.clone(),
                        assignment.port.clone(),
                        index as u32,
                    ),
                    port,
                );
            }
        }
    }
    holdings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortAllocationSpec, PortRequest, Role};

    fn pa() -> PortAllocation {
        let mut pa = PortAllocation::new(
            "x",
            PortAllocationSpec {
                pool: "p".into(),
                roles: vec![Role {
                    name: "web".into(),
                    replicas: 2,
                    ports: vec![
                        PortRequest {
                            name: "http".into(),
                            scope: Scope::PodScoped,
                            env: "HTTP".into(),
                            port: None,
                        },
                        PortRequest {
                            name: "admin".into(),
                            scope: Scope::RoleScoped,
                            env: "ADMIN".into(),
                            port: None,
                        },
                    ],
                    references: vec![],
                }],
            },
        );
        pa.metadata.generation = Some(3);
        pa
    }

    fn holdings(entries: &[(&str, u32, u16)]) -> Holdings {
        entries
            .iter()
            .map(|(port, i, v)| (SlotKey::new("web", *port, *i), *v))
            .collect()
    }

    #[test]
    fn complete_holdings_are_allocated_and_mirror_back() {
        let held = holdings(&[("http", 0, 100), ("http", 1, 101), ("admin", 0, 102)]);
        let status = allocation_status(&pa(), &held, Some("pool-uid"), None);
        assert_eq!(status.phase, Some(Phase::Allocated));
        assert_eq!(status.ports.as_deref(), Some("3/3"));
        assert_eq!(status.roles.as_deref(), Some("web:2"));
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.assignments[0].values, vec![100, 101]);
        assert_eq!(recorded_holdings(&status), held);
    }

    #[test]
    fn partial_holdings_are_pending_and_failures_are_failed() {
        let held = holdings(&[("http", 0, 100)]);
        let status = allocation_status(&pa(), &held, None, None);
        assert_eq!(
            (status.phase, status.ports.as_deref()),
            (Some(Phase::Pending), Some("1/3"))
        );
        let failure = Failure {
            reason: "PoolFull".into(),
            message: "full".into(),
        };
        let status = allocation_status(&pa(), &Holdings::new(), None, Some(&failure));
        assert_eq!(status.phase, Some(Phase::Failed));
        assert_eq!(status.conditions[0].reason, "PoolFull");
    }

    #[test]
    fn recomputing_an_unchanged_status_is_identical() {
        let held = holdings(&[("http", 0, 100), ("http", 1, 101), ("admin", 0, 102)]);
        let mut object = pa();
        object.status = Some(allocation_status(&object, &held, Some("u"), None));
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(
            Some(allocation_status(&object, &held, Some("u"), None)),
            object.status
        );
    }
}

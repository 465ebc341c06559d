//! What a PortAllocation's status says, computed from its spec and its holdings in the pool.
//! Pure, so the status is a function of the committed pool state and can be recomputed any time.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::refusal::{Reason, Refusal};
use crate::api::{Phase, PortAllocation, PortAllocationStatus, PortAssignment, PortRequest, Role};
use crate::core::{Holdings, SlotKey};

pub const CONDITION_ALLOCATED: &str = "Allocated";
/// True when every port the current spec asks for is held (`kubectl wait --for=condition=Ready`).
pub const CONDITION_READY: &str = "Ready";
/// True while a sync has work left: ports not yet allocated, or released on purpose.
pub const CONDITION_RECONCILING: &str = "Reconciling";
/// True after a lasting refusal (pool full, port held, invalid spec, pool missing).
pub const CONDITION_STALLED: &str = "Stalled";

/// How the last operation on a PortAllocation ended, as far as its status is concerned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome<'a> {
    /// The pool holds what the spec asks for (or as much as a scale-down left).
    Converged,
    /// `kubectl portalloc release` gave every port back on purpose.
    Released,
    /// A lasting refusal: the spec, the pool or a port makes the allocation impossible.
    Refused(&'a Refusal),
}

/// The status for `pa` given what it holds in its pool. Conditions keep their transition time
/// when nothing about them changed, so re-running a sync writes nothing new.
pub fn allocation_status(
    pa: &PortAllocation,
    holdings: &Holdings,
    pool_uid: Option<&str>,
    outcome: Outcome<'_>,
) -> PortAllocationStatus {
    let previous = pa.status.clone().unwrap_or_default();
    let mut assignments = Vec::new();
    let mut desired = 0usize;
    for role in &pa.spec.roles {
        for port in &role.ports {
            desired += pa.spec.slot_count(role, port) as usize;
            assignments.extend(assignment(pa, role, port, holdings));
        }
    }
    let allocated: usize = assignments.iter().map(|a| a.values.len()).sum();
    let verdict = Verdict::of(outcome, allocated, desired);
    let generation = pa.metadata.generation;
    // Where a spread workload's pods are stays as recorded until a sync says otherwise
    // (`set_slot_copies`), so a refusal keeps it.
    let spread = previous.assignments.iter().any(|a| !a.copies.is_empty());
    let prior_copies = if spread {
        recorded_copies(&previous)
    } else {
        BTreeMap::new()
    };
    let mut status = PortAllocationStatus {
        observed_generation: generation,
        phase: Some(verdict.phase),
        pool_uid: pool_uid.map(str::to_string).or(previous.pool_uid),
        // Only the sharded allocator changes it, around its shard writes.
        shards: previous.shards,
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
        conditions: verdict.conditions(generation, &previous.conditions),
    };
    set_slot_copies(&mut status, &prior_copies);
    status
}

/// What `port` of `role` holds, in flat order (group-major), up to the first slot not held;
/// `None` when it holds nothing.
fn assignment(
    pa: &PortAllocation,
    role: &Role,
    port: &PortRequest,
    holdings: &Holdings,
) -> Option<PortAssignment> {
    // PodScoped: one per pod (G x replicas, flat index); RoleScoped: one per group.
    let slots = pa.spec.slot_count(role, port);
    let groups = pa.spec.group_count();
    let group_size = slots / groups.max(1);
    let values: Vec<i32> = (0..slots)
        .map_while(|flat| {
            let (group, index) = (flat / group_size, flat % group_size);
            holdings.get(&SlotKey::in_group(
                &role.name,
                port.name.clone(),
                group,
                index,
            ))
        })
        .map(i32::from)
        .collect();
    // One count per port: a count change moves every slot of the port in one plan, so
    // the blocks a port holds share a size.
    let first_slot = SlotKey::new(role.name.clone(), port.name.clone(), 0);
    let count = holdings.block(&first_slot).map_or(1, |b| b.count);
    (!values.is_empty()).then(|| PortAssignment {
        role: role.name.clone(),
        port: port.name.clone(),
        scope: port.scope,
        env: port.env.clone(),
        values,
        count: (count > 1).then_some(i32::from(count)),
        group_size: (groups > 1).then_some(group_size as i32),
        copies: Vec::new(),
    })
}

/// Write in `status` the copy of each value, for a workload whose pods are spread over copies
/// (`slot_copies`: the copy of each of its slots); an empty map clears them (one copy).
pub fn set_slot_copies(status: &mut PortAllocationStatus, slot_copies: &BTreeMap<SlotKey, u16>) {
    for assignment in &mut status.assignments {
        assignment.copies = if slot_copies.is_empty() {
            Vec::new()
        } else {
            value_slots(assignment)
                .map(|slot| slot_copies.get(&slot).map_or(0, |&copy| i32::from(copy)))
                .collect()
        };
    }
}

/// The copy of each slot its status records: `copies` where the workload is spread, else the
/// one copy its shards name.
pub fn recorded_copies(status: &PortAllocationStatus) -> BTreeMap<SlotKey, u16> {
    let one = status.pool_copy();
    let mut copies = BTreeMap::new();
    for assignment in &status.assignments {
        for (n, slot) in value_slots(assignment).enumerate() {
            let copy = assignment
                .copies
                .get(n)
                .and_then(|&c| u16::try_from(c).ok());
            copies.insert(slot, copy.unwrap_or(one));
        }
    }
    copies
}

/// What its status records in copy `copy` of the pool: all of it but for a workload spread
/// over copies, whose other pods' ports are in the others.
pub fn recorded_holdings_in(status: &PortAllocationStatus, copy: u16) -> Holdings {
    let copies = recorded_copies(status);
    let mut holdings = recorded_holdings(status);
    for (slot, in_copy) in copies {
        if in_copy != copy {
            holdings.remove(&slot);
        }
    }
    holdings
}

/// The copies its status records ports in.
pub fn recorded_copy_set(status: &PortAllocationStatus) -> BTreeSet<u16> {
    let mut copies: BTreeSet<u16> = recorded_copies(status).into_values().collect();
    copies.insert(status.pool_copy());
    copies
}

/// The slot of each of an assignment's values, in order.
fn value_slots(assignment: &PortAssignment) -> impl Iterator<Item = SlotKey> + '_ {
    // Without groups every value is group 0's; with groups, groupSize values per group.
    let group_size = assignment
        .group_size
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n > 0)
        .unwrap_or(usize::MAX);
    (0..assignment.values.len()).map(move |flat| {
        let (group, index) = (flat / group_size, flat % group_size);
        SlotKey::in_group(
            &assignment.role,
            assignment.port.clone(),
            group as u32,
            index as u32,
        )
    })
}

/// The phase, and what every condition says of it.
struct Verdict {
    phase: Phase,
    status: &'static str,
    reason: Reason,
    message: String,
}

impl Verdict {
    fn of(outcome: Outcome<'_>, allocated: usize, desired: usize) -> Self {
        let (phase, status, reason, message) = match outcome {
            Outcome::Released => (
                Phase::Pending,
                "False",
                Reason::Released,
                "ports released with `kubectl portalloc release`; run `kubectl portalloc sync` to allocate again"
                    .to_string(),
            ),
            Outcome::Refused(refusal) => {
                (Phase::Failed, "False", refusal.reason(), refusal.to_string())
            }
            Outcome::Converged if allocated == desired => (
                Phase::Allocated,
                "True",
                Reason::Allocated,
                format!("{allocated} ports allocated"),
            ),
            Outcome::Converged => (
                Phase::Pending,
                "False",
                Reason::Pending,
                format!("{allocated} of {desired} ports allocated: run `kubectl portalloc sync`"),
            ),
        };
        Verdict {
            phase,
            status,
            reason,
            message,
        }
    }

    /// The conditions, each keeping its transition time from `previous` when its status is
    /// the same.
    fn conditions(&self, generation: Option<i64>, previous: &[Condition]) -> Vec<Condition> {
        let (reason, message) = (self.reason, self.message.as_str());
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            observed_generation: generation,
            last_transition_time: Time(Timestamp::now()),
        };
        // kstatus' rules, which Flux, Argo CD (with our health check) and `kubectl wait` follow:
        // Ready says whether the object is usable; the abnormal-true conditions Reconciling (work
        // left for a sync) and Stalled (a refusal nobody can retry away) appear only while true.
        // `Allocated` is the condition earlier versions wrote; it stays for existing readers.
        let mut conditions = vec![
            condition(CONDITION_ALLOCATED, self.status),
            condition(CONDITION_READY, self.status),
        ];
        match self.phase {
            Phase::Pending => conditions.push(condition(CONDITION_RECONCILING, "True")),
            Phase::Failed => conditions.push(condition(CONDITION_STALLED, "True")),
            Phase::Allocated => {}
        }
        conditions
            .into_iter()
            .map(|c| keep_transition_time(c, previous))
            .collect()
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
        let count = assignment.count.unwrap_or(1).max(1) as u32;
        for (slot, value) in value_slots(assignment).zip(&assignment.values) {
            let block = u16::try_from(*value)
                .ok()
                .and_then(|first| crate::core::PortBlock::new(first, count));
            if let Some(block) = block {
                holdings.insert_block(slot, block);
            }
        }
    }
    holdings
}

/// Ready for the generation it describes: nothing for a sync to do. (A pool recreated under it
/// is repair's business, as for the CLI.)
pub(crate) fn is_current(pa: &PortAllocation) -> bool {
    pa.status.as_ref().is_some_and(|status| {
        status.observed_generation == pa.metadata.generation
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == CONDITION_READY && c.status == "True")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortAllocationSpec, PortRequest, PortScope, Role};

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
                            scope: PortScope::PodScoped,
                            env: "HTTP".into(),
                            port: None,
                            ..Default::default()
                        },
                        PortRequest {
                            name: "admin".into(),
                            scope: PortScope::RoleScoped,
                            env: "ADMIN".into(),
                            port: None,
                            ..Default::default()
                        },
                    ],
                    references: vec![],
                    ..Default::default()
                }],
                ..Default::default()
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
        let status = allocation_status(&pa(), &held, Some("pool-uid"), Outcome::Converged);
        assert_eq!(status.phase, Some(Phase::Allocated));
        assert_eq!(status.ports.as_deref(), Some("3/3"));
        assert_eq!(status.roles.as_deref(), Some("web:2"));
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.assignments[0].values, vec![100, 101]);
        assert_eq!(recorded_holdings(&status), held);
    }

    #[test]
    fn groups_multiply_pod_slots_and_give_role_slots_one_per_group() {
        let mut grouped = pa();
        grouped.spec.groups = Some(2);
        let held: Holdings = (0..4)
            .map(|f| {
                (
                    SlotKey::in_group("web", "http", f / 2, f % 2),
                    100 + f as u16,
                )
            })
            .chain((0..2).map(|g| (SlotKey::in_group("web", "admin", g, 0), 200 + g as u16)))
            .collect();
        let status = allocation_status(&grouped, &held, None, Outcome::Converged);
        assert_eq!(status.ports.as_deref(), Some("6/6"));
        assert_eq!(status.assignments[0].values, vec![100, 101, 102, 103]);
        assert_eq!(status.assignments[0].group_size, Some(2));
        assert_eq!(status.assignments[1].values, vec![200, 201]);
        assert_eq!(status.assignments[1].group_size, Some(1));
        // Repair rebuilds exactly these slots from the status.
        assert_eq!(recorded_holdings(&status), held);
        let demands = grouped.spec.demands().unwrap();
        let slots = crate::core::desired_slots(&demands);
        assert_eq!(slots.len(), 6);
        assert!(slots.contains_key(&SlotKey::new("1-web", "admin", 0)));
        assert!(slots.contains_key(&SlotKey::new("1-web", "http", 1)));
    }

    #[test]
    fn partial_holdings_are_pending_and_failures_are_failed() {
        let held = holdings(&[("http", 0, 100)]);
        let status = allocation_status(&pa(), &held, None, Outcome::Converged);
        assert_eq!(
            (status.phase, status.ports.as_deref()),
            (Some(Phase::Pending), Some("1/3"))
        );
        let refusal = Refusal::PoolNotFound {
            pool: "p".into(),
            owner: "ns/x".into(),
        };
        let status = allocation_status(&pa(), &Holdings::new(), None, Outcome::Refused(&refusal));
        assert_eq!(status.phase, Some(Phase::Failed));
        assert_eq!(status.conditions[0].reason, "PoolNotFound");
        assert_eq!(status.conditions[0].message, refusal.to_string());
    }

    #[test]
    fn zero_of_zero_ports_is_allocated_and_only_a_release_says_released() {
        let mut scaled_to_zero = pa();
        scaled_to_zero.spec.roles[0].replicas = 0;
        let status = allocation_status(&scaled_to_zero, &Holdings::new(), None, Outcome::Converged);
        assert_eq!(status.phase, Some(Phase::Allocated));
        assert_eq!(status.ports.as_deref(), Some("0/0"));
        assert_eq!(status.conditions[0].reason, "Allocated");
        let released = allocation_status(&pa(), &Holdings::new(), None, Outcome::Released);
        assert_eq!(released.phase, Some(Phase::Pending));
        assert_eq!(released.conditions[0].reason, "Released");
    }

    /// (type, status, reason) of every condition, in order.
    fn conditions(status: &PortAllocationStatus) -> Vec<(&str, &str, &str)> {
        status
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect()
    }

    #[test]
    fn conditions_follow_kstatus_for_every_outcome() {
        let all = holdings(&[("http", 0, 100), ("http", 1, 101), ("admin", 0, 102)]);
        let status = allocation_status(&pa(), &all, None, Outcome::Converged);
        assert_eq!(
            conditions(&status),
            vec![
                ("Allocated", "True", "Allocated"),
                ("Ready", "True", "Allocated")
            ]
        );
        let status = allocation_status(
            &pa(),
            &holdings(&[("http", 0, 100)]),
            None,
            Outcome::Converged,
        );
        assert_eq!(
            conditions(&status),
            vec![
                ("Allocated", "False", "Pending"),
                ("Ready", "False", "Pending"),
                ("Reconciling", "True", "Pending")
            ]
        );
        let status = allocation_status(&pa(), &Holdings::new(), None, Outcome::Released);
        assert_eq!(conditions(&status)[2], ("Reconciling", "True", "Released"));
        let full = Refusal::PoolNotFound {
            pool: "p".into(),
            owner: "ns/x".into(),
        };
        let status = allocation_status(&pa(), &Holdings::new(), None, Outcome::Refused(&full));
        assert_eq!(
            conditions(&status),
            vec![
                ("Allocated", "False", "PoolNotFound"),
                ("Ready", "False", "PoolNotFound"),
                ("Stalled", "True", "PoolNotFound")
            ]
        );
        assert!(
            status
                .conditions
                .iter()
                .all(|c| c.observed_generation == Some(3))
        );
        assert_eq!(status.conditions[2].message, full.to_string());
    }

    #[test]
    fn recomputing_an_unchanged_status_is_identical() {
        let held = holdings(&[("http", 0, 100), ("http", 1, 101), ("admin", 0, 102)]);
        let mut object = pa();
        object.status = Some(allocation_status(
            &object,
            &held,
            Some("u"),
            Outcome::Converged,
        ));
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(
            Some(allocation_status(
                &object,
                &held,
                Some("u"),
                Outcome::Converged
            )),
            object.status
        );
    }

    #[test]
    fn blocks_record_their_count_and_mirror_back() {
        let mut object = pa();
        object.spec.roles[0].ports[0].count = Some(8);
        use crate::core::PortBlock;
        let block = |first| PortBlock::new(first, 8).unwrap();
        let held: Holdings = [
            (SlotKey::new("web", "http", 0), block(100)),
            (SlotKey::new("web", "http", 1), block(108)),
            (SlotKey::new("web", "admin", 0), PortBlock::single(120)),
        ]
        .into_iter()
        .collect();
        let status = allocation_status(&object, &held, None, Outcome::Converged);
        assert_eq!(status.assignments[0].values, vec![100, 108]);
        assert_eq!(status.assignments[0].count, Some(8));
        assert_eq!(status.assignments[1].count, None);
        assert_eq!(recorded_holdings(&status), held);
    }

    #[test]
    fn a_spread_workload_records_each_pods_copy_and_a_refusal_keeps_them() {
        let held = holdings(&[("http", 0, 100), ("http", 1, 100), ("http", 2, 101)]);
        let copies: BTreeMap<SlotKey, u16> = [
            (SlotKey::new("web", "http", 0), 0),
            (SlotKey::new("web", "http", 1), 1),
            (SlotKey::new("web", "http", 2), 0),
        ]
        .into_iter()
        .collect();
        let mut object = pa();
        object.spec.roles[0].replicas = 3;
        let mut status = allocation_status(&object, &held, None, Outcome::Converged);
        assert!(status.assignments[0].copies.is_empty(), "one copy: none");
        set_slot_copies(&mut status, &copies);
        assert_eq!(status.assignments[0].copies, vec![0, 1, 0]);
        assert_eq!(recorded_copies(&status), copies);
        assert_eq!(
            recorded_holdings_in(&status, 1),
            holdings(&[("http", 1, 100)])
        );
        assert_eq!(recorded_copy_set(&status), BTreeSet::from([0, 1]));
        assert_eq!(status.copy_of("web", "http", 1), 1);

        object.status = Some(status);
        let refusal = Refusal::PoolNotFound {
            pool: "p".into(),
            owner: "ns/x".into(),
        };
        let refused = allocation_status(&object, &held, None, Outcome::Refused(&refusal));
        assert_eq!(refused.assignments[0].copies, vec![0, 1, 0]);
    }
}

//! What one owner should hold in a pool after an operation, decided from one read of the pool.
//!
//! The Kubernetes layer reads a shard (or every shard), calls [`decide`] on the record, writes
//! the holdings it returns with the resourceVersion it read, and on a conflict reads again and
//! decides again. Nothing here does I/O, so every decision is tested without a server.

use std::collections::BTreeMap;

use rand::Rng;

use crate::api::PortAllocation;
use crate::core::{self, Holdings, PortDemand, SlotKey, Want};

use super::owner_of;
use super::record::window_record::WindowRecord;
use super::refusal::Refusal;

/// What the caller asked for. The operation, not the numbers it produces, decides what the
/// PortAllocation's status says afterwards (see [`Operation::released_on_purpose`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Operation {
    /// Hold exactly what these demands ask for: allocate new slots, release removed ones, keep
    /// the rest.
    Sync(Vec<PortDemand>),
    /// Hold exactly these slots: the part of a `Sync` that one copy of a pool holds, when a
    /// workload's pods are spread over copies (`spread`).
    Slots(BTreeMap<SlotKey, Want>),
    /// Give back one role's ports, or all of them, without touching the spec.
    Release { role: Option<String> },
    /// Drop the owner's entry entirely: its PortAllocation is gone.
    Remove,
}

impl Operation {
    /// How many ports it asks for in all (every slot's ports).
    pub fn ports_asked(&self) -> u32 {
        match self {
            Operation::Sync(demands) => demands
                .iter()
                .map(|d| d.slot_count() * d.count.max(1))
                .sum(),
            Operation::Slots(slots) => slots.values().map(|want| want.count.max(1)).sum(),
            Operation::Release { .. } | Operation::Remove => 0,
        }
    }

    /// The most ports one pod asks for: its role's RoleScoped ports and one pod's PodScoped
    /// ports, every port of a block counted (0 for a release or a removal).
    pub fn ports_per_pod(&self) -> u32 {
        let Operation::Sync(demands) = self else {
            return 0;
        };
        let mut by_role: std::collections::BTreeMap<&str, u32> = Default::default();
        for demand in demands.iter().filter(|d| d.slot_count() > 0) {
            *by_role.entry(&demand.role).or_default() += demand.count.max(1);
        }
        by_role.into_values().max().unwrap_or(0)
    }

    /// Whether it names a port of its own (`port:`) anywhere: only then can a record too
    /// small for it answer with something other than "no room" (the port is held).
    pub fn requests_ports(&self) -> bool {
        match self {
            Operation::Sync(demands) => demands.iter().any(|d| d.requested.is_some()),
            Operation::Slots(slots) => slots.values().any(|want| want.requested.is_some()),
            Operation::Release { .. } | Operation::Remove => false,
        }
    }

    /// Whether it asks for a block of contiguous ports.
    pub fn asks_for_blocks(&self) -> bool {
        match self {
            Operation::Sync(demands) => demands.iter().any(|d| d.count > 1),
            Operation::Slots(slots) => slots.values().any(|want| want.count > 1),
            Operation::Release { .. } | Operation::Remove => false,
        }
    }

    /// The sync operation for a PortAllocation's current spec.
    pub fn sync_of(pa: &PortAllocation) -> Result<Operation, Refusal> {
        pa.spec
            .demands()
            .map(Operation::Sync)
            .map_err(|error| Refusal::Spec {
                owner: owner_of(pa),
                error,
            })
    }

    /// Whether, after this operation left `holdings` and released `released` ports, the status
    /// should say the ports were released on purpose (and not that a sync is pending).
    pub fn released_on_purpose(&self, holdings: &Holdings, released: usize) -> bool {
        matches!(self, Operation::Release { .. }) && holdings.is_empty() && released > 0
    }
}

/// The result of one decision about a record.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The record already says what we want: nothing to write.
    Unchanged(Holdings),
    /// Write `holdings` as the owner's new entry (with the resourceVersion read).
    Write {
        holdings: Holdings,
        allocated: usize,
        released: usize,
    },
}

impl Decision {
    pub fn holdings(&self) -> &Holdings {
        match self {
            Decision::Unchanged(holdings) | Decision::Write { holdings, .. } => holdings,
        }
    }
}

/// Decide what `uid` (the PortAllocation `owner`, `namespace/name`) holds after `operation`.
pub fn decide(
    record: &WindowRecord,
    uid: &str,
    owner: &str,
    operation: &Operation,
    rng: &mut impl Rng,
) -> Result<Decision, Refusal> {
    match operation {
        Operation::Sync(demands) => {
            decide_slots(record, uid, owner, core::desired_slots(demands), rng)
        }
        Operation::Slots(slots) => decide_slots(record, uid, owner, slots.clone(), rng),
        Operation::Release { role } => Ok(decide_release(record, uid, role.as_deref())),
        Operation::Remove => Ok(decide_remove(record, uid)),
    }
}

/// Plan against what `uid` holds now, and carry the plan out on a copy of the record's state.
fn decide_slots(
    record: &WindowRecord,
    uid: &str,
    owner: &str,
    desired: BTreeMap<SlotKey, Want>,
    rng: &mut impl Rng,
) -> Result<Decision, Refusal> {
    let current = record.holdings_of(uid);
    let plan = core::plan_slots(desired, &current);
    if plan.is_noop() {
        return Ok(Decision::Unchanged(current));
    }
    let mut state = record.state.clone();
    let holdings = core::execute(&plan, &mut state, rng)
        .map_err(|e| Refusal::from_core(e, record, uid, owner))?;
    Ok(Decision::Write {
        holdings,
        allocated: plan.allocate.len(),
        released: plan.release.len(),
    })
}

fn decide_release(record: &WindowRecord, uid: &str, role: Option<&str>) -> Decision {
    let current = record.holdings_of(uid);
    let keep: Holdings = current
        .iter()
        .filter(|(slot, _)| role.is_some_and(|r| slot.spec_role() != r))
        .map(|(slot, port)| (slot.clone(), port))
        .collect();
    let released = current.len() - keep.len();
    if released == 0 {
        return Decision::Unchanged(current);
    }
    Decision::Write {
        holdings: keep,
        allocated: 0,
        released,
    }
}

fn decide_remove(record: &WindowRecord, uid: &str) -> Decision {
    let current = record.holdings_of(uid);
    // An undecodable entry of this owner goes too (writing empty holdings drops it): the
    // object is gone, nobody will read it.
    if current.is_empty() && !record.opaque.contains_key(uid) {
        return Decision::Unchanged(current);
    }
    Decision::Write {
        holdings: Holdings::new(),
        allocated: 0,
        released: current.len(),
    }
}

/// Would syncing `pa` against this pool succeed? Lets `create` refuse before writing anything.
pub fn precheck(record: &WindowRecord, pa: &PortAllocation) -> Result<(), Refusal> {
    let operation = Operation::sync_of(pa)?;
    let uid = pa.metadata.uid.clone().unwrap_or_default();
    decide(record, &uid, &owner_of(pa), &operation, &mut rand::rng()).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Scope, SlotKey};
    use crate::ledger::fixtures::{holders, pool_of, whole_record};
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn record(pairs: &[(&str, &str)]) -> WindowRecord {
        whole_record(&pool_of(&["100-103"], &[]), holders(pairs))
    }

    /// The record after `holdings` are written for `uid`.
    fn after(record: &WindowRecord, uid: &str, holdings: &Holdings) -> WindowRecord {
        let mut state = record.state.clone();
        for port in record.holdings_of(uid).ports() {
            state.release(port);
        }
        for port in holdings.ports() {
            state.mark_held(port).unwrap();
        }
        record.after(record.status_with(&state, uid, &format!("ns/{uid}"), holdings))
    }

    fn demand(role: &str, port: &str, replicas: u32) -> PortDemand {
        PortDemand {
            role: role.into(),
            port: port.into(),
            scope: Scope::PodScoped,
            replicas,
            requested: None,
            count: 1,
        }
    }

    fn rng() -> StdRng {
        StdRng::seed_from_u64(7)
    }

    #[test]
    fn syncing_what_is_held_writes_nothing() {
        let record = record(&[("a", "web.http=100,101")]);
        let sync = Operation::Sync(vec![demand("web", "http", 2)]);
        let decision = decide(&record, "a", "ns/a", &sync, &mut rng()).unwrap();
        assert!(matches!(decision, Decision::Unchanged(ref h) if h.len() == 2));
    }

    #[test]
    fn scaling_to_zero_releases_everything_and_is_not_a_release_on_purpose() {
        let record = record(&[("a", "web.http=100,101")]);
        let sync = Operation::Sync(vec![demand("web", "http", 0)]);
        let decision = decide(&record, "a", "ns/a", &sync, &mut rng()).unwrap();
        let Decision::Write {
            holdings, released, ..
        } = decision
        else {
            panic!("a scale-down writes the pool");
        };
        assert_eq!((holdings.len(), released), (0, 2));
        assert!(after(&record, "a", &holdings).holders.is_empty());
        assert!(!sync.released_on_purpose(&holdings, released));
        let release = Operation::Release { role: None };
        assert!(release.released_on_purpose(&holdings, released));
    }

    #[test]
    fn scaling_pods_per_group_keeps_every_pods_port() {
        use crate::api::{PortAllocationSpec, PortRequest, Role};
        let spec = |replicas| PortAllocationSpec {
            pool: "p".into(),
            groups: Some(2),
            roles: vec![Role {
                name: "w".into(),
                replicas,
                ports: vec![PortRequest {
                    name: "http".into(),
                    env: "HTTP".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let empty = whole_record(&pool_of(&["100-119"], &[]), vec![]);
        let two = Operation::Sync(spec(2).demands().unwrap());
        let Decision::Write {
            holdings: before, ..
        } = decide(&empty, "a", "ns/a", &two, &mut rng()).unwrap()
        else {
            panic!("a first sync writes");
        };
        let record = after(&empty, "a", &before);
        let three = Operation::Sync(spec(3).demands().unwrap());
        let Decision::Write {
            holdings: after,
            released,
            ..
        } = decide(&record, "a", "ns/a", &three, &mut rng()).unwrap()
        else {
            panic!("a scale-up writes");
        };
        assert_eq!((before.len(), after.len(), released), (4, 6, 0));
        for (slot, port) in before.iter() {
            assert_eq!(after.block(slot), Some(port), "{slot} moved");
        }
    }

    #[test]
    fn releasing_one_role_keeps_the_others() {
        let record = record(&[("a", "web.http=100 db.sql=101")]);
        let release = Operation::Release {
            role: Some("web".into()),
        };
        let decision = decide(&record, "a", "ns/a", &release, &mut rng()).unwrap();
        let kept = decision.holdings();
        assert_eq!(kept.get(&SlotKey::new("db", "sql", 0)), Some(101));
        assert_eq!(kept.len(), 1);
        assert!(!release.released_on_purpose(kept, 1));
    }

    #[test]
    fn removing_drops_the_entry_and_undecodable_text() {
        let record = record(&[("a", "web.http=100"), ("b", "not valid")]);
        for uid in ["a", "b"] {
            let decision = decide(&record, uid, "ns/x", &Operation::Remove, &mut rng()).unwrap();
            let Decision::Write { holdings, .. } = decision else {
                panic!("removing {uid} writes the pool");
            };
            assert!(holdings.is_empty());
            let mut shard =
                crate::ledger::ShardRecord::new(crate::ledger::ShardKey::first(0), record.clone());
            shard.set(uid, "ns/x", &holdings);
            let status = shard.write(&record.pool, false).status;
            assert_eq!(status.holders.len(), 1);
            assert!(status.holders.iter().all(|h| h.uid != uid));
        }
        let absent = decide(&record, "c", "ns/c", &Operation::Remove, &mut rng()).unwrap();
        assert!(matches!(absent, Decision::Unchanged(_)));
    }

    #[test]
    fn a_full_pool_is_refused_naming_its_holders() {
        let record = record(&[("a", "web.http=100,101,102")]);
        let sync = Operation::Sync(vec![demand("x", "y", 2)]);
        let refusal = decide(&record, "b", "ns/b", &sync, &mut rng()).unwrap_err();
        assert_eq!(refusal.reason(), super::super::Reason::PoolFull);
        assert!(
            refusal.to_string().contains("Holders: ns/a (3 ports)"),
            "{refusal}"
        );
    }

    fn wide_record(pairs: &[(&str, &str)]) -> WindowRecord {
        whole_record(&pool_of(&["100-199"], &[]), holders(pairs))
    }

    #[test]
    fn a_held_block_of_the_right_size_is_kept_and_a_new_count_moves_only_its_slots() {
        let record = wide_record(&[("a", "ray.workers=100-107,108-115 ray.head=120")]);
        let workers = |count| PortDemand {
            count,
            ..demand("ray", "workers", 2)
        };
        let head = PortDemand {
            scope: Scope::RoleScoped,
            ..demand("ray", "head", 1)
        };
        let same = Operation::Sync(vec![workers(8), head.clone()]);
        let decision = decide(&record, "a", "ns/a", &same, &mut rng()).unwrap();
        assert!(matches!(decision, Decision::Unchanged(ref h) if h.port_count() == 17));

        let bigger = Operation::Sync(vec![workers(16), head]);
        let Decision::Write {
            holdings,
            allocated,
            released,
        } = decide(&record, "a", "ns/a", &bigger, &mut rng()).unwrap()
        else {
            panic!("a count change writes the pool");
        };
        assert_eq!((allocated, released), (2, 2));
        assert_eq!(holdings.get(&SlotKey::new("ray", "head", 0)), Some(120));
        assert_eq!(holdings.port_count(), 33);
        let written = after(&record, "a", &holdings);
        assert_eq!(written.state.held_count(), 33);
        assert!(written.entries()[0].ports.contains("ray.workers="));
    }

    #[test]
    fn a_block_that_does_not_fit_is_refused_as_pool_full_with_runs_and_holders() {
        // 100 ports, holder a every 10th: largest free run 9.
        let ports: Vec<String> = (0..10).map(|i| (100 + i * 10).to_string()).collect();
        let text = format!("x.y={}", ports.join(","));
        let record = wide_record(&[("a", text.as_str())]);
        let sync = Operation::Sync(vec![PortDemand {
            count: 16,
            ..demand("ray", "workers", 1)
        }]);
        let refusal = decide(&record, "b", "ns/b", &sync, &mut rng()).unwrap_err();
        assert_eq!(refusal.reason(), super::super::Reason::PoolFull);
        let message = refusal.to_string();
        for needle in [
            "ray.workers[0] needs a block of 16 contiguous ports; the largest free run is 9 (90 free in 10 runs)",
            "Holders: ns/a (10 ports)",
        ] {
            assert!(message.contains(needle), "{needle:?} missing: {message}");
        }
    }

    #[test]
    fn a_requested_block_over_a_held_port_names_the_block_and_the_holder() {
        let record = wide_record(&[("a", "x.y=105")]);
        let sync = Operation::Sync(vec![PortDemand {
            scope: Scope::RoleScoped,
            requested: Some(100),
            count: 8,
            ..demand("ray", "nixl", 1)
        }]);
        let refusal = decide(&record, "b", "ns/b", &sync, &mut rng()).unwrap_err();
        assert_eq!(refusal.reason(), super::super::Reason::PortHeld);
        assert_eq!(
            refusal.to_string(),
            "PortAllocation ns/b: port 105 (in the requested block 100-107) of pool \"p\" is already held by ns/a (role x, port y, pod index 0): request another port, or leave it unset to get a free one"
        );
    }

    #[test]
    fn a_spec_block_past_the_last_port_is_invalid() {
        use crate::api::{PortAllocationSpec, PortRequest, Role};
        let pa = PortAllocation::new(
            "x",
            PortAllocationSpec {
                pool: "p".into(),
                roles: vec![Role {
                    name: "ray".into(),
                    replicas: 1,
                    ports: vec![PortRequest {
                        name: "nixl".into(),
                        scope: crate::api::PortScope::RoleScoped,
                        env: "NIXL".into(),
                        port: Some(65530),
                        count: Some(8),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        let refusal = Operation::sync_of(&pa).unwrap_err();
        assert!(
            refusal.to_string().contains("spec.roles[0].ports[0].count: a block of 8 ports from port 65530 would run past 65535"),
            "{refusal}"
        );
        let mut fine = pa.clone();
        fine.spec.roles[0].ports[0].port = Some(65528);
        let Ok(Operation::Sync(demands)) = Operation::sync_of(&fine) else {
            panic!("a block ending at 65535 is valid");
        };
        assert_eq!(demands[0].count, 8);
    }
}

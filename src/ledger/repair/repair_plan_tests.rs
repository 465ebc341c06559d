//! Unit tests of the repair plan: every rule on hand-made pools and PortAllocations, and a
//! randomized sweep that repairing never creates a duplicate.

use super::*;
use crate::api::{
    PortAllocationSpec, PortAllocationStatus, PortPoolSpec, PortRequest, PortScope, Role,
    StaticBandSetting,
};
use crate::api::{PortPool, PortPoolShard};
use crate::core::{Holdings, SlotKey};
use crate::ledger::fixtures::shard_of;
use crate::ledger::{Outcome, allocation_status};
use crate::ledger::{PoolSnapshot, load_shard};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const POOL_UID: &str = "pool-uid-2";

/// Pool `p` over 100-119 less 110: one shard.
fn pool_object() -> PortPool {
    let mut pool = PortPool::new(
        "p",
        PortPoolSpec {
            ranges: vec!["100-119".into()],
            exclude: vec!["110".into()],
            protocol: Default::default(),
            static_band: StaticBandSetting::None,
            node_reuse: None,
            follow_nodes: None,
            guard: None,
            allow_overlap: false,
        },
    );
    pool.metadata.uid = Some(POOL_UID.into());
    pool.metadata.generation = Some(1);
    pool
}

/// The pool's one shard, read at version 42, holding `(uid, owner, ports)` entries, with the
/// counts the allocator would have written.
fn pool(holders: &[(&str, &str, &str)]) -> PortPoolShard {
    let holders: Vec<PoolHolder> = holders
        .iter()
        .map(|(uid, owner, ports)| PoolHolder {
            uid: (*uid).into(),
            owner: (*owner).into(),
            ports: (*ports).into(),
        })
        .collect();
    let mut shard = shard_of(&pool_object(), 0, holders);
    shard.metadata.resource_version = Some("42".into());
    shard.status = Some(record(shard.clone()).current_status());
    shard
}

/// The shard loaded as the record repair plans against.
fn record(shard: PortPoolShard) -> WindowRecord {
    let copy = PoolSnapshot::of_pool(&pool_object());
    let layout = copy.layout().unwrap();
    load_shard(&copy, &layout, 0, shard)
}

/// A PortAllocation `ns/name` with role web (`replicas` pods, PodScoped http) whose status
/// records `ports` (pod-index order) against pool object `pool_uid`.
fn pa(
    name: &str,
    uid: &str,
    replicas: i32,
    ports: &[i32],
    pool_uid: Option<&str>,
    age: i64,
) -> PortAllocation {
    let mut pa = PortAllocation::new(
        name,
        PortAllocationSpec {
            pool: "p".into(),
            roles: vec![Role {
                name: "web".into(),
                // The spec the status was written for; `replicas` is set below.
                replicas: replicas.max(ports.len() as i32),
                ports: vec![PortRequest {
                    name: "http".into(),
                    scope: PortScope::PodScoped,
                    env: "HTTP".into(),
                    port: None,
                    ..Default::default()
                }],
                references: vec![],
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    pa.metadata.namespace = Some("ns".into());
    pa.metadata.uid = Some(uid.into());
    pa.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + age).unwrap(),
    ));
    let holdings: Holdings = ports
        .iter()
        .enumerate()
        .map(|(i, p)| (SlotKey::new("web", "http", i as u32), *p as u16))
        .collect();
    if !ports.is_empty() {
        pa.status = Some(allocation_status(
            &pa,
            &holdings,
            pool_uid,
            Outcome::Converged,
        ));
    }
    pa.spec.roles[0].replicas = replicas;
    pa
}

fn plan(pool: PortPoolShard, pas: &[PortAllocation]) -> RepairPlan {
    plan_repair(&record(pool), pas)
}

/// Apply a plan's status to the pool, as the write does.
fn applied(mut pool: PortPoolShard, plan: &RepairPlan) -> PortPoolShard {
    if let Some(status) = &plan.status {
        pool.status = Some(status.clone());
    }
    pool
}

#[test]
fn a_consistent_pool_has_nothing_to_do() {
    let p = pool(&[("a", "ns/a", "web.http=100,101")]);
    let plan = plan(p, &[pa("a", "a", 2, &[100, 101], Some(POOL_UID), 0)]);
    assert!(plan.is_clean(), "{plan:?}");
    assert!(plan.status.is_none());
    assert_eq!((plan.holders, plan.held_ports), (1, 2));
}

#[test]
fn entries_of_deleted_objects_are_freed_and_live_ones_kept() {
    let p = pool(&[
        ("a", "ns/a", "web.http=100,101"),
        ("gone", "ns/gone", "web.http=102"),
        ("broken", "ns/broken", "??"),
    ]);
    let live = [pa("a", "a", 2, &[100, 101], Some(POOL_UID), 0)];
    let plan = plan(p.clone(), &live);
    assert_eq!(plan.changes.len(), 2, "{:?}", plan.changes);
    assert!(
        matches!(&plan.changes[0], Change::Free { uid, count: 1, reason: FreeReason::OwnerGone, .. } if uid == "gone")
    );
    assert!(matches!(&plan.changes[1], Change::Free { uid, count: 0, .. } if uid == "broken"));
    assert!(plan.findings.is_empty(), "{:?}", plan.findings);
    let status = plan.status.clone().unwrap();
    assert_eq!(status.holders.len(), 1);
    assert_eq!(
        (
            status.size,
            status.allocated,
            status.available,
            status.holder_count
        ),
        (19, 2, 17, 1)
    );
    // Idempotent: the repaired pool needs nothing more.
    let again = plan_repair(&record(applied(p, &plan)), &live);
    assert!(again.is_clean(), "{again:?}");
}

#[test]
fn an_entry_of_an_object_of_another_pool_is_freed() {
    let p = pool(&[("a", "ns/a", "web.http=100")]);
    let mut other = pa("a", "a", 1, &[100], Some("x"), 0);
    other.spec.pool = "q".into();
    let plan = plan(p, &[other]);
    assert!(matches!(
        &plan.changes[0],
        Change::Free { reason: FreeReason::OtherPool { pool }, .. } if pool == "q"
    ));
}

#[test]
fn lost_holdings_are_restored_only_where_safe() {
    // The pool was recreated (new UID) and someone allocated 102 meanwhile.
    let p = pool(&[("c", "ns/c", "web.http=102")]);
    let live = [
        pa("c", "c", 1, &[102], Some(POOL_UID), 5),
        // Recorded against the old pool: 100 and 101 come back, 102 is taken.
        pa("a", "a", 3, &[100, 101, 102], Some("pool-uid-1"), 1),
        // Scaled down to 1 since: index 1 is not restored. 110 is excluded now.
        pa("b", "b", 1, &[103, 104], Some("pool-uid-1"), 2),
        pa("d", "d", 1, &[110], Some("pool-uid-1"), 3),
        // A younger object recording a port the older one gets back: a conflict.
        pa("e", "e", 1, &[100], Some("pool-uid-1"), 4),
    ];
    let plan = plan(p.clone(), &live);
    let restores: Vec<(&str, &str)> = plan
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::Restore { uid, ports, .. } => Some((uid.as_str(), ports.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        restores,
        vec![("a", "web.http=100,101"), ("b", "web.http=103")]
    );
    let findings: Vec<String> = plan.findings.iter().map(|f| f.to_string()).collect();
    let has = |needle: &str| findings.iter().any(|f| f.contains(needle));
    assert!(
        has("ns/a: cannot restore port 102 (web.http[2]), now held by ns/c"),
        "{findings:#?}"
    );
    assert!(has("port 104 (web.http[1])"), "{findings:#?}");
    assert!(has("no longer asks for this slot"), "{findings:#?}");
    assert!(has("port 110 (web.http[0])"), "{findings:#?}");
    assert!(
        has("ns/e: cannot restore port 100 (web.http[0]), now held by ns/a"),
        "{findings:#?}"
    );
    assert_eq!(
        plan.restored
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    let after = record(applied(p, &plan));
    assert!(after.anomalies.is_empty());
    // c's 102, a's 100 and 101, b's 103.
    assert_eq!(after.state.held_count(), 4);
}

#[test]
fn a_stale_status_of_this_pool_is_reported_not_restored() {
    let p = pool(&[]);
    let live = [
        pa("a", "a", 2, &[100, 101], Some(POOL_UID), 0),
        pa("b", "b", 1, &[105], None, 1),
    ];
    let plan = plan(p, &live);
    assert!(plan.changes.is_empty(), "{:?}", plan.changes);
    assert_eq!(plan.findings.len(), 2);
    assert!(
        plan.findings
            .iter()
            .all(|f| matches!(f, Finding::StaleStatus { .. }))
    );
    assert!(
        plan.findings[0]
            .to_string()
            .contains("`kubectl portalloc sync a -n ns`")
    );
}

#[test]
fn duplicates_and_ports_outside_the_pool_are_reported_and_kept() {
    let p = pool(&[
        ("a", "ns/a", "web.http=100"),
        ("b", "ns/b", "web.http=100"),
        ("c", "ns/c", "web.http=110"),
        ("gone", "ns/gone", "web.http=101"),
        ("d", "ns/d", "web.http=101"),
    ]);
    let live = [
        pa("a", "a", 1, &[100], Some(POOL_UID), 0),
        pa("b", "b", 1, &[100], Some(POOL_UID), 1),
        pa("c", "c", 1, &[110], Some(POOL_UID), 2),
        pa("d", "d", 1, &[101], Some(POOL_UID), 3),
    ];
    let plan = plan(p.clone(), &live);
    // Only the dead entry goes; its duplicate with d goes with it.
    assert_eq!(plan.changes.len(), 1);
    assert!(matches!(&plan.changes[0], Change::Free { uid, .. } if uid == "gone"));
    assert_eq!(
        plan.findings,
        vec![
            Finding::OutsidePool {
                uid: "c".into(),
                owner: "ns/c".into(),
                slot: "web.http[0]".into(),
                port: 110
            },
            Finding::Duplicate {
                port: 100,
                first: "ns/a".into(),
                second: "ns/b".into()
            },
        ]
    );
    let after = record(applied(p, &plan));
    assert_eq!(after.holders.len(), 4, "live holders are all kept");
    assert_eq!(after.holdings_of("d").len(), 1);
}

#[test]
fn wrong_counts_alone_are_recounted() {
    let mut p = pool(&[("a", "ns/a", "web.http=100")]);
    p.status.as_mut().unwrap().allocated = 0;
    let plan = plan(p, &[pa("a", "a", 1, &[100], Some(POOL_UID), 0)]);
    assert!(matches!(
        plan.changes[..],
        [Change::Recount {
            size: 19,
            allocated: 1,
            available: 18,
            holder_count: 1
        }]
    ));
}

#[test]
fn lines_name_the_pool_entry_and_the_fix() {
    let p = pool(&[("gone", "ns/gone", "web.http=102,103")]);
    let plan = plan(p, &[]);
    assert_eq!(
        plan.changes[0].to_string(),
        "ns/gone (uid gone)  2 ports: web.http=102,103  (its PortAllocation no longer exists)"
    );
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["changes"][0]["action"], "free");
    assert_eq!(json["changes"][0]["reason"], "ownerGone");
}

#[test]
fn restoring_never_creates_a_duplicate() {
    // Property-style sweep: random pools and statuses, the repaired pool has no duplicate,
    // nothing outside, and a second pass finds nothing to change.
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..300 {
        let mut entries = Vec::new();
        let mut live = Vec::new();
        for i in 0..rng.random_range(0..6) {
            let uid = format!("u{i}");
            let ports: Vec<i32> = (0..rng.random_range(1..4))
                .map(|_| rng.random_range(98..122))
                .collect();
            let in_pool = rng.random_bool(0.5);
            let alive = rng.random_bool(0.7);
            if in_pool {
                let text = Holdings::from_iter(
                    ports
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| (1..=65535).contains(*p))
                        .map(|(i, p)| (SlotKey::new("web", "http", i as u32), *p as u16)),
                )
                .encode();
                entries.push((uid.clone(), format!("ns/{uid}"), text));
            }
            if alive {
                let pool_uid = if rng.random_bool(0.5) {
                    "pool-uid-1"
                } else {
                    POOL_UID
                };
                live.push(pa(
                    &uid,
                    &uid,
                    rng.random_range(0..4),
                    &ports,
                    Some(pool_uid),
                    i,
                ));
            }
        }
        let borrowed: Vec<(&str, &str, &str)> = entries
            .iter()
            .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
            .collect();
        let p = pool(&borrowed);
        let before = record(p.clone());
        let plan = plan(p.clone(), &live);
        let after = record(applied(p, &plan));
        let new_duplicates = after
            .anomalies
            .iter()
            .filter(|a| matches!(a, Anomaly::Duplicate { .. }))
            .count();
        let old_duplicates = before
            .anomalies
            .iter()
            .filter(|a| matches!(a, Anomaly::Duplicate { .. }))
            .count();
        assert!(new_duplicates <= old_duplicates, "{plan:?}");
        for uid in after.holders.keys() {
            assert!(live.iter().any(|pa| pa.uid().as_deref() == Some(uid)));
        }
        let again = plan_repair(&after, &live);
        assert!(
            again.changes.is_empty(),
            "second pass changed {:?}",
            again.changes
        );
    }
}

#[test]
fn status_helper_matches_the_allocator() {
    let pa = pa("a", "a", 1, &[100], Some(POOL_UID), 0);
    let status: &PortAllocationStatus = pa.status.as_ref().unwrap();
    assert_eq!(status.pool_uid.as_deref(), Some(POOL_UID));
}

/// Like `pa`, but http is a block of `count` ports and the status records blocks from `firsts`.
fn block_pa(name: &str, uid: &str, firsts: &[i32], count: i32, pool_uid: &str) -> PortAllocation {
    let mut pa = pa(name, uid, firsts.len() as i32, &[], None, 0);
    pa.spec.roles[0].ports[0].count = Some(count);
    let holdings: Holdings = firsts
        .iter()
        .enumerate()
        .map(|(i, first)| {
            let block = crate::core::PortBlock::new(*first as u16, count as u32).unwrap();
            (SlotKey::new("web", "http", i as u32), block)
        })
        .collect();
    pa.status = Some(allocation_status(
        &pa,
        &holdings,
        Some(pool_uid),
        Outcome::Converged,
    ));
    pa
}

#[test]
fn a_recreated_pool_gets_its_blocks_back_exactly() {
    let live = block_pa("ray", "r", &[100, 104], 4, "old-pool");
    assert_eq!(live.status.as_ref().unwrap().assignments[0].count, Some(4));
    let empty = pool(&[]);
    let plan = plan(empty.clone(), std::slice::from_ref(&live));
    assert_eq!(
        plan.changes,
        vec![Change::Restore {
            uid: "r".into(),
            owner: "ns/ray".into(),
            ports: "web.http=100-103,104-107".into(),
            count: 8,
        }]
    );
    assert!(plan.findings.is_empty(), "{:?}", plan.findings);
    assert_eq!(plan.held_ports, 8);
    let after = record(applied(empty, &plan));
    assert_eq!(after.state.held_count(), 8);
    assert!(plan_repair(&after, &[live]).is_clean());
}

#[test]
fn a_block_is_restored_whole_or_not_at_all() {
    // b holds 102, inside the first block; the second block crosses the exclusion at 110.
    let taken = pool(&[("b", "ns/b", "web.http=102")]);
    let live = block_pa("ray", "r", &[100, 108], 4, "old-pool");
    let other = pa("b", "b", 1, &[102], Some(POOL_UID), 1);
    let plan = plan(taken, &[live, other]);
    assert!(plan.changes.is_empty(), "{:?}", plan.changes);
    assert!(plan.findings.contains(&Finding::RestoreConflict {
        owner: "ns/ray".into(),
        slot: "web.http[0]".into(),
        port: 102,
        holder: "ns/b".into(),
    }));
    assert!(
        plan.findings.iter().any(|f| matches!(
            f,
            Finding::RestoreSkipped { slot, port: 108, why, .. }
                if slot == "web.http[1]" && why.starts_with("port 110 of 108-111 is outside")
        )),
        "{:?}",
        plan.findings
    );
}

#[test]
fn duplicates_and_exclusions_are_found_inside_blocks() {
    let p = pool(&[
        ("a", "ns/a", "web.http=100-103"),
        ("b", "ns/b", "web.http=103,108-111"),
    ]);
    let record = record(p.clone());
    assert_eq!(record.state.held_count(), 7);
    let plan = plan(
        p,
        &[
            block_pa("a", "a", &[100], 4, POOL_UID),
            pa("b", "b", 2, &[103, 108], Some(POOL_UID), 1),
        ],
    );
    assert!(plan.findings.contains(&Finding::Duplicate {
        port: 103,
        first: "ns/a".into(),
        second: "ns/b".into(),
    }));
    assert!(plan.findings.iter().any(|f| matches!(
        f,
        Finding::OutsidePool { port: 110, slot, .. } if slot == "web.http[1]"
    )));
}

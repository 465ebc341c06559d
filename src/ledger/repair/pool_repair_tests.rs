//! Unit tests of repair per shard: spanning owners, the two restore cases, and what is only
//! reported.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::{
    PoolHolder, PortAllocationSpec, PortPool, PortPoolShardStatus, PortPoolSpec, PortRequest,
    PortScope, Role, StaticBandSetting,
};
use crate::core::{Holdings, SlotKey};
use crate::ledger::PoolSnapshot;
use crate::ledger::{Outcome, allocation_status, split_by_shard};

const POOL_UID: &str = "pool-uid";

/// Pool `p` of 30000-30767: windows 117 (30000-30207), 118 (30208-30463), 119 (30464-30719)
/// and 120 (30720-30767).
fn pool_with_uid(uid: &str) -> PortPool {
    let mut pool = PortPool::new(
        "p",
        PortPoolSpec {
            ranges: vec!["30000-30767".into()],
            exclude: vec![],
            protocol: Default::default(),
            static_band: StaticBandSetting::None,
            node_reuse: None,
            follow_nodes: None,
            guard: None,
            allow_overlap: false,
        },
    );
    pool.metadata.uid = Some(uid.into());
    pool.metadata.resource_version = Some("7".into());
    pool
}

fn pool() -> PortPool {
    pool_with_uid(POOL_UID)
}

/// `ports` as web.http of pods 0, 1, ...
fn holdings(ports: &[u16]) -> Holdings {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| (SlotKey::new("web", "http", i as u32), *p))
        .collect()
}

/// A PortAllocation `ns/name` (UID = name) holding `ports` as web.http of its pods, its
/// status recorded against pool object `pool_uid`.
fn pa(name: &str, ports: &[u16], pool_uid: &str, age: i64) -> PortAllocation {
    let mut pa = PortAllocation::new(
        name,
        PortAllocationSpec {
            pool: "p".into(),
            roles: vec![Role {
                name: "web".into(),
                replicas: ports.len() as i32,
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
    pa.metadata.uid = Some(name.into());
    pa.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + age).unwrap(),
    ));
    pa.status = Some(allocation_status(
        &pa,
        &holdings(ports),
        Some(pool_uid),
        Outcome::Converged,
    ));
    pa
}

/// Shard objects of `pool` holding `owners` (uid, ports), each cut by window as the allocator
/// writes them.
fn shards(pool: &PortPool, owners: &[(&str, &[u16])]) -> Vec<PortPoolShard> {
    let mut by_window: BTreeMap<u16, Vec<PoolHolder>> = BTreeMap::new();
    for (uid, ports) in owners {
        for (k, part) in split_by_shard(&holdings(ports)) {
            by_window.entry(k).or_default().push(PoolHolder {
                uid: (*uid).into(),
                owner: format!("ns/{uid}"),
                ports: part.encode(),
            });
        }
    }
    let mut listed: Vec<PortPoolShard> = by_window
        .into_iter()
        .map(|(k, holders)| shard_object(pool, k, holders))
        .collect();
    counted(pool, &mut listed);
    listed
}

fn shard_object(pool: &PortPool, k: u16, holders: Vec<PoolHolder>) -> PortPoolShard {
    let mut shard = new_shard(&PoolSnapshot::of_pool(pool), ShardKey::first(k));
    shard.metadata.resource_version = Some(format!("rv{k}"));
    shard.metadata.uid = Some(format!("{}-shard-{k}", pool.uid().unwrap()));
    shard.status = Some(PortPoolShardStatus {
        pool_generation: pool.metadata.generation.unwrap_or_default(),
        pool_spec: Some(pool.spec.clone()),
        holders,
        ..Default::default()
    });
    shard
}

/// The shards with the counts the allocator writes (computed from their holders).
fn counted(pool: &PortPool, listed: &mut [PortPoolShard]) {
    let loaded = CopyRecord::load(PoolSnapshot::of_pool(pool), listed.to_vec()).unwrap();
    for shard in listed.iter_mut() {
        let k = shard.spec.index as u16;
        if let Some(s) = loaded.shards.get(&k) {
            shard.status = Some(s.record.current_status());
        }
    }
}

fn plan(pool: PortPool, listed: &[PortPoolShard], pas: &[PortAllocation]) -> PoolRepairPlan {
    let record = PoolRecord::load(PoolSnapshot::of_pool(&pool), listed.to_vec()).unwrap();
    plan_pool_repair(&record, listed, pas)
}

/// The shards after the plan's writes (and deletions), as the server would hold them.
fn applied(pool: &PortPool, listed: &[PortPoolShard], plan: &PoolRepairPlan) -> Vec<PortPoolShard> {
    let mut out: BTreeMap<String, PortPoolShard> = listed
        .iter()
        .filter(|s| !plan.replace.iter().any(|r| r.name == s.name_any()))
        .map(|s| (s.name_any(), s.clone()))
        .collect();
    for write in &plan.writes {
        let mut shard = out
            .remove(&write.name)
            .unwrap_or_else(|| shard_object(pool, write.key.window, vec![]));
        shard.metadata.resource_version = Some(format!("{}-after", write.name));
        shard.status = Some(write.status.clone());
        out.insert(write.name.clone(), shard);
    }
    out.into_values().collect()
}

fn entries(write: &ShardWrite) -> Vec<(&str, &str)> {
    write
        .status
        .holders
        .iter()
        .map(|h| (h.uid.as_str(), h.ports.as_str()))
        .collect()
}

#[test]
fn a_dead_spanning_owner_is_freed_in_every_shard_and_a_live_one_kept() {
    let p = pool();
    let listed = shards(&p, &[("a", &[30001, 30300]), ("gone", &[30002, 30301])]);
    let live = [pa("a", &[30001, 30300], POOL_UID, 0)];
    let planned = plan(p.clone(), &listed, &live);
    let freed: Vec<&str> = planned
        .plan
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::Free { uid, .. } => Some(uid.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(freed, vec!["gone", "gone"], "{:?}", planned.plan);
    // a's parts are not "outside the pool" in the other shard, nor stale.
    assert!(
        planned.plan.findings.is_empty(),
        "{:?}",
        planned.plan.findings
    );
    let writes: Vec<(u16, Option<&str>)> = planned
        .writes
        .iter()
        .map(|w| (w.key.window, w.resource_version.as_deref()))
        .collect();
    assert_eq!(writes, vec![(117, Some("rv117")), (118, Some("rv118"))]);
    assert_eq!(entries(&planned.writes[0]), vec![("a", "web.http=30001")]);
    assert_eq!(planned.writes[0].status.allocated, 1);
    assert_eq!(planned.writes[0].status.size, 208);
    assert_eq!(planned.writes[1].status.holders.len(), 1);
    assert_eq!((planned.plan.holders, planned.plan.held_ports), (1, 2));
    assert!(planned.replace.is_empty());

    // A second pass over what was written has nothing to do.
    let after = applied(&p, &listed, &planned);
    let again = plan(p, &after, &live);
    assert!(again.plan.is_clean(), "{:?}", again.plan);
    assert!(again.writes.is_empty());
}

#[test]
fn a_recreated_pool_gets_every_holding_back_in_new_shards() {
    let old = pool_with_uid("old-uid");
    let mut listed = shards(&old, &[("a", &[30001, 30300]), ("b", &[30500])]);
    // The old pool's empty shard of window 120 goes too: it would block the new pool's.
    listed.push(shard_object(&old, 120, vec![]));
    let live = [
        pa("a", &[30001, 30300], "old-uid", 0),
        pa("b", &[30500], "old-uid", 1),
    ];
    let p = pool();
    let planned = plan(p.clone(), &listed, &live);
    // Reported as removed, not as "not loaded".
    assert!(
        planned.plan.findings.is_empty(),
        "{:?}",
        planned.plan.findings
    );
    let removed = planned
        .plan
        .changes
        .iter()
        .filter(|c| matches!(c, Change::RemoveShard { pool_uid, .. } if pool_uid == "old-uid"))
        .count();
    assert_eq!(removed, 4, "{:?}", planned.plan.changes);
    let writes: Vec<(u16, Option<&str>)> = planned
        .writes
        .iter()
        .map(|w| (w.key.window, w.resource_version.as_deref()))
        .collect();
    assert_eq!(writes, vec![(117, None), (118, None), (119, None)]);
    assert_eq!(entries(&planned.writes[2]), vec![("b", "web.http=30500")]);
    let replaced: Vec<&str> = planned.replace.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(replaced, vec!["p-117", "p-118", "p-119", "p-120"]);
    assert_eq!(planned.replace[0].uid, "old-uid-shard-117");
    let restored: Vec<&str> = planned
        .plan
        .restored
        .iter()
        .map(|r| r.uid.as_str())
        .collect();
    assert_eq!(restored, vec!["a", "b"]);
    assert_eq!((planned.plan.holders, planned.plan.held_ports), (2, 3));

    let after = applied(&p, &listed, &planned);
    let again = plan(p, &after, &live);
    assert!(again.plan.is_clean(), "{:?}", again.plan);
    assert!(again.writes.is_empty() && again.replace.is_empty());
}

#[test]
fn a_missing_shard_is_recreated_with_what_statuses_record_and_conflicts_reported() {
    let p = pool();
    // Window 118's shard is gone. c wrongly lists 30301 in window 117's shard.
    let mut listed = shards(&p, &[("a", &[30001, 30300])]);
    listed.retain(|s| s.spec.index == 117);
    listed[0].status.as_mut().unwrap().holders.push(PoolHolder {
        uid: "c".into(),
        owner: "ns/c".into(),
        ports: "web.http=30301".into(),
    });
    counted(&p, &mut listed);
    let live = [
        pa("a", &[30001, 30300], POOL_UID, 0),
        // d is younger than a and records a's port: a keeps it.
        pa("d", &[30300], POOL_UID, 5),
        // e records the port c lists in the wrong shard.
        pa("e", &[30301], POOL_UID, 6),
        pa("c", &[30301], POOL_UID, 7),
    ];
    let planned = plan(p.clone(), &listed, &live);
    assert_eq!(planned.writes.len(), 1, "{:?}", planned.plan);
    let write = &planned.writes[0];
    assert_eq!(
        (write.key.window, write.resource_version.as_deref()),
        (118, None)
    );
    assert_eq!(write.name, "p-118");
    // Pod 1's port alone: pod 0's is in window 117 ("-" keeps the index).
    assert_eq!(entries(write), vec![("a", "web.http=-,30300")]);
    assert_eq!((write.status.allocated, write.status.holder_count), (1, 1));
    let conflicts: Vec<(&str, u16, &str)> = planned
        .plan
        .findings
        .iter()
        .filter_map(|f| match f {
            Finding::RestoreConflict {
                owner,
                port,
                holder,
                ..
            } => Some((owner.as_str(), *port, holder.as_str())),
            _ => None,
        })
        .collect();
    assert!(
        conflicts.contains(&("ns/d", 30300, "ns/a")),
        "{conflicts:?}"
    );
    assert!(
        conflicts.contains(&("ns/e", 30301, "ns/c")),
        "{conflicts:?}"
    );
    assert!(
        planned.plan.findings.iter().any(|f| matches!(
            f,
            Finding::WrongShard { shard, port: 30301, .. } if shard == "p-117"
        )),
        "{:?}",
        planned.plan.findings
    );
    // Nothing in window 117 moves: c's entry stays.
    assert!(planned.writes.iter().all(|w| w.key.window != 117));
}

#[test]
fn an_existing_shard_without_the_entry_is_a_stale_status_not_a_restore() {
    let p = pool();
    let listed = shards(&p, &[("a", &[30001]), ("x", &[30400])]);
    let live = [
        pa("a", &[30001, 30300], POOL_UID, 0),
        pa("x", &[30400], POOL_UID, 1),
    ];
    let planned = plan(p, &listed, &live);
    assert!(planned.writes.is_empty(), "{:?}", planned.writes);
    let stale: Vec<&str> = planned
        .plan
        .findings
        .iter()
        .filter_map(|f| match f {
            Finding::StaleStatus { recorded, .. } => Some(recorded.as_str()),
            _ => None,
        })
        .collect();
    // Only the piece in window 118 is stale; window 117 holds a's other part.
    assert_eq!(stale, vec!["web.http=-,30300"]);
}

#[test]
fn a_missing_window_with_nothing_restorable_is_not_created() {
    let p = pool();
    let listed = shards(&p, &[("a", &[30001])]);
    // 30800 is in window 120 but outside the pool.
    let live = [pa("a", &[30001, 30800], POOL_UID, 0)];
    let planned = plan(p, &listed, &live);
    assert!(planned.writes.is_empty(), "{:?}", planned.writes);
    assert!(
        planned
            .plan
            .findings
            .iter()
            .any(|f| matches!(f, Finding::RestoreSkipped { port: 30800, .. })),
        "{:?}",
        planned.plan.findings
    );
}

#[test]
fn a_port_in_two_shards_is_reported_until_one_side_is_freed() {
    let p = pool();
    let mut listed = shards(&p, &[("a", &[30300])]);
    listed.push(shard_object(
        &p,
        117,
        vec![PoolHolder {
            uid: "b".into(),
            owner: "ns/b".into(),
            ports: "web.http=30300".into(),
        }],
    ));
    counted(&p, &mut listed);
    let both = [
        pa("a", &[30300], POOL_UID, 0),
        pa("b", &[30300], POOL_UID, 1),
    ];
    let planned = plan(p.clone(), &listed, &both);
    assert!(planned.writes.is_empty());
    let kinds: Vec<&str> = planned.plan.findings.iter().map(kind).collect();
    assert!(kinds.contains(&"HeldInTwoShards"), "{kinds:?}");
    assert!(kinds.contains(&"WrongShard"), "{kinds:?}");

    // b is gone: its wrong-shard entry is freed, and nothing is left to report.
    let planned = plan(p, &listed, &both[..1]);
    assert_eq!(planned.writes.len(), 1);
    assert_eq!(planned.writes[0].key.window, 117);
    assert!(
        planned.plan.findings.is_empty(),
        "{:?}",
        planned.plan.findings
    );
}

#[test]
fn a_window_whose_name_another_object_holds_is_left_alone() {
    let p = pool();
    let mut listed = shards(&p, &[("a", &[30001])]);
    // An object named p-118 that is no proper shard of window 118 (same pool UID).
    let mut odd = shard_object(&p, 118, vec![]);
    odd.spec.ranges = vec!["30208-30300".into()];
    listed.push(odd);
    let live = [pa("a", &[30001, 30300], POOL_UID, 0)];
    let planned = plan(p, &listed, &live);
    assert!(planned.writes.is_empty(), "{:?}", planned.writes);
    assert!(planned.replace.is_empty());
    let kinds: Vec<&str> = planned.plan.findings.iter().map(kind).collect();
    assert_eq!(kinds, vec!["NotLoaded"], "{:?}", planned.plan.findings);
}

fn kind(f: &Finding) -> &'static str {
    match f {
        Finding::HeldInTwoShards { .. } => "HeldInTwoShards",
        Finding::WrongShard { .. } => "WrongShard",
        Finding::NotLoaded { .. } => "NotLoaded",
        Finding::SlotApart { .. } => "SlotApart",
        _ => "other",
    }
}

/// `pa` with its status naming copy `copy` (as the allocator writes it for a pool with reuse).
fn in_copy(mut pa: PortAllocation, copy: u16) -> PortAllocation {
    let status = pa.status.as_mut().unwrap();
    let windows = split_by_shard(&crate::ledger::recorded_holdings(status));
    status.shards = windows
        .keys()
        .map(|&w| ShardKey::new(copy, w).to_status())
        .collect();
    pa
}

#[test]
fn a_pool_with_reuse_is_repaired_copy_by_copy() {
    let mut pool = pool();
    pool.spec.node_reuse = Some(2);
    let holder = |uid: &str, ports: &str| PoolHolder {
        uid: uid.into(),
        owner: format!("ns/{uid}"),
        ports: ports.into(),
    };
    let mut listed = shards(&pool, &[("a", &[30000])]);
    let mut second = new_shard(&PoolSnapshot::of_pool(&pool), ShardKey::new(1, 117));
    second.metadata.resource_version = Some("rv1.117".into());
    second.status = Some(PortPoolShardStatus {
        pool_generation: pool.metadata.generation.unwrap_or_default(),
        pool_spec: Some(pool.spec.clone()),
        holders: vec![
            holder("b", "web.http=30000"),
            holder("gone", "web.http=30001"),
        ],
        ..Default::default()
    });
    listed.push(second);
    let pas = vec![
        in_copy(pa("a", &[30000], POOL_UID, 0), 0),
        in_copy(pa("b", &[30000], POOL_UID, 1), 1),
        // Its copy-1 entry was lost with an earlier pool object: restored in copy 1, where
        // 30000 is b's but 30002 is free.
        in_copy(pa("d", &[30002], "old-uid", 2), 1),
    ];
    let planned = plan(pool, &listed, &pas);
    assert_eq!(planned.writes.len(), 1, "{:?}", planned.plan.changes);
    assert_eq!(planned.writes[0].key, ShardKey::new(1, 117));
    let after: Vec<&str> = planned.writes[0]
        .status
        .holders
        .iter()
        .map(|h| h.uid.as_str())
        .collect();
    assert_eq!(after, vec!["b", "d"]);
    assert!(
        planned
            .plan
            .changes
            .iter()
            .any(|c| matches!(c, Change::Free { uid, .. } if uid == "gone"))
    );
    assert_eq!(planned.plan.restored.len(), 1);
    // b's entry is in copy 1 as its status says: nothing stale, nothing in conflict with a.
    assert!(
        planned.plan.findings.is_empty(),
        "{:?}",
        planned.plan.findings
    );
    assert_eq!(planned.plan.holders, 3);
    assert_eq!(planned.plan.held_ports, 3);
}

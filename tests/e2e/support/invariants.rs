//! Checks of the must-hold invariants, read straight from the API server.

use std::collections::BTreeMap;

use kube::api::Api;
use kube::{Client, ResourceExt};
use portalloc::api::{Phase, PortAllocation, PortPool};
use portalloc::core::{Holdings, SlotKey};
use portalloc::k8s::ShardStore;
use portalloc::ledger::{PoolRecord, ShardAnomaly, ShardedRecord, recorded_holdings};

/// The pool as the allocator sees it: a sharded pool's shards joined into one record, after
/// checking that no shard has a cross-shard anomaly and every shard's counts are current.
pub async fn pool_record(client: &Client, pool: &str) -> PoolRecord {
    let pools: Api<PortPool> = Api::all(client.clone());
    let object = pools.get(pool).await.expect("pool exists");
    if object.status.as_ref().and_then(|s| s.format).is_none() {
        return PoolRecord::load(object).expect("pool spec is valid");
    }
    let shards = ShardStore::new(client.clone())
        .list(pool)
        .await
        .expect("list the pool's shards");
    let sharded = ShardedRecord::load(object, shards).expect("pool spec is valid");
    let cross: Vec<_> = sharded
        .anomalies
        .iter()
        .filter(|a| !matches!(a, ShardAnomaly::InShard { .. }))
        .collect();
    assert!(
        cross.is_empty(),
        "pool {pool}: cross-shard anomalies {cross:?}"
    );
    for shard in sharded.shards.values() {
        // A shard created but not yet written (a kill between the two requests) holds nothing
        // and claims nothing: there is no count to be stale.
        if shard.record.pool.status.is_none() {
            continue;
        }
        let counted = shard.record.current_status();
        let stored = shard.record.pool.status.clone().unwrap_or_default();
        assert_eq!(
            (stored.allocated, stored.available, stored.holder_count),
            (counted.allocated, counted.available, counted.holder_count),
            "shard {} of pool {pool}: stale counts",
            shard.record.name()
        );
    }
    let mut union = sharded.union_record();
    union.pool.status = Some(union.current_status());
    union
}

/// Every PortAllocation (all namespaces) that names `pool`, by UID.
pub async fn allocations_of(client: &Client, pool: &str) -> BTreeMap<String, PortAllocation> {
    let api: Api<PortAllocation> = Api::all(client.clone());
    api.list(&Default::default())
        .await
        .expect("list PortAllocations")
        .items
        .into_iter()
        .filter(|pa| pa.spec.pool == pool)
        .map(|pa| (pa.uid().unwrap(), pa))
        .collect()
}

/// No port held twice, nothing outside the pool, and every live PortAllocation's status records
/// exactly what the pool holds for it (but for ports a refused spec dropped: see
/// `undesired_after_refusal`). Returns the holdings by UID, less those ports.
pub async fn assert_consistent(client: &Client, pool: &str) -> BTreeMap<String, Holdings> {
    let record = pool_record(client, pool).await;
    assert!(
        record.anomalies.is_empty(),
        "pool {pool} has anomalies: {:?}",
        record.anomalies
    );
    let mut seen = BTreeMap::new();
    for (uid, holder) in &record.holders {
        for port in holder.holdings.ports() {
            if let Some(other) = seen.insert(port, uid.clone()) {
                panic!("port {port} of pool {pool} is held by both {other} and {uid}");
            }
        }
    }
    let live = allocations_of(client, pool).await;
    let mut awaiting_release = BTreeMap::new();
    for (uid, pa) in &live {
        let recorded = pa
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default();
        let held = record.holdings_of(uid);
        let undesired = undesired_after_refusal(pa, &recorded, &held);
        let mut expected = held.clone();
        for slot in &undesired {
            expected.remove(slot);
        }
        assert_eq!(
            recorded,
            expected,
            "status of {}/{} differs from its pool entry",
            pa.namespace().unwrap(),
            pa.name_any()
        );
        if !undesired.is_empty() {
            awaiting_release.insert(uid.clone(), expected);
        }
    }
    let status = record.pool.status.clone().unwrap_or_default();
    assert_eq!(
        status.allocated as usize,
        seen.len(),
        "pool {pool}: status.allocated is stale"
    );
    assert_eq!(
        status.available as u32,
        record.state.size() - seen.len() as u32
    );
    record
        .holders
        .into_iter()
        .map(|(uid, h)| {
            let holdings = awaiting_release.remove(&uid).unwrap_or(h.holdings);
            (uid, holdings)
        })
        .collect()
}

/// A refused sync changes nothing in the pool. If the spec it refused also dropped a port, the
/// pool still holds that port for the object (the next sync that succeeds releases it) while its
/// status, which lists the spec's ports, no longer shows it. The slots so explained: held, not
/// recorded, on a Failed object, and of a (role, port) its spec no longer has.
fn undesired_after_refusal(
    pa: &PortAllocation,
    recorded: &Holdings,
    held: &Holdings,
) -> Vec<SlotKey> {
    let refused = pa.status.as_ref().and_then(|s| s.phase) == Some(Phase::Failed);
    if !refused {
        return Vec::new();
    }
    let in_spec = |role: &str, port: &str| {
        pa.spec
            .roles
            .iter()
            .any(|r| r.name == role && r.ports.iter().any(|p| p.name == port))
    };
    held.iter()
        .map(|(slot, _)| slot)
        .filter(|slot| recorded.block(slot).is_none() && !in_spec(slot.spec_role(), &slot.port))
        .cloned()
        .collect()
}

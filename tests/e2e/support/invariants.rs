//! Checks of the must-hold invariants, read straight from the API server.

use std::collections::BTreeMap;

use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use portalloc::api::{Phase, PoolHolder, PortAllocation, PortPool, PortPoolShard};
use portalloc::core::{Holdings, SlotKey};
use portalloc::k8s::ShardStore;
use portalloc::ledger::{
    CopyRecord, PoolRecord, PoolSnapshot, ShardAnomaly, WindowRecord, load_shard, recorded_copies,
    recorded_holdings, window_of,
};

/// Copy 0 of the pool as the allocator sees it: its shards joined into one record, after
/// checking that no shard has a cross-shard anomaly and every shard's counts are current. The
/// whole pool, for a pool without reuse.
pub async fn window_record(client: &Client, pool: &str) -> WindowRecord {
    pool_record(client, pool).await.first().union_record()
}

/// Copy 0 of the pool and its shards as read, checked as [`window_record`] says.
pub async fn copy_record(client: &Client, pool: &str) -> CopyRecord {
    pool_record(client, pool).await.first().clone()
}

/// The pool and its shards in every copy as read: no shard has a cross-shard anomaly, no shard
/// is left out of the record, and every shard's counts are current.
pub async fn pool_record(client: &Client, pool: &str) -> PoolRecord {
    let pools: Api<PortPool> = Api::all(client.clone());
    let object = pools.get(pool).await.expect("pool exists");
    let shards = ShardStore::new(client.clone())
        .list(pool)
        .await
        .expect("list the pool's shards");
    let record =
        PoolRecord::load(PoolSnapshot::of_pool(&object), shards).expect("pool spec is valid");
    let cross: Vec<_> = record
        .all_anomalies()
        .filter(|(_, a)| !matches!(a, ShardAnomaly::InShard { .. }))
        .collect();
    assert!(
        cross.is_empty(),
        "pool {pool}: cross-shard anomalies {cross:?}"
    );
    for shard in record.copies.values().flat_map(|copy| copy.shards.values()) {
        // A shard created but not yet written (a kill between the two requests) holds nothing
        // and claims nothing: there is no count to be stale.
        let Some(stored) = shard.record.shard.status.clone() else {
            continue;
        };
        let counted = shard.record.current_status();
        assert_eq!(
            (stored.allocated, stored.available, stored.holder_count),
            (counted.allocated, counted.available, counted.holder_count),
            "shard {} of pool {pool}: stale counts",
            shard.record.name()
        );
    }
    record
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

/// No port held twice in one copy of the pool, nor by more holders than its `nodeReuse`,
/// nothing outside the pool, each of a holder's slots in one copy (all in one, or its pods
/// spread over several), and every live PortAllocation's status records exactly what the pool
/// holds for it and the copy of each slot (but for ports a refused spec dropped: see
/// `undesired_after_refusal`). Returns the holdings by UID, less
/// those ports.
pub async fn assert_consistent(client: &Client, pool: &str) -> BTreeMap<String, Holdings> {
    let record = pool_record(client, pool).await;
    let reuse = usize::from(record.reuse());
    let mut holders_of_port: BTreeMap<u16, Vec<(u16, String)>> = BTreeMap::new();
    let mut copy_of: BTreeMap<String, BTreeMap<SlotKey, u16>> = BTreeMap::new();
    for (&copy, shards) in &record.copies {
        let union = shards.union_record();
        assert!(
            union.anomalies.is_empty(),
            "pool {pool}, copy {copy} has anomalies: {:?}",
            union.anomalies
        );
        for (uid, holder) in &union.holders {
            let slots = copy_of.entry(uid.clone()).or_default();
            for (slot, _) in holder.holdings.iter() {
                if let Some(other) = slots.insert(slot.clone(), copy) {
                    panic!(
                        "{} ({uid}) holds {slot:?} in copies {other} and {copy} of pool {pool}",
                        holder.owner
                    );
                }
            }
            for port in holder.holdings.ports() {
                let holders = holders_of_port.entry(port).or_default();
                if let Some((_, other)) = holders.iter().find(|(c, _)| *c == copy) {
                    panic!(
                        "port {port} of pool {pool} is held by both {other} and {uid} in copy {copy}"
                    );
                }
                holders.push((copy, uid.clone()));
            }
        }
    }
    // Following the nodes: a port's other holders times the largest pod stay below the nodes
    // counted (the rule of `ledger::node_bound`); else at most `nodeReuse` holders.
    if record.pool.spec.follow_nodes.is_some() {
        let nodes = match &record.pool.nodes {
            Some(portalloc::ledger::NodeCount::Counted(n)) => u64::from(*n),
            _ => 0,
        };
        let largest = u64::from(record.largest_pod().max(1));
        for (port, holders) in &holders_of_port {
            let others = holders.len() as u64 - 1;
            assert!(
                others == 0 || largest * others < nodes,
                "port {port} of pool {pool} has {} holders, pods of {largest} ports, {nodes} \
                 nodes counted: {holders:?}",
                holders.len()
            );
        }
    }
    for (port, holders) in holders_of_port
        .iter()
        .filter(|_| record.pool.spec.follow_nodes.is_none())
    {
        assert!(
            holders.len() <= reuse,
            "port {port} of pool {pool} has {} holders, nodeReuse {reuse}: {holders:?}",
            holders.len()
        );
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
        if let Some(slots) = copy_of.get(uid)
            && let Some(status) = pa.status.as_ref()
        {
            let mut in_copies = recorded_copies(status);
            in_copies.retain(|slot, _| expected.contains(slot));
            let mut expected_copies = slots.clone();
            expected_copies.retain(|slot, _| expected.contains(slot));
            assert_eq!(
                in_copies,
                expected_copies,
                "status of {}/{} names other copies than its entries are in",
                pa.namespace().unwrap(),
                pa.name_any()
            );
        }
        if !undesired.is_empty() {
            awaiting_release.insert(uid.clone(), expected);
        }
    }
    copy_of
        .into_keys()
        .map(|uid| {
            let holdings = awaiting_release
                .remove(&uid)
                .unwrap_or_else(|| record.holdings_of(&uid));
            (uid, holdings)
        })
        .collect()
}

/// A refused sync changes nothing in the pool. If the spec it refused also dropped a port (a port
/// removed, or pods scaled down), the pool still holds that port for the object (the next sync
/// that succeeds releases it) while its status, which lists the spec's ports, no longer shows
/// it. The slots so explained: held, not recorded, on a Failed object, and not asked for by its
/// spec.
fn undesired_after_refusal(
    pa: &PortAllocation,
    recorded: &Holdings,
    held: &Holdings,
) -> Vec<SlotKey> {
    let refused = pa.status.as_ref().and_then(|s| s.phase) == Some(Phase::Failed);
    if !refused {
        return Vec::new();
    }
    // The slots the spec asks for: a scale-down drops indices, not only whole ports.
    let desired = pa
        .spec
        .demands()
        .map(|demands| portalloc::core::desired_slots(&demands))
        .ok();
    let in_spec = |slot: &SlotKey| match &desired {
        Some(desired) => desired.contains_key(slot),
        None => pa
            .spec
            .roles
            .iter()
            .any(|r| r.name == slot.spec_role() && r.ports.iter().any(|p| p.name == slot.port)),
    };
    held.iter()
        .map(|(slot, _)| slot)
        .filter(|slot| recorded.block(slot).is_none() && !in_spec(slot))
        .cloned()
        .collect()
}

/// Each shard of `pool` with its resourceVersion: equal before and after means nothing wrote
/// the pool's record.
pub async fn shard_versions(client: &Client, pool: &str) -> Vec<(String, Option<String>)> {
    let mut versions: Vec<_> = ShardStore::new(client.clone())
        .list(pool)
        .await
        .expect("list the pool's shards")
        .into_iter()
        .map(|s| (s.name_any(), s.resource_version()))
        .collect();
    versions.sort();
    versions
}

/// Replace the entries of `pool`'s shards (of copy 0) with `holders`, as a buggy or killed client might
/// have left them (counts recomputed, as any client's write does): each entry goes to the shard
/// of its lowest port (an undecodable one to the pool's first shard), and every shard is
/// written. As `client`'s user; the first refused write is returned.
pub async fn write_holders(
    client: &Client,
    pool: &str,
    holders: Vec<PoolHolder>,
) -> Result<(), kube::Error> {
    let object = Api::<PortPool>::all(client.clone()).get(pool).await?;
    let copy = PoolSnapshot::of_pool(&object);
    let layout = copy.layout().expect("pool spec is valid");
    let shards = ShardStore::new(client.clone())
        .list(pool)
        .await
        .map_err(|(e, _)| e)?;
    let first = layout.shards()[0].index;
    let mut by_shard: BTreeMap<u16, Vec<PoolHolder>> = BTreeMap::new();
    for holder in holders {
        let index = Holdings::decode(&holder.ports)
            .ok()
            .and_then(|h| h.ports().min())
            .map_or(first, window_of);
        by_shard.entry(index).or_default().push(holder);
    }
    let api: Api<PortPoolShard> = Api::all(client.clone());
    for mut shard in shards
        .into_iter()
        .filter(|s| s.spec.pool_uid == copy.uid && s.spec.copy == 0)
    {
        let index = shard.spec.index as u16;
        let mut status = shard.status.clone().unwrap_or_default();
        status.holders = by_shard.remove(&index).unwrap_or_default();
        shard.status = Some(status);
        let counted = load_shard(&copy, &layout, index, shard.clone()).current_status();
        shard.status = Some(counted);
        api.replace_status(&shard.name_any(), &PostParams::default(), &shard)
            .await?;
    }
    assert!(
        by_shard.is_empty(),
        "every window of {pool} has a shard: {by_shard:?}"
    );
    Ok(())
}

/// [`write_holders`] as the administrator.
pub async fn set_holders(client: &Client, pool: &str, holders: Vec<PoolHolder>) {
    write_holders(client, pool, holders)
        .await
        .expect("write the pool's shards");
}

/// The PortPool object's UID.
pub async fn pool_uid(client: &Client, pool: &str) -> String {
    Api::<PortPool>::all(client.clone())
        .get(pool)
        .await
        .expect("pool exists")
        .uid()
        .unwrap()
}

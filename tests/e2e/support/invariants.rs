//! Checks of the must-hold invariants, read straight from the API server.

use std::collections::BTreeMap;

use kube::api::Api;
use kube::{Client, ResourceExt};
use portalloc::api::{PortAllocation, PortPool};
use portalloc::core::Holdings;
use portalloc::ledger::{PoolRecord, recorded_holdings};

/// The pool as the allocator sees it.
pub async fn pool_record(client: &Client, pool: &str) -> PoolRecord {
    let pools: Api<PortPool> = Api::all(client.clone());
    PoolRecord::load(pools.get(pool).await.expect("pool exists")).expect("pool spec is valid")
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
/// exactly what the pool holds for it. Returns the holdings by UID.
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
    for (uid, pa) in &live {
        let recorded = pa
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default();
        assert_eq!(
            recorded,
            record.holdings_of(uid),
            "status of {}/{} differs from its pool entry",
            pa.namespace().unwrap(),
            pa.name_any()
        );
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
        .map(|(uid, h)| (uid, h.holdings))
        .collect()
}

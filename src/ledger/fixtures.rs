//! Pools, entries and records for the ledger's unit tests.

use crate::api::{
    PoolHolder, PortAllocation, PortAllocationSpec, PortPool, PortPoolShard, PortPoolShardStatus,
    PortPoolSpec, PortRequest, PortScope, Role, StaticBandSetting,
};
use crate::core::{PortDemand, Scope};

use super::decision::Operation;
use super::record::pool_record::PoolRecord;
use super::record::pool_snapshot::PoolSnapshot;
use super::record::shard_record::new_shard;
use super::record::window_record::WindowRecord;
use super::record::windows::ShardKey;

/// Pool `p` (UID `pool-uid`, generation 1) over `ranges` less `exclude`, no static band.
pub fn pool_of(ranges: &[&str], exclude: &[&str]) -> PortPool {
    let mut pool = PortPool::new(
        "p",
        PortPoolSpec {
            ranges: ranges.iter().map(|&r| r.into()).collect(),
            exclude: exclude.iter().map(|&r| r.into()).collect(),
            protocol: Default::default(),
            static_band: StaticBandSetting::None,
            node_reuse: None,
            follow_nodes: None,
            guard: None,
            allow_overlap: false,
        },
    );
    pool.metadata.uid = Some("pool-uid".into());
    pool.metadata.generation = Some(1);
    pool
}

/// [`pool_of`] with `nodeReuse: reuse`.
pub fn pool_reused(ranges: &[&str], reuse: i32) -> PortPool {
    let mut pool = pool_of(ranges, &[]);
    pool.spec.node_reuse = Some(reuse);
    pool
}

/// The entry of owner `ns/<uid>`.
pub fn holder(uid: &str, ports: &str) -> PoolHolder {
    PoolHolder {
        uid: uid.into(),
        owner: format!("ns/{uid}"),
        ports: ports.into(),
    }
}

/// Entries from `(uid, ports)` pairs.
pub fn holders(pairs: &[(&str, &str)]) -> Vec<PoolHolder> {
    pairs
        .iter()
        .map(|(uid, ports)| holder(uid, ports))
        .collect()
}

/// Every port of `pool` as one record holding `holders`.
pub fn whole_record(pool: &PortPool, holders: Vec<PoolHolder>) -> WindowRecord {
    let copy = PoolSnapshot::of_pool(pool);
    let ports = copy.ports().expect("a valid test pool");
    let static_band = copy.spec.core_static_band();
    WindowRecord::joined(copy, ports, static_band, holders)
}

/// Shard `index` of `pool`, read at version `rv<index>`, holding `holders`.
pub fn shard_of(pool: &PortPool, index: u16, holders: Vec<PoolHolder>) -> PortPoolShard {
    shard_in(pool, ShardKey::first(index), holders)
}

/// Shard `key` of `pool`, read at version `rv<copy>.<window>`, holding `holders`.
pub fn shard_in(pool: &PortPool, key: ShardKey, holders: Vec<PoolHolder>) -> PortPoolShard {
    let mut shard = new_shard(&PoolSnapshot::of_pool(pool), key);
    shard.metadata.resource_version = Some(match key.copy {
        0 => format!("rv{}", key.window),
        copy => format!("rv{copy}.{}", key.window),
    });
    shard.status = Some(PortPoolShardStatus {
        pool_generation: pool.metadata.generation.unwrap_or_default(),
        pool_spec: Some(pool.spec.clone()),
        holders,
        ..Default::default()
    });
    shard
}

/// `pool` and the given shards, loaded.
pub fn sharded(pool: &PortPool, shards: Vec<PortPoolShard>) -> PoolRecord {
    pool_record(pool, shards)
}

/// `pool` and the given shards of any copies, loaded.
pub fn pool_record(pool: &PortPool, shards: Vec<PortPoolShard>) -> PoolRecord {
    PoolRecord::load(PoolSnapshot::of_pool(pool), shards).expect("a valid test pool")
}

/// A PortAllocation `name` (uid = name) with one role of `replicas` pods, one PodScoped port
/// each, or one RoleScoped port fixed at `fixed`.
pub fn allocation(name: &str, replicas: i32, fixed: Option<i32>) -> PortAllocation {
    let request = PortRequest {
        name: "http".into(),
        scope: if fixed.is_some() {
            PortScope::RoleScoped
        } else {
            PortScope::PodScoped
        },
        env: "HTTP_PORT".into(),
        port: fixed,
        ..Default::default()
    };
    let mut pa = PortAllocation::new(
        name,
        PortAllocationSpec {
            pool: "p".into(),
            roles: vec![Role {
                name: "web".into(),
                replicas,
                ports: vec![request],
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    pa.metadata.namespace = Some("ns".into());
    pa.metadata.uid = Some(name.into());
    pa
}

/// A sync asking one RoleScoped block of each of `counts` ports (one replica).
pub fn blocks(counts: &[u32]) -> Operation {
    let demand = |(i, &count): (usize, &u32)| PortDemand {
        role: "r".into(),
        port: format!("p{i}"),
        scope: Scope::RoleScoped,
        replicas: 1,
        requested: None,
        count,
    };
    Operation::Sync(counts.iter().enumerate().map(demand).collect())
}

//! A sharded pool seen as one record, for readers (`pool describe`, `pool get`): the PortPool
//! status counts of a sharded pool are not kept current (that would make the PortPool a hot
//! object again), so what readers show is computed from the shards. Pure.

use std::collections::BTreeMap;

use crate::api::{PoolHolder, PortPool, PortPoolStatus, RecordFormat, SpecError};

use super::pool_record::PoolRecord;
use super::sharded_record::{ShardAnomaly, ShardedRecord};

/// Whether `pool`'s record lives in shards.
pub fn is_sharded(pool: &PortPool) -> bool {
    pool.status
        .as_ref()
        .is_some_and(|s| s.format == Some(RecordFormat::Sharded))
}

/// The union of the shards as one record over the pool's ports: one entry per owner (the
/// pieces of a spanning owner joined), undecodable entries verbatim. Counts, free runs and
/// holders then read as for a one-object pool.
pub fn union_record(sharded: &ShardedRecord) -> Result<PoolRecord, SpecError> {
    let mut entries: BTreeMap<String, PoolHolder> = BTreeMap::new();
    for shard in sharded.shards.values() {
        for (uid, entry) in &shard.record.holders {
            entries.entry(uid.clone()).or_insert_with(|| PoolHolder {
                uid: uid.clone(),
                owner: entry.owner.clone(),
                ports: sharded.holdings_of(uid).encode(),
            });
        }
    }
    for shard in sharded.shards.values() {
        for (uid, raw) in &shard.record.opaque {
            entries.entry(uid.clone()).or_insert_with(|| raw.clone());
        }
    }
    let mut pool = sharded.pool.clone();
    let format = pool.status.as_ref().and_then(|s| s.format);
    pool.status = Some(PortPoolStatus {
        format,
        holders: entries.into_values().collect(),
        ..Default::default()
    });
    PoolRecord::load(pool)
}

/// The cross-shard anomalies as warning lines (the per-shard ones show in the union record).
pub fn shard_warnings(sharded: &ShardedRecord) -> Vec<String> {
    let name_of = |k: u16| {
        sharded
            .shards
            .get(&k)
            .map_or_else(|| format!("window {k}"), |s| s.record.name().to_string())
    };
    sharded
        .anomalies
        .iter()
        .filter_map(|anomaly| match anomaly {
            ShardAnomaly::InShard { .. } | ShardAnomaly::HeldInTwoShards { .. } => None,
            ShardAnomaly::WrongShard {
                shard,
                owner,
                slot,
                port,
                ..
            } => Some(format!(
                "{owner} holds port {port} ({slot}) in shard {}, whose window does not contain it: run `kubectl portalloc repair`",
                name_of(*shard)
            )),
            ShardAnomaly::SlotApart { uid, slot, shards } => Some(format!(
                "uid {uid} holds {slot} in pieces that do not join (shards {}): run `kubectl portalloc repair`",
                shards
                    .iter()
                    .map(|&k| name_of(k))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            ShardAnomaly::NotLoaded { name, reason } => Some(format!(
                "shard {name} is not part of the record: {reason}"
            )),
        })
        .collect()
}

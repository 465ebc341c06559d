//! A sharded pool seen as one record, for readers (`pool describe`, `pool get`): the PortPool
//! status counts of a sharded pool are not kept current (that would make the PortPool a hot
//! object again), so what readers show is computed from the shards
//! ([`ShardedRecord::union_record`]). Pure.

use crate::api::{PortPool, RecordFormat};

use super::sharded_record::{ShardAnomaly, ShardedRecord};

/// Whether `pool`'s record lives in shards.
pub fn is_sharded(pool: &PortPool) -> bool {
    pool.status
        .as_ref()
        .is_some_and(|s| s.format == Some(RecordFormat::Sharded))
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

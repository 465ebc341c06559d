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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        PoolHolder, PortPoolShardStatus, PortPoolSpec, PortPoolStatus, StaticBandSetting,
    };
    use crate::ledger::new_shard;

    fn pool(format: Option<RecordFormat>) -> PortPool {
        let mut pool = PortPool::new(
            "p",
            PortPoolSpec {
                ranges: vec!["30000-30767".into()],
                exclude: vec![],
                protocol: Default::default(),
                static_band: StaticBandSetting::None,
            },
        );
        pool.metadata.uid = Some("pool-uid".into());
        pool.status = Some(PortPoolStatus {
            format,
            ..Default::default()
        });
        pool
    }

    #[test]
    fn only_a_pool_marked_sharded_is_read_from_shards() {
        assert!(is_sharded(&pool(Some(RecordFormat::Sharded))));
        assert!(!is_sharded(&pool(Some(RecordFormat::Migrating))));
        assert!(!is_sharded(&pool(None)));
    }

    #[test]
    fn warnings_name_the_shard_and_what_is_wrong() {
        let p = pool(Some(RecordFormat::Sharded));
        let mut wrong = new_shard(&p, 117);
        // 30300 is window 118's port.
        wrong.status = Some(PortPoolShardStatus {
            holders: vec![PoolHolder {
                uid: "u".into(),
                owner: "ns/a".into(),
                ports: "web.http=30300".into(),
            }],
            ..Default::default()
        });
        let mut old = new_shard(&p, 119);
        old.spec.pool_uid = "old-uid".into();
        let sharded = ShardedRecord::load(p, vec![wrong, old]).unwrap();
        let warnings = shard_warnings(&sharded);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[1].starts_with("ns/a holds port 30300 (web.http[0]) in shard p-117,"),
            "{warnings:?}"
        );
        assert!(
            warnings[0].starts_with(
                "shard p-119 is not part of the record: it belongs to an earlier pool"
            ),
            "{warnings:?}"
        );
    }
}

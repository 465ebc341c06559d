//! A pool seen as one record, for readers (`pool describe`, `pool get`): its usage is never
//! kept on the PortPool (that would make it a hot object again), so what readers show is
//! computed from the shards ([`CopyRecord::union_record`]), and what only the shards show is
//! said in warnings. Pure.

use super::copy_record::{CopyRecord, ShardAnomaly};
use super::pool_snapshot::PoolSnapshot;

/// The cross-shard anomalies as warning lines (the per-shard ones show in the union record),
/// and shards that still carry an older spec of the pool.
pub fn record_warnings(sharded: &CopyRecord) -> Vec<String> {
    let name_of = |k: u16| {
        sharded
            .shards
            .get(&k)
            .map_or_else(|| format!("window {k}"), |s| s.record.name().to_string())
    };
    let behind: Vec<String> = sharded
        .shards
        .values()
        .filter(|s| s.is_behind(&sharded.pool) && PoolSnapshot::of_shard(&s.record.shard).is_some())
        .map(|s| s.record.name().to_string())
        .collect();
    let stale = (!behind.is_empty()).then(|| {
        format!(
            "{} of {} shards carry an older spec of the pool ({}): allocations in them follow it              until `kubectl portalloc sync --all -A` or `kubectl portalloc repair --apply`              writes the new one",
            behind.len(),
            sharded.shards.len(),
            behind.join(", ")
        )
    });
    let anomalies = sharded
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
        });
    stale.into_iter().chain(anomalies).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fixtures::{holder, pool_of, shard_of, sharded};

    #[test]
    fn warnings_name_the_shard_and_what_is_wrong() {
        let mut pool = pool_of(&["30000-30767"], &[]);
        // 30300 is window 118's port.
        let wrong = shard_of(&pool, 117, vec![holder("u", "web.http=30300")]);
        let mut old = shard_of(&pool, 119, vec![]);
        old.spec.pool_uid = "old-uid".into();
        let behind = shard_of(&pool, 120, vec![]);
        pool.metadata.generation = Some(2);
        let mut current = shard_of(&pool, 118, vec![]);
        current.status.as_mut().unwrap().pool_generation = 2;
        let warnings = record_warnings(&sharded(&pool, vec![wrong, old, behind, current]));
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(
            warnings[0].starts_with("2 of 3 shards carry an older spec of the pool (p-117, p-120)"),
            "{warnings:?}"
        );
        assert!(
            warnings[2].starts_with("ns/u holds port 30300 (web.http[0]) in shard p-117,"),
            "{warnings:?}"
        );
        assert!(
            warnings[1].starts_with(
                "shard p-119 is not part of the record: it belongs to an earlier pool"
            ),
            "{warnings:?}"
        );
    }
}

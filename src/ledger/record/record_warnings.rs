//! A pool seen as one record, for readers (`pool describe`, `pool get`): its usage is never
//! kept on the PortPool (that would make it a hot object again), so what readers show is
//! computed from the shards ([`CopyRecord::union_record`], per copy), and what only the shards
//! show is said in warnings. Pure.

use super::copy_record::CopyRecord;
use super::holdings_across_shards::ShardAnomaly;
use super::pool_record::PoolRecord;
use super::pool_snapshot::PoolSnapshot;
use super::windows::ShardKey;

/// The cross-shard anomalies of every copy as warning lines (the per-shard ones show in the
/// union records), shards that still carry an older spec of the pool, and copies past
/// `nodeReuse` that still hold ports.
pub fn record_warnings(record: &PoolRecord) -> Vec<String> {
    let all_shards = || record.copies.values().flat_map(|copy| copy.shards.values());
    let behind: Vec<String> = all_shards()
        .filter(|s| s.is_behind(&record.pool) && PoolSnapshot::of_shard(&s.record.shard).is_some())
        .map(|s| s.record.name().to_string())
        .collect();
    let shard_count = all_shards().count();
    let stale = (!behind.is_empty()).then(|| {
        format!(
            "{} of {} shards carry an older spec of the pool ({}): allocations in them follow it              until `kubectl portalloc sync --all -A` or `kubectl portalloc repair --apply`              writes the new one",
            behind.len(),
            shard_count,
            behind.join(", ")
        )
    });
    let beyond = record
        .copies
        .range(record.reuse()..)
        .filter(|(_, copy)| copy.held() > 0)
        .map(|(&copy, record_of_copy)| {
            format!(
                "copy {copy} holds {} ports but nodeReuse is {}: its holders keep them and take no \
                 more; set nodeReuse to {} again or release them",
                record_of_copy.held(),
                record.reuse(),
                copy + 1
            )
        });
    let not_loaded = record.anomalies.iter().filter_map(|anomaly| match anomaly {
        ShardAnomaly::NotLoaded { name, reason } => {
            Some(format!("shard {name} is not part of the record: {reason}"))
        }
        _ => None,
    });
    let anomalies = record.copies.values().flat_map(copy_warnings);
    stale
        .into_iter()
        .chain(beyond)
        .chain(not_loaded)
        .chain(anomalies)
        .collect()
}

/// One copy's cross-shard anomalies as warning lines.
fn copy_warnings(sharded: &CopyRecord) -> Vec<String> {
    let name_of = |k: u16| {
        sharded.shards.get(&k).map_or_else(
            || ShardKey::new(sharded.copy, k).to_string(),
            |s| s.record.name().to_string(),
        )
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
    use crate::ledger::fixtures::{holder, pool_of, pool_record, pool_reused, shard_in, shard_of};

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
        let warnings = record_warnings(&pool_record(&pool, vec![wrong, old, behind, current]));
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

    #[test]
    fn a_copy_past_node_reuse_that_holds_ports_is_named() {
        let mut pool = pool_reused(&["30000-30767"], 3);
        let third = shard_in(
            &pool,
            ShardKey::new(2, 117),
            vec![holder("u", "web.http=30001")],
        );
        pool.spec.node_reuse = Some(2);
        let warnings = record_warnings(&pool_record(&pool, vec![third]));
        assert_eq!(
            warnings,
            vec![
                "copy 2 holds 1 ports but nodeReuse is 2: its holders keep them and take no more; \
                 set nodeReuse to 3 again or release them"
                    .to_string()
            ]
        );
    }
}

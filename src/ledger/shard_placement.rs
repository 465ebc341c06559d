//! Where a PortAllocation's entries in a sharded pool may be, from its own status, and whether
//! one shard alone can decide its next operation (docs/record-at-scale.md, "Placement").
//!
//! The rule that makes a killed sync safe: an owner has entries only in its *known* shards —
//! `status.shards` when set, else the windows of the ports its status records, else its home
//! shard. A write outside the known set is preceded by a status write that widens it, so the
//! next sync (from any client) looks in every shard that may hold a part.

use std::collections::BTreeSet;

use crate::api::PortAllocationStatus;
use crate::core::PortDemand;

use super::allocation_status::recorded_holdings;
use super::decision::Operation;
use super::shard_layout::{ShardLayout, shard_index_of};
use super::sharded_record::split_by_shard;

/// The shards where the owner `uid` may have entries, by the rule above. `pool_uid` is the
/// current pool's: ports recorded against an earlier pool of the same name say nothing about
/// this one's shards.
pub fn known_shards(
    status: Option<&PortAllocationStatus>,
    pool_uid: Option<&str>,
    layout: &ShardLayout,
    uid: &str,
) -> BTreeSet<u16> {
    if let Some(status) = status {
        let listed: BTreeSet<u16> = status
            .shards
            .iter()
            .filter_map(|&k| u16::try_from(k).ok())
            .filter(|&k| k <= 255)
            .collect();
        if !listed.is_empty() {
            return listed;
        }
        if pool_uid.is_some() && status.pool_uid.as_deref() == pool_uid {
            let recorded: BTreeSet<u16> = split_by_shard(&recorded_holdings(status))
                .into_keys()
                .collect();
            if !recorded.is_empty() {
                return recorded;
            }
        }
    }
    home_shard(layout, uid).into_iter().collect()
}

/// The first shard of the owner's home order (dynamic-band shards first).
pub fn home_shard(layout: &ShardLayout, uid: &str) -> Option<u16> {
    layout.home_order(uid).first().copied()
}

/// The one shard that can decide `operation` alone, if any: the owner's only known shard, and
/// every port it requests lies in that shard's window. `None` asks for the whole pool.
pub fn single_shard(known: &BTreeSet<u16>, operation: &Operation) -> Option<u16> {
    let [only] = known.iter().copied().collect::<Vec<_>>()[..] else {
        return None;
    };
    let requested_inside = |demands: &[PortDemand]| {
        demands.iter().all(|d| {
            d.requested.is_none_or(|first| {
                let last = u32::from(first) + d.count.max(1) - 1;
                shard_index_of(first) == only
                    && u16::try_from(last).is_ok_and(|last| shard_index_of(last) == only)
            })
        })
    };
    match operation {
        Operation::Sync(demands) if requested_inside(demands) => Some(only),
        Operation::Sync(_) | Operation::Remove => None,
        Operation::Release { .. } => Some(only),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortAssignment, Scope};
    use crate::core::{PortSet, StaticBand};

    fn layout() -> ShardLayout {
        let ports: PortSet = "30000-32767".parse().unwrap();
        ShardLayout::new(&ports, StaticBand::None)
    }

    fn status_with_ports(values: Vec<i32>, pool_uid: &str) -> PortAllocationStatus {
        PortAllocationStatus {
            pool_uid: Some(pool_uid.into()),
            assignments: vec![PortAssignment {
                role: "web".into(),
                port: "http".into(),
                scope: Scope::PodScoped,
                env: "HTTP_PORT".into(),
                values,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn listed_shards_win_then_recorded_ports_then_home() {
        let layout = layout();
        let home = home_shard(&layout, "u1").unwrap();
        assert_eq!(known_shards(None, Some("p"), &layout, "u1"), [home].into());

        // 30000 is window 117, 31000 window 121.
        let recorded = status_with_ports(vec![30000, 31000], "p");
        assert_eq!(
            known_shards(Some(&recorded), Some("p"), &layout, "u1"),
            [117, 121].into()
        );
        // Ports recorded against an earlier pool of the same name: only the home is known.
        assert_eq!(
            known_shards(Some(&recorded), Some("q"), &layout, "u1"),
            [home].into()
        );
        let mut listed = recorded.clone();
        listed.shards = vec![120, 300, -1];
        assert_eq!(
            known_shards(Some(&listed), Some("p"), &layout, "u1"),
            [120].into(),
            "indices outside 0-255 are ignored"
        );
    }

    fn demand(requested: Option<u16>, count: u32) -> PortDemand {
        PortDemand {
            role: "web".into(),
            port: "http".into(),
            scope: crate::core::Scope::RoleScoped,
            replicas: 1,
            requested,
            count,
        }
    }

    #[test]
    fn one_known_shard_decides_alone_unless_a_requested_port_lies_elsewhere() {
        let one: BTreeSet<u16> = [117].into();
        let sync = |d| Operation::Sync(vec![d]);
        assert_eq!(single_shard(&one, &sync(demand(None, 8))), Some(117));
        assert_eq!(single_shard(&one, &sync(demand(Some(30000), 1))), Some(117));
        assert_eq!(single_shard(&one, &sync(demand(Some(31000), 1))), None);
        // 30200-30215 crosses from window 117 into 118.
        assert_eq!(single_shard(&one, &sync(demand(Some(30200), 16))), None);
        assert_eq!(
            single_shard(&one, &Operation::Release { role: None }),
            Some(117)
        );
        assert_eq!(single_shard(&one, &Operation::Remove), None);
        let two: BTreeSet<u16> = [117, 118].into();
        assert_eq!(single_shard(&two, &sync(demand(None, 1))), None);
    }
}

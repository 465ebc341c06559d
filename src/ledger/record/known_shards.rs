//! Where a PortAllocation's entries in a pool may be, from its own status, and whether one shard
//! alone can decide its next operation (docs/record-at-scale.md, "Placement").
//!
//! The rule that makes a killed sync safe: an owner has entries only in its *known* shards —
//! `status.shards` when set, else its home shard. A write outside the known set is preceded by
//! a status write that widens it, so the next sync (from any client) looks in every shard that
//! may hold a part.
//!
//! The home shard is a hash of the owner's `namespace/name`, not of its UID: it is known before
//! the object exists, so `create` reads it (and checks that the new object fits) before it
//! creates anything. It is a window of copy 0: a pool with reuse hands out a copy beyond the
//! first only when the first cannot take the owner (`pool_record`).
//!
//! `status.shards` names shards by [`ShardKey::to_status`] (`copy * 256 + window`), so a pool
//! without reuse names its windows as it always did.

use std::collections::BTreeSet;

use crate::api::PortAllocationStatus;
use crate::core::PortDemand;

use super::windows::{ShardKey, WindowLayout, window_of};
use crate::ledger::decision::Operation;

/// The shards where the owner `namespace/name` may have entries, by the rule above.
pub fn known_shards(
    status: Option<&PortAllocationStatus>,
    layout: &WindowLayout,
    owner: &str,
) -> BTreeSet<ShardKey> {
    let listed = listed_shards(status);
    if !listed.is_empty() {
        return listed;
    }
    home_shard(layout, owner)
        .map(ShardKey::first)
        .into_iter()
        .collect()
}

/// The shards a status names in `status.shards` (values outside 0-65535 are ignored).
pub fn listed_shards(status: Option<&PortAllocationStatus>) -> BTreeSet<ShardKey> {
    status
        .iter()
        .flat_map(|status| &status.shards)
        .filter_map(|&k| ShardKey::from_status(k))
        .collect()
}

/// `status.shards` naming `shards` (see [`ShardKey::to_status`]).
pub fn status_shards(shards: &BTreeSet<ShardKey>) -> Vec<i32> {
    shards.iter().map(|k| k.to_status()).collect()
}

/// The copy of the pool a PortAllocation's ports are in, by its status (the lowest it names;
/// 0 when it names none): a copy beyond the first is a port other pods hold on other nodes.
pub fn status_copy(status: Option<&PortAllocationStatus>) -> u16 {
    status.map_or(0, PortAllocationStatus::pool_copy)
}

/// The first shard of the owner's home order (dynamic-band shards first).
pub fn home_shard(layout: &WindowLayout, owner: &str) -> Option<u16> {
    layout.home_order(owner).first().copied()
}

/// The one shard that can decide `operation` alone, if any: the owner's only known shard, and
/// every port it requests lies in that shard's window. `None` asks for the whole pool.
pub fn single_shard(known: &BTreeSet<ShardKey>, operation: &Operation) -> Option<ShardKey> {
    let [key] = known.iter().copied().collect::<Vec<_>>()[..] else {
        return None;
    };
    let only = key.window;
    let requested_inside = |demands: &[PortDemand]| {
        demands.iter().all(|d| {
            d.requested.is_none_or(|first| {
                let last = u32::from(first) + d.count.max(1) - 1;
                window_of(first) == only
                    && u16::try_from(last).is_ok_and(|last| window_of(last) == only)
            })
        })
    };
    match operation {
        Operation::Sync(demands) if requested_inside(demands) => Some(key),
        Operation::Sync(_) | Operation::Slots(_) | Operation::Remove => None,
        Operation::Release { .. } => Some(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortAssignment, PortScope};
    use crate::core::{PortSet, StaticBand};

    fn layout() -> WindowLayout {
        let ports: PortSet = "30000-32767".parse().unwrap();
        WindowLayout::new(&ports, StaticBand::None)
    }

    fn status_with_ports(values: Vec<i32>, pool_uid: &str) -> PortAllocationStatus {
        PortAllocationStatus {
            pool_uid: Some(pool_uid.into()),
            assignments: vec![PortAssignment {
                role: "web".into(),
                port: "http".into(),
                scope: PortScope::PodScoped,
                env: "HTTP_PORT".into(),
                values,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn listed_shards_win_else_the_home_of_the_name() {
        let layout = layout();
        let home = home_shard(&layout, "ns/a").unwrap();
        let home = ShardKey::first(home);
        assert_eq!(known_shards(None, &layout, "ns/a"), [home].into());
        // Recorded ports alone say nothing: a status without `shards` was never committed.
        let recorded = status_with_ports(vec![30000, 31000], "p");
        assert_eq!(
            known_shards(Some(&recorded), &layout, "ns/a"),
            [home].into()
        );
        let mut listed = recorded.clone();
        listed.shards = vec![120, 2 * 256 + 118, 65536, -1];
        assert_eq!(
            known_shards(Some(&listed), &layout, "ns/a"),
            [ShardKey::first(120), ShardKey::new(2, 118)].into(),
            "values outside 0-65535 are ignored"
        );
        assert_eq!(status_copy(Some(&listed)), 0);
        listed.shards = vec![2 * 256 + 118];
        assert_eq!(status_copy(Some(&listed)), 2);
        assert_eq!(status_copy(None), 0);
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
        let one: BTreeSet<ShardKey> = [ShardKey::first(117)].into();
        let sync = |d| Operation::Sync(vec![d]);
        let home = Some(ShardKey::first(117));
        assert_eq!(single_shard(&one, &sync(demand(None, 8))), home);
        assert_eq!(single_shard(&one, &sync(demand(Some(30000), 1))), home);
        let copied: BTreeSet<ShardKey> = [ShardKey::new(1, 117)].into();
        assert_eq!(
            single_shard(&copied, &sync(demand(Some(30000), 1))),
            Some(ShardKey::new(1, 117))
        );
        assert_eq!(single_shard(&one, &sync(demand(Some(31000), 1))), None);
        // 30200-30215 crosses from window 117 into 118.
        assert_eq!(single_shard(&one, &sync(demand(Some(30200), 16))), None);
        assert_eq!(single_shard(&one, &Operation::Release { role: None }), home);
        assert_eq!(single_shard(&one, &Operation::Remove), None);
        let two: BTreeSet<ShardKey> = [ShardKey::first(117), ShardKey::first(118)].into();
        assert_eq!(single_shard(&two, &sync(demand(None, 1))), None);
    }
}

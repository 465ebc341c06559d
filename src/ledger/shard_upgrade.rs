//! Step 2 of upgrading a pool in place (docs/record-at-scale.md, section 4): from the frozen
//! one-object record, the shard records that hold exactly its entries. A pure function of the
//! pool's spec and holders, so two upgraders racing write the same shards, in any order.
//!
//! - An entry whose ports all lie in one window is copied to that shard byte for byte.
//! - An entry whose ports lie in several windows (a spanning owner, or a block across a window
//!   edge) is split by window under the same UID and owner; each part is written in the
//!   canonical text (its original text cannot be cut).
//! - An entry that does not decode, or holds no port, cannot be placed by its ports: it is
//!   copied verbatim to the pool's first shard (the lowest window with a pool port; window 0
//!   for a pool whose exclusions leave no port). One fixed place, so repair and describe know
//!   where to find it, and it stays a holding nobody else can take over.
//! - Entries on ports outside the pool keep their window too: such a window gets a shard even
//!   though it has no pool port, and the anomaly is reported there, as it was in the pool.
//!
//! Within a shard, entries are ordered by UID (stable), as a record write orders them.

use std::collections::BTreeMap;

use crate::api::{PoolHolder, PortPool, PortPoolShardStatus, PortRangeText, SpecError};
use crate::core::Holdings;

use super::shard_layout::{ShardLayout, shard_name, window};
use super::sharded_record::{load_shard, new_shard, split_by_shard};

/// One shard the upgrade writes: create it, or overwrite its status, with exactly this.
#[derive(Clone, Debug, PartialEq)]
pub struct UpgradedShard {
    pub index: u16,
    pub name: String,
    pub ranges: Vec<PortRangeText>,
    pub status: PortPoolShardStatus,
}

/// The shards, ascending by window, that hold exactly the entries of `pool.status.holders`:
/// every shard of the pool's layout (empty ones too, so the flip can list them all), plus any
/// window that only entries outside the pool use.
pub fn upgrade_plan(pool: &PortPool) -> Result<Vec<UpgradedShard>, SpecError> {
    let ports = pool.spec.port_set()?;
    let layout = ShardLayout::new(&ports, pool.spec.core_static_band());
    let mut entries: BTreeMap<u16, Vec<PoolHolder>> = layout
        .shards()
        .iter()
        .map(|s| (s.index, Vec::new()))
        .collect();
    let first_shard = layout.shards().first().map_or(0, |s| s.index);
    let holders = pool.status.iter().flat_map(|s| s.holders.iter());
    for entry in holders {
        let parts = match Holdings::decode(&entry.ports) {
            Ok(holdings) => split_by_shard(&holdings),
            Err(_) => BTreeMap::new(),
        };
        match parts.len() {
            0 => entries.entry(first_shard).or_default().push(entry.clone()),
            1 => {
                let index = *parts.keys().next().expect("one part");
                entries.entry(index).or_default().push(entry.clone());
            }
            _ => {
                for (index, part) in parts {
                    entries.entry(index).or_default().push(PoolHolder {
                        uid: entry.uid.clone(),
                        owner: entry.owner.clone(),
                        ports: part.encode(),
                    });
                }
            }
        }
    }
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let plan = entries
        .into_iter()
        .map(|(index, mut holders)| {
            holders.sort_by(|a, b| a.uid.cmp(&b.uid));
            // The counts are what loading the shard would compute: the shard's own record.
            let mut shard = new_shard(pool, index);
            shard.status = Some(PortPoolShardStatus {
                holders,
                ..Default::default()
            });
            let status = load_shard(pool, &layout, index, shard).current_status();
            UpgradedShard {
                index,
                name: shard_name(name, index),
                ranges: vec![window(index).to_string().as_str().into()],
                status: status.into(),
            }
        })
        .collect();
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortPoolSpec, PortPoolStatus, StaticBandSetting};
    use crate::core::SlotKey;
    use crate::ledger::{ShardedRecord, shard_index_of};
    use proptest::prelude::*;

    fn pool(ranges: &[&str], exclude: &[&str], holders: Vec<PoolHolder>) -> PortPool {
        let mut pool = PortPool::new(
            "p",
            PortPoolSpec {
                ranges: ranges.iter().map(|r| (*r).into()).collect(),
                exclude: exclude.iter().map(|r| (*r).into()).collect(),
                protocol: Default::default(),
                static_band: StaticBandSetting::Auto,
            },
        );
        pool.metadata.uid = Some("pool-uid".into());
        pool.status = Some(PortPoolStatus {
            holders,
            ..Default::default()
        });
        pool
    }

    fn holder(uid: &str, ports: &str) -> PoolHolder {
        PoolHolder {
            uid: uid.into(),
            owner: format!("ns/{uid}"),
            ports: ports.into(),
        }
    }

    #[test]
    fn entries_go_to_their_windows_and_spanning_ones_are_split() {
        let plan = upgrade_plan(&pool(
            &["30000-30767"],
            &[],
            vec![
                holder("s", "web.b=30210 web.a=30209"), // one window, odd order: verbatim
                holder("a", "web.http=30001 big.blk=30200-30215"),
                holder("bad", "not holdings"),
                holder("out", "x.y=31000"), // window 121, outside the pool
            ],
        ))
        .unwrap();
        let got: Vec<(u16, Vec<(&str, &str)>)> = plan
            .iter()
            .map(|s| {
                let holders = s.status.holders.iter();
                (
                    s.index,
                    holders
                        .map(|h| (h.uid.as_str(), h.ports.as_str()))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    117,
                    vec![
                        ("a", "big.blk=30200-30207 web.http=30001"),
                        ("bad", "not holdings")
                    ]
                ),
                (
                    118,
                    vec![
                        ("a", "big.blk=30208-30215"),
                        ("s", "web.b=30210 web.a=30209")
                    ]
                ),
                (119, vec![]),
                (120, vec![]),
                (121, vec![("out", "x.y=31000")]),
            ]
        );
        assert_eq!(plan[0].name, "p-117");
        assert_eq!(plan[0].ranges, vec![PortRangeText::from("29952-30207")]);
        assert_eq!(
            (
                plan[0].status.size,
                plan[0].status.allocated,
                plan[0].status.holder_count
            ),
            (208, 9, 2)
        );
        assert_eq!((plan[4].status.size, plan[4].status.allocated), (0, 0));
    }

    #[test]
    fn a_pool_without_ports_keeps_undecodable_entries_in_window_0() {
        let plan = upgrade_plan(&pool(
            &["40000-40001"],
            &["40000-40001"],
            vec![holder("u", "??")],
        ))
        .unwrap();
        assert_eq!(plan.len(), 1);
        assert_eq!((plan[0].index, plan[0].status.holders.len()), (0, 1));
    }

    /// Every (uid, owner, slot, port) an entry holds, and every entry kept as text.
    type Held = (String, String, SlotKey, u16);

    fn facts(entries: &[PoolHolder]) -> (Vec<Held>, Vec<PoolHolder>) {
        let mut held = Vec::new();
        let mut verbatim = Vec::new();
        for entry in entries {
            match Holdings::decode(&entry.ports) {
                Ok(h) if !h.is_empty() => {
                    for (slot, block) in h.iter() {
                        for port in block.ports() {
                            held.push((entry.uid.clone(), entry.owner.clone(), slot.clone(), port));
                        }
                    }
                }
                _ => verbatim.push(entry.clone()),
            }
        }
        held.sort();
        verbatim.sort_by(|a, b| (&a.uid, &a.ports).cmp(&(&b.uid, &b.ports)));
        (held, verbatim)
    }

    fn arb_entry() -> impl Strategy<Value = PoolHolder> {
        let block = (29_000u16..33_000, 1u32..=300)
            .prop_filter_map("fits", |(first, n)| crate::core::PortBlock::new(first, n));
        let decodable = prop::collection::btree_map(("[a-c]", "[p-r]", 0u32..3), block, 0..5)
            .prop_map(|slots| {
                slots
                    .into_iter()
                    .map(|((r, p, i), b)| (SlotKey::new(r, p, i), b))
                    .collect::<Holdings>()
                    .encode()
            });
        let text = prop_oneof![4 => decodable, 1 => "[ -~]{0,12}"];
        ("[0-9a-f]{4}", text).prop_map(|(uid, ports)| PoolHolder {
            owner: format!("ns/{uid}"),
            uid,
            ports,
        })
    }

    proptest! {
        #[test]
        fn shards_hold_exactly_the_old_record_and_upgraders_agree(
            holders in prop::collection::vec(arb_entry(), 0..12),
            exclude_one in 30_000u16..30_100,
        ) {
            let exclude = exclude_one.to_string();
            let old = pool(&["29500-30700", "31000-32767"], &[exclude.as_str()], holders.clone());
            let plan = upgrade_plan(&old).unwrap();
            prop_assert_eq!(&plan, &upgrade_plan(&old).unwrap(), "deterministic");

            let shard_entries: Vec<PoolHolder> =
                plan.iter().flat_map(|s| s.status.holders.clone()).collect();
            prop_assert_eq!(facts(&shard_entries), facts(&holders));

            // Read back as a sharded record, every owner holds what it held in the pool.
            let shards = plan.iter().map(|s| {
                let mut shard = new_shard(&old, s.index);
                shard.status = Some(s.status.clone());
                shard
            });
            let record = ShardedRecord::load(old.clone(), shards.collect()).unwrap();
            for entry in &holders {
                let once = holders.iter().filter(|o| o.uid == entry.uid).count() == 1;
                if let (true, Ok(h)) = (once, Holdings::decode(&entry.ports)) {
                    prop_assert_eq!(record.holdings_of(&entry.uid), h);
                }
            }
            for shard in &plan {
                prop_assert!(shard.ranges == vec![PortRangeText::from(window(shard.index).to_string().as_str())]);
                for entry in &shard.status.holders {
                    if let Ok(h) = Holdings::decode(&entry.ports)
                        && !h.is_empty()
                    {
                        prop_assert!(h.ports().all(|p| shard_index_of(p) == shard.index));
                    }
                    // Copied byte for byte, unless its owner's entry had to be cut by window.
                    let copied = holders.iter().any(|o| o == entry);
                    let cut = holders.iter().any(|o| {
                        o.uid == entry.uid
                            && Holdings::decode(&o.ports).is_ok_and(|h| split_by_shard(&h).len() > 1)
                    });
                    prop_assert!(copied || cut, "{:?}", entry);
                }
            }
        }
    }
}

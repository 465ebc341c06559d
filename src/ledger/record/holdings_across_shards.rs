//! An owner's holdings across a copy's windows: cut into one piece per window for the writes
//! ([`split_by_shard`]), joined again for decisions (`union_of`), and what the shards of one
//! copy disagree on (ports in the wrong shard or in two, slots whose pieces do not join). Pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::{Holdings, PortBlock, PortSet, SlotKey};

use super::window_record::{Anomaly, WindowRecord};
use super::windows::{window, window_of};

/// Something in the shards that should not be there; as with [`Anomaly`], such ports are
/// never handed out again by us and `repair` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardAnomaly {
    /// What one shard's record reports on its own: an undecodable entry, a port listed twice in
    /// the shard, or a port that is not in the pool at all.
    InShard { shard: u16, anomaly: Anomaly },
    /// A pool port listed in a shard whose window does not contain it.
    WrongShard {
        shard: u16,
        uid: String,
        owner: String,
        slot: SlotKey,
        port: u16,
    },
    /// A port listed in two shards (one of them is then also the wrong shard).
    HeldInTwoShards {
        port: u16,
        first: (u16, String),
        second: (u16, String),
    },
    /// An owner's slot listed in several shards whose pieces do not join into one block; the
    /// piece in the lowest shard is what [`CopyRecord::holdings_of`] returns.
    SlotApart {
        uid: String,
        slot: SlotKey,
        shards: Vec<u16>,
    },
    /// A shard object not loaded: it names another pool or pool UID, its window is not 0-255,
    /// its ranges are not its window, or a shard for its window was already loaded.
    NotLoaded { name: String, reason: String },
}

/// `holdings` cut by window: each slot's block goes to the shard of its ports, a block that
/// crosses a window edge in pieces, one per window. Ascending by shard.
pub fn split_by_shard(holdings: &Holdings) -> BTreeMap<u16, Holdings> {
    let mut parts: BTreeMap<u16, Holdings> = BTreeMap::new();
    for (slot, block) in holdings.iter() {
        let mut first = block.first;
        loop {
            let index = window_of(first);
            let last = window(index).last.min(block.last());
            let piece = PortBlock::spanning(first, last).expect("first <= last, both ports");
            parts
                .entry(index)
                .or_default()
                .insert_block(slot.clone(), piece);
            if last == block.last() {
                break;
            }
            first = last + 1;
        }
    }
    parts
}

/// The union of one owner's parts, in ascending shard order, and the slots whose pieces do not
/// join (with the shards listing them).
pub(super) fn union_of(
    parts: impl Iterator<Item = (u16, Holdings)>,
) -> (Holdings, BTreeMap<SlotKey, Vec<u16>>) {
    let mut union = Holdings::new();
    let mut seen: BTreeMap<SlotKey, Vec<u16>> = BTreeMap::new();
    let mut apart: BTreeSet<SlotKey> = BTreeSet::new();
    for (index, part) in parts {
        for (slot, piece) in part.iter() {
            seen.entry(slot.clone()).or_default().push(index);
            match union.block(slot) {
                None => {
                    union.insert_block(slot.clone(), piece);
                }
                Some(held) if u32::from(held.last()) + 1 == u32::from(piece.first) => {
                    let joined = PortBlock::spanning(held.first, piece.last()).expect("adjacent");
                    union.insert_block(slot.clone(), joined);
                }
                Some(_) => {
                    apart.insert(slot.clone());
                }
            }
        }
    }
    seen.retain(|slot, _| apart.contains(slot));
    (union, seen)
}

/// An owner's name and its part in each shard.
pub(super) type Parts<'a> = (&'a str, Vec<(u16, Holdings)>);

/// Each owner's entries in the given shards, in one pass over them (ascending by shard): the
/// owner's name as the first shard lists it, and its part in each shard.
pub(super) fn parts_by_uid<'a>(
    shards: impl Iterator<Item = (u16, &'a WindowRecord)>,
) -> BTreeMap<&'a str, Parts<'a>> {
    let mut parts: BTreeMap<&str, Parts> = BTreeMap::new();
    for (index, record) in shards {
        for (uid, entry) in &record.holders {
            parts
                .entry(uid.as_str())
                .or_insert_with(|| (entry.owner.as_str(), Vec::new()))
                .1
                .push((index, entry.holdings.clone()));
        }
    }
    parts
}

/// Ports in the wrong shard, ports listed in two shards, and slots whose pieces do not join.
pub(super) fn cross_shard_anomalies<'a>(
    ports: &PortSet,
    shards: impl Iterator<Item = (u16, &'a WindowRecord)> + Clone,
) -> Vec<ShardAnomaly> {
    let mut anomalies = Vec::new();
    let mut first_listed: BTreeMap<u16, (u16, String)> = BTreeMap::new();
    for (index, record) in shards.clone() {
        for anomaly in &record.anomalies {
            match anomaly {
                Anomaly::OutsidePool {
                    uid,
                    owner,
                    slot,
                    port,
                } if ports.contains(*port) => anomalies.push(ShardAnomaly::WrongShard {
                    shard: index,
                    uid: uid.clone(),
                    owner: owner.clone(),
                    slot: slot.clone(),
                    port: *port,
                }),
                other => anomalies.push(ShardAnomaly::InShard {
                    shard: index,
                    anomaly: other.clone(),
                }),
            }
        }
        for entry in record.holders.values() {
            for port in entry.holdings.ports() {
                match first_listed.get(&port) {
                    // Twice in one shard is that shard's own Duplicate anomaly.
                    Some((first, _)) if *first == index => {}
                    Some(first) => anomalies.push(ShardAnomaly::HeldInTwoShards {
                        port,
                        first: first.clone(),
                        second: (index, entry.owner.clone()),
                    }),
                    None => {
                        first_listed.insert(port, (index, entry.owner.clone()));
                    }
                }
            }
        }
    }
    for (uid, (_, parts)) in parts_by_uid(shards) {
        for (slot, shards) in union_of(parts.into_iter()).1 {
            anomalies.push(ShardAnomaly::SlotApart {
                uid: uid.to_string(),
                slot,
                shards,
            });
        }
    }
    anomalies
}

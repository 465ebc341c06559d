//! A pool as read, in all of its copies: with `nodeReuse: N` each port may be held by up to N
//! pods at once, never two on one node (kube-scheduler keeps them apart through the hostPorts
//! the pod webhook declares). The record keeps N copies of the pool's windows, each a
//! [`CopyRecord`] of its own shards, with the same ports, layout and spec snapshot:
//!
//! - a port is held at most once in each copy, so at most N times in all;
//! - a PortAllocation holds all its ports in one copy, so its pods never exclude each other from
//!   a node through a reused port (only through ports they share, RoleScoped ones);
//! - copies fill in order: a PortAllocation goes to copy 1 only when copy 0 cannot take it whole,
//!   so a pool that fits today behaves exactly as without reuse.
//!
//! Every write is still one compare-and-swap per shard: a shard is one window of one copy.
//! Copies past `nodeReuse` (the setting was lowered while they held ports) keep their holders,
//! who may shrink or leave but never grow; no new holder goes there.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::{PortPoolShard, SpecError};
use crate::core::{Holdings, PortSet, SlotKey};

use super::copy_record::{CopyRecord, newest_snapshot};
use super::holdings_across_shards::ShardAnomaly;
use super::node_bound::{CopyBound, CopyRefusal, InUse};
use super::pool_snapshot::PoolSnapshot;
use super::shard_record::{ShardWrite, new_shard};
use super::windows::{ShardKey, WindowLayout};

/// The pool and all of its shards, by copy.
#[derive(Clone, Debug)]
pub struct PoolRecord {
    /// The newest snapshot of the pool: the one read, or a newer one a shard carries.
    pub pool: PoolSnapshot,
    pub ports: PortSet,
    pub layout: WindowLayout,
    /// By copy, ascending; copy 0 is always there (empty when no shard exists yet).
    pub copies: BTreeMap<u16, CopyRecord>,
    /// Shard objects that are no copy's: a copy number outside 0-255.
    pub anomalies: Vec<ShardAnomaly>,
}

impl PoolRecord {
    /// The record of `pool` from one LIST of its shards.
    pub fn load(pool: PoolSnapshot, shards: Vec<PortPoolShard>) -> Result<PoolRecord, SpecError> {
        let pool = newest_snapshot(pool, &shards);
        let ports = pool.ports()?;
        let layout = WindowLayout::new(&ports, pool.spec.core_static_band());
        let mut by_copy: BTreeMap<u16, Vec<PortPoolShard>> = BTreeMap::from([(0, Vec::new())]);
        let mut anomalies = Vec::new();
        for shard in shards {
            match u16::try_from(shard.spec.copy).ok().filter(|&c| c <= 255) {
                Some(copy) => by_copy.entry(copy).or_default().push(shard),
                None => anomalies.push(ShardAnomaly::NotLoaded {
                    name: shard.metadata.name.clone().unwrap_or_default(),
                    reason: format!("copy {} is not one of 0-255", shard.spec.copy),
                }),
            }
        }
        let copies = by_copy
            .into_iter()
            .map(|(copy, shards)| {
                let record = CopyRecord::load_copy(&pool, &ports, &layout, copy, shards);
                (copy, record)
            })
            .collect();
        Ok(PoolRecord {
            pool,
            ports,
            layout,
            copies,
            anomalies,
        })
    }

    pub fn name(&self) -> &str {
        &self.pool.name
    }

    /// How many copies new holders may use: the pool's `nodeReuse`.
    pub fn reuse(&self) -> u16 {
        self.pool.spec.reuse()
    }

    /// How the pool bounds its copies: a fixed `nodeReuse`, or the nodes it follows.
    pub fn copy_bound(&self) -> CopyBound {
        self.pool.copy_bound()
    }

    /// Whether a port may have more than one holder here (another copy may take an owner one
    /// copy refuses).
    pub fn may_reuse(&self) -> bool {
        self.pool.spec.may_reuse()
    }

    /// The highest copy in use and the largest pod of any holder: what the copies allowed
    /// depend on (see [`super::node_bound`]).
    pub fn in_use(&self) -> InUse {
        InUse {
            highest_copy: self.copies_in_use().last().copied(),
            largest_pod: self.largest_pod(),
        }
    }

    /// The most ports one pod of any holder in any copy has.
    pub fn largest_pod(&self) -> u32 {
        self.copies
            .values()
            .map(CopyRecord::largest_pod)
            .max()
            .unwrap_or(0)
    }

    /// Whether an owner whose largest pod has `ports_per_pod` ports may take new ports in
    /// `copy`: below a fixed `nodeReuse`, or where following the nodes keeps its pods (and
    /// every holder's) schedulable. The one question the allocator asks before a placement.
    pub fn copy_allowed(&self, copy: u16, ports_per_pod: u32) -> Result<(), CopyRefusal> {
        let bound = self.copy_bound();
        if matches!(bound, CopyBound::Fixed(_)) {
            // Nothing else to count: the copy number decides.
            return bound.copy_allowed(copy, ports_per_pod, InUse::default());
        }
        bound.copy_allowed(copy, ports_per_pod, self.in_use())
    }

    /// The copies a new owner is tried in, in order (see [`CopyBound::candidates`]).
    pub fn copy_candidates(&self, ports_per_pod: u32) -> std::ops::Range<u16> {
        let bound = self.copy_bound();
        if matches!(bound, CopyBound::Fixed(_)) {
            return bound.candidates(ports_per_pod, InUse::default());
        }
        bound.candidates(ports_per_pod, self.in_use())
    }

    /// Copy 0: the whole record of a pool without reuse.
    pub fn first(&self) -> &CopyRecord {
        self.copies.get(&0).expect("copy 0 is always loaded")
    }

    pub fn copy(&self, copy: u16) -> Option<&CopyRecord> {
        self.copies.get(&copy)
    }

    /// Copy `copy`, an empty one (no shards yet) when none was loaded.
    pub fn copy_mut(&mut self, copy: u16) -> &mut CopyRecord {
        let (pool, ports, layout) = (&self.pool, &self.ports, &self.layout);
        self.copies
            .entry(copy)
            .or_insert_with(|| CopyRecord::load_copy(pool, ports, layout, copy, Vec::new()))
    }

    /// This record as `writes` leave it once committed, each shard still at the version read:
    /// to decide what comes after them before they are written.
    pub fn after_writes(&self, writes: &[ShardWrite]) -> PoolRecord {
        let mut after = self.clone();
        for write in writes {
            let mut shard = self
                .copy(write.key.copy)
                .and_then(|c| c.shards.get(&write.key.window))
                .map(|s| s.record.shard.clone())
                .unwrap_or_else(|| new_shard(&self.pool, write.key));
            shard.status = Some(write.status.clone());
            shard.metadata.resource_version = write.resource_version.clone();
            after.replace(shard);
        }
        after
    }

    /// Name `uid` (`owner`) in shard `key`'s `status.elsewhere` (see
    /// [`crate::api::PortPoolShardStatus::elsewhere`]).
    pub fn mark_elsewhere(&mut self, key: ShardKey, uid: &str, owner: &str) {
        self.copy_mut(key.copy)
            .mark_elsewhere(key.window, uid, owner);
    }

    /// Whether shard `key` names `uid` in its `status.elsewhere`.
    pub fn places_elsewhere(&self, key: ShardKey, uid: &str) -> bool {
        self.copy(key.copy)
            .and_then(|c| c.shards.get(&key.window))
            .is_some_and(|s| s.places_elsewhere(uid))
    }

    /// Copy `copy` as it is, or empty: to decide in without changing this record.
    pub fn copy_or_empty(&self, copy: u16) -> CopyRecord {
        self.copies.get(&copy).cloned().unwrap_or_else(|| {
            CopyRecord::load_copy(&self.pool, &self.ports, &self.layout, copy, Vec::new())
        })
    }

    /// The shards (copy and window) where `uid` has an entry.
    pub fn shards_of(&self, uid: &str) -> BTreeSet<ShardKey> {
        self.copies
            .values()
            .flat_map(|copy| {
                copy.shards_of(uid)
                    .into_iter()
                    .map(|window| ShardKey::new(copy.copy, window))
            })
            .collect()
    }

    /// The copies where `uid` has an entry: one, or none; several only after a race between
    /// two clients syncing one object, which its next sync resolves.
    pub fn copies_of(&self, uid: &str) -> BTreeSet<u16> {
        self.shards_of(uid).into_iter().map(|k| k.copy).collect()
    }

    /// Everything `uid` holds, in every copy where it has entries: one copy normally, several
    /// when its pods are spread over copies. A slot held in two copies (a race between two
    /// clients on one new object, resolved by its next sync) counts in the lower one.
    pub fn holdings_of(&self, uid: &str) -> Holdings {
        let mut merged = Holdings::new();
        for (_, part) in self.parts_of(uid) {
            for (slot, block) in part.iter() {
                if !merged.contains(slot) {
                    merged.insert_block(slot.clone(), block);
                }
            }
        }
        merged
    }

    /// What `uid` holds in each copy where it has entries, ascending by copy.
    pub fn parts_of(&self, uid: &str) -> Vec<(u16, Holdings)> {
        self.copies_of(uid)
            .into_iter()
            .map(|copy| (copy, self.copies[&copy].holdings_of(uid)))
            .collect()
    }

    /// The copy holding each of `uid`'s slots (the lowest, when a race left it in two).
    pub fn slot_copies(&self, uid: &str) -> BTreeMap<SlotKey, u16> {
        let mut copies = BTreeMap::new();
        for (copy, part) in self.parts_of(uid) {
            for (slot, _) in part.iter() {
                copies.entry(slot.clone()).or_insert(copy);
            }
        }
        copies
    }

    /// For a workload whose pods are spread over copies, the copy of each of its slots (what
    /// its status records); empty when it is in one copy at most.
    pub fn spread_copies(&self, uid: &str) -> BTreeMap<SlotKey, u16> {
        if self.copies_of(uid).len() > 1 {
            self.slot_copies(uid)
        } else {
            BTreeMap::new()
        }
    }

    /// The copies that hold at least one port.
    pub fn copies_in_use(&self) -> BTreeSet<u16> {
        self.copies
            .values()
            .filter(|copy| copy.held() > 0)
            .map(|copy| copy.copy)
            .collect()
    }

    /// One write per shard a decision changed (with `propagate`, also every shard behind the
    /// pool's spec), copy after copy, ascending by window in each.
    pub fn writes(&self, propagate: bool) -> Vec<ShardWrite> {
        self.copies
            .values()
            .flat_map(|copy| copy.writes(propagate))
            .collect()
    }

    /// [`PoolRecord::writes`], after which the shards written count as unchanged: the next
    /// cut holds only the shards changed after this one (each write still carries every change
    /// since the read).
    pub fn cut_writes(&mut self, propagate: bool) -> Vec<ShardWrite> {
        self.copies
            .values_mut()
            .flat_map(|copy| copy.cut_writes(propagate))
            .collect()
    }

    /// Shard `written` as the server returned it after a write.
    pub fn replace(&mut self, written: PortPoolShard) {
        if let Ok(copy) = u16::try_from(written.spec.copy) {
            self.copy_mut(copy).replace(written);
        }
    }

    /// How many shard objects were loaded, in all copies.
    pub fn shard_count(&self) -> usize {
        self.copies.values().map(|copy| copy.shards.len()).sum()
    }

    /// What every copy reports, plus the shards that are no copy's.
    pub fn all_anomalies(&self) -> impl Iterator<Item = (u16, &ShardAnomaly)> {
        let own = self.anomalies.iter().map(|a| (0, a));
        let copies = self
            .copies
            .values()
            .flat_map(|copy| copy.anomalies.iter().map(move |a| (copy.copy, a)));
        own.chain(copies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fixtures::{holders, pool_record, pool_reused, shard_in};

    #[test]
    fn shards_load_into_their_copies_and_copy_zero_is_always_there() {
        let pool = pool_reused(&["30000-30999"], 3);
        let record = pool_record(&pool, vec![]);
        assert_eq!(record.copies.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(record.reuse(), 3);

        let shards = vec![
            shard_in(
                &pool,
                ShardKey::new(0, 117),
                holders(&[("a", "web.http=30000")]),
            ),
            shard_in(
                &pool,
                ShardKey::new(2, 117),
                holders(&[("b", "web.http=30000")]),
            ),
        ];
        let record = pool_record(&pool, shards);
        assert_eq!(
            record.copies.keys().copied().collect::<Vec<_>>(),
            vec![0, 2]
        );
        assert_eq!(record.copies_of("b"), BTreeSet::from([2]));
        assert_eq!(
            record.shards_of("b"),
            BTreeSet::from([ShardKey::new(2, 117)])
        );
        assert_eq!(record.holdings_of("b").port_count(), 1);
        assert_eq!(record.copies_in_use(), BTreeSet::from([0, 2]));
        assert!(
            record.all_anomalies().next().is_none(),
            "one port held once per copy"
        );
    }

    #[test]
    fn a_shard_of_one_copy_under_another_copys_name_is_not_loaded() {
        let pool = pool_reused(&["30000-30999"], 2);
        let mut rogue = shard_in(
            &pool,
            ShardKey::new(1, 117),
            holders(&[("b", "web.http=30000")]),
        );
        rogue.spec.copy = 300;
        let record = pool_record(&pool, vec![rogue]);
        assert!(matches!(
            record.all_anomalies().next(),
            Some((_, ShardAnomaly::NotLoaded { reason, .. })) if reason.contains("copy 300")
        ));
        assert!(record.holdings_of("b").is_empty());
    }
}

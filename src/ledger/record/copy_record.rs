//! A pool as read: what is known of the PortPool plus its `PortPoolShard` records, viewed as one
//! record for planning, and a decided `Holdings` cut back into the per-shard writes that commit
//! it. Pure: built from one copy of the pool (read, or carried by a shard) and one LIST of its
//! shards.
//!
//! Each shard is loaded as a [`WindowRecord`] over the shard's ports (its window intersected with
//! the pool's ports), so everything that works on one record (decoding, anomalies, the bytes
//! of other holders' entries) works on a shard unchanged.
//!
//! An owner may hold ports in several shards (a spanning owner, or a block cut at a window
//! edge): its entries there share its UID, and a slot whose block crosses a window edge appears
//! in each shard with the piece of the block that lies there. [`CopyRecord::holdings_of`]
//! joins the pieces again; [`split_by_shard`] cuts them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use crate::api::{PoolHolder, PortPoolShard, SpecError};
use crate::core::{Holdings, Lean, PoolState, PortSet, StaticBand};

use super::holdings_across_shards::{
    ShardAnomaly, cross_shard_anomalies, parts_by_uid, split_by_shard, union_of,
};
use super::pool_snapshot::PoolSnapshot;
use super::shard_record::{ShardRecord, ShardWrite, load_shard, new_shard};
use super::window_record::WindowRecord;
use super::windows::{ShardKey, WindowLayout, shard_name, window, window_of};
use super::windows_by_uid::WindowsByUid;

/// One copy of the pool's ports and the shards that record it, ready for planning. A pool
/// without reuse is this one record (copy 0); [`crate::ledger::PoolRecord`] holds every copy.
#[derive(Clone, Debug)]
pub struct CopyRecord {
    /// The newest snapshot of the pool: the one read, or a newer one a shard carries.
    pub pool: PoolSnapshot,
    pub ports: PortSet,
    pub layout: WindowLayout,
    /// Which copy this is (0 without reuse).
    pub copy: u16,
    /// By window index, ascending.
    /// Shared between clones of the record: a decision works on a clone of the whole record
    /// and changes a few shards, and only those are copied (`Arc::make_mut`).
    pub shards: BTreeMap<u16, Arc<ShardRecord>>,
    pub anomalies: Vec<ShardAnomaly>,
    /// The most ports one pod of any holder here has (`Holdings::ports_per_pod`), worked out
    /// when first asked and raised by each [`CopyRecord::set`] after: never lowered before the
    /// next load, so an owner that shrank still counts as it was, which errs on the safe side.
    largest_pod: OnceLock<u32>,
    /// Where each owner's entries are, for [`CopyRecord::shards_of`].
    windows_by_uid: WindowsByUid,
}

impl CopyRecord {
    /// Copy 0 of the pool from its shards (those of other copies are left out): the record of a
    /// pool without reuse.
    pub fn load(pool: PoolSnapshot, shards: Vec<PortPoolShard>) -> Result<CopyRecord, SpecError> {
        let pool = newest_snapshot(pool, &shards);
        let ports = pool.ports()?;
        let layout = WindowLayout::new(&ports, pool.spec.core_static_band());
        let first: Vec<PortPoolShard> = shards.into_iter().filter(|s| s.spec.copy == 0).collect();
        Ok(CopyRecord::load_copy(&pool, &ports, &layout, 0, first))
    }

    /// Copy `copy` of the pool from its shards (all of them of that copy), under the newest
    /// snapshot of the pool and the layout of its ports.
    pub fn load_copy(
        pool: &PoolSnapshot,
        ports: &PortSet,
        layout: &WindowLayout,
        copy: u16,
        shards: Vec<PortPoolShard>,
    ) -> CopyRecord {
        let pool_name = pool.name.clone();
        let mut anomalies = Vec::new();
        let mut loaded: BTreeMap<u16, Arc<ShardRecord>> = BTreeMap::new();
        let mut sorted = shards;
        // Deterministic choice when two objects claim one window: the one named as we name
        // shards (`<pool>-<k>`), else the lower name. A rival object (created by hand under
        // another name) then never hides the real record of its window.
        let rank = |shard: &PortPoolShard| {
            let canonical = u16::try_from(shard.spec.index).is_ok_and(|k| {
                shard.metadata.name.as_deref()
                    == Some(&shard_name(&pool_name, ShardKey::new(copy, k)))
            });
            (shard.spec.index, !canonical, shard.metadata.name.clone())
        };
        sorted.sort_by_key(rank);
        for shard in sorted {
            let name = shard.metadata.name.clone().unwrap_or_default();
            // 0..=255 by the schema; checked again, the schema being only what the server has.
            let index = u16::try_from(shard.spec.index).unwrap_or(u16::MAX);
            let refusal = if shard.spec.pool != pool_name {
                Some(format!("it belongs to pool {:?}", shard.spec.pool))
            } else if pool.uid != shard.spec.pool_uid {
                Some(format!(
                    "it belongs to an earlier pool {pool_name:?} (UID {})",
                    shard.spec.pool_uid
                ))
            } else if index > 255 {
                Some(format!("window {} is not one of 0-255", shard.spec.index))
            } else if shard.spec.ranges.len() != 1
                || shard.spec.ranges[0].as_str() != window(index).to_string()
            {
                Some(format!("its ranges are not its window {}", window(index)))
            } else if i32::from(copy) != shard.spec.copy {
                Some(format!("it records copy {}, not {copy}", shard.spec.copy))
            } else if loaded.contains_key(&index) {
                Some(format!(
                    "{} already has a shard",
                    ShardKey::new(copy, index)
                ))
            } else {
                None
            };
            if let Some(reason) = refusal {
                anomalies.push(ShardAnomaly::NotLoaded { name, reason });
                continue;
            }
            let record = load_shard(pool, layout, index, shard);
            loaded.insert(
                index,
                Arc::new(ShardRecord::new(ShardKey::new(copy, index), record)),
            );
        }
        anomalies.extend(cross_shard_anomalies(
            ports,
            loaded.iter().map(|(&k, s)| (k, &s.record)),
        ));
        CopyRecord {
            pool: pool.clone(),
            ports: ports.clone(),
            layout: layout.clone(),
            copy,
            shards: loaded,
            anomalies,
            largest_pod: OnceLock::new(),
            windows_by_uid: WindowsByUid::default(),
        }
    }

    pub fn name(&self) -> &str {
        &self.pool.name
    }

    /// Everything `uid` holds in any shard, the pieces of a block cut at a window edge joined.
    pub fn holdings_of(&self, uid: &str) -> Holdings {
        union_of(
            self.shards
                .values()
                .map(|s| (s.index, s.record.holdings_of(uid))),
        )
        .0
    }

    /// The state to plan shard `index` with: its own, plus every port of its window that
    /// another shard lists (a `WrongShard` entry), so no anomaly is ever handed out twice.
    pub fn state_for(&self, index: u16) -> Option<PoolState> {
        let mut state = self.shards.get(&index)?.record.state.clone();
        let elsewhere = self
            .shards
            .values()
            .filter(|s| s.index != index)
            .flat_map(|s| s.record.holders.values())
            .flat_map(|entry| entry.holdings.ports());
        for port in elsewhere.filter(|&p| window_of(p) == index) {
            // Already held here (a HeldInTwoShards anomaly) or outside the pool: nothing to add.
            let _ = state.mark_held(port);
        }
        Some(state)
    }

    /// Shard `index` to change, loaded empty when it has no object yet (a write creates it).
    pub fn shard_mut(&mut self, index: u16) -> &mut ShardRecord {
        // The caller may change its entries.
        self.windows_by_uid.forget();
        self.shard_kept_in_index(index)
    }

    /// Name `uid` (`owner`) in shard `index`'s `status.elsewhere`; its entries stay as they are.
    pub fn mark_elsewhere(&mut self, index: u16, uid: &str, owner: &str) {
        self.shard_kept_in_index(index).mark_elsewhere(uid, owner);
    }

    /// [`CopyRecord::shard_mut`] for a change that keeps `windows_by_uid` itself.
    fn shard_kept_in_index(&mut self, index: u16) -> &mut ShardRecord {
        if !self.shards.contains_key(&index) {
            let record = load_shard(&self.pool, &self.layout, index, self.new_shard(index));
            let key = ShardKey::new(self.copy, index);
            self.shards
                .insert(index, Arc::new(ShardRecord::new(key, record)));
        }
        Arc::make_mut(self.shards.get_mut(&index).expect("inserted just above"))
    }

    /// Make `uid`'s holdings exactly `decided`: each slot's block goes to the shard of its
    /// ports (a block across a window edge in pieces), and the owner's entries in shards where
    /// `decided` has nothing are dropped. A window without a shard gets a new, empty one.
    pub fn set(&mut self, uid: &str, owner: &str, decided: &Holdings) {
        if let Some(largest) = self.largest_pod.get_mut() {
            *largest = (*largest).max(decided.ports_per_pod());
        }
        let mut parts = split_by_shard(decided);
        for index in self.shards_of(uid) {
            parts.entry(index).or_default();
        }
        let mut windows = Vec::new();
        for (index, part) in parts {
            if !part.is_empty() {
                windows.push(index);
            }
            self.shard_kept_in_index(index).set(uid, owner, &part);
        }
        self.windows_by_uid.set(uid, windows);
    }

    /// One write per shard a decision changed, in ascending order (the order the per-shard
    /// compare-and-swaps go in); with `propagate`, also every shard that carries an older spec
    /// of the pool, and each write carries the newest, so a pool edit reaches every shard.
    pub fn writes(&self, propagate: bool) -> Vec<ShardWrite> {
        self.shards
            .values()
            .filter(|s| s.is_changed() || (propagate && s.is_behind(&self.pool)))
            .map(|s| s.write(&self.pool, propagate))
            .collect()
    }

    /// [`CopyRecord::writes`], after which the shards written count as unchanged.
    pub fn cut_writes(&mut self, propagate: bool) -> Vec<ShardWrite> {
        let writes = self.writes(propagate);
        for shard in self.shards.values_mut() {
            if shard.changed {
                Arc::make_mut(shard).changed = false;
            }
        }
        writes
    }

    /// The writes that make `uid`'s holdings exactly `decided` (one per shard whose part
    /// changes, ascending), this record left as read.
    pub fn writes_for(&self, uid: &str, owner: &str, decided: &Holdings) -> Vec<ShardWrite> {
        let mut after = self.clone();
        after.set(uid, owner, decided);
        after.writes(false)
    }

    /// The whole pool as one record, for deciding an owner whose ports do not fit one shard:
    /// every owner's parts joined into one entry, undecodable entries kept verbatim (their ports
    /// stay unknown). Decide on it, then cut the owner's decided
    /// holdings back into shards with [`CopyRecord::writes_for`].
    pub fn union_record(&self) -> WindowRecord {
        self.union_of_windows(None)
    }

    /// [`CopyRecord::union_record`] restricted to the windows in `only` (their ports, and the
    /// entries of their shards): a spanning owner is placed in as few shards as it can be.
    pub fn union_record_of(&self, only: &BTreeSet<u16>) -> WindowRecord {
        self.union_of_windows(Some(only))
    }

    /// Two neighbouring windows as one record, for a block that fits only across their shared
    /// edge. It fills from the low end, as a window does: two clients writing the pair conflict
    /// on its shards whatever ports they chose, so a random end would only cut runs.
    pub fn pair_record(&self, pair: &BTreeSet<u16>) -> WindowRecord {
        let mut record = self.union_record_of(pair);
        record.state = record.state.leaning(Lean::Low);
        record
    }

    fn union_of_windows(&self, only: Option<&BTreeSet<u16>>) -> WindowRecord {
        let inside = |index: &u16| only.is_none_or(|only| only.contains(index));
        let shards = || self.shards.values().filter(|s| inside(&s.index));
        let mut holders: BTreeMap<String, PoolHolder> = BTreeMap::new();
        for shard in shards() {
            for (uid, raw) in &shard.record.opaque {
                holders.entry(uid.clone()).or_insert_with(|| raw.clone());
            }
        }
        for (uid, (owner, parts)) in parts_by_uid(shards().map(|s| (s.index, &s.record))) {
            if holders.contains_key(uid) {
                continue;
            }
            holders.insert(
                uid.to_string(),
                PoolHolder {
                    uid: uid.to_string(),
                    owner: owner.to_string(),
                    ports: union_of(parts.into_iter()).0.encode(),
                },
            );
        }
        let (ports, static_band) = match only {
            None => (self.ports.clone(), self.pool.spec.core_static_band()),
            Some(only) => {
                let spans: Vec<_> = self
                    .layout
                    .shards()
                    .iter()
                    .filter(|span| only.contains(&span.index))
                    .collect();
                let ports = PortSet::from_ranges(
                    spans
                        .iter()
                        .flat_map(|span| span.ports.ranges().iter().copied()),
                );
                // The pool's static ports are its lowest, so they are the lowest of any windows.
                let statics: u32 = spans.iter().map(|span| span.static_ports).sum();
                (ports, StaticBand::Count(statics))
            }
        };
        WindowRecord::joined(
            self.pool.clone(),
            ports,
            static_band,
            holders.into_values().collect(),
        )
    }

    /// The record of shard `index` alone (an empty one when the shard does not exist yet), to
    /// decide an owner that lives in that shard only.
    pub fn shard_record(&self, index: u16) -> WindowRecord {
        match self.shards.get(&index) {
            Some(shard) => shard.record.clone(),
            None => load_shard(&self.pool, &self.layout, index, self.new_shard(index)),
        }
    }

    /// Shard `written` as the server returned it after a write: the base of the next decision
    /// and compare-and-swap on it, with no read in between.
    pub fn replace(&mut self, written: PortPoolShard) {
        let Ok(index) = u16::try_from(written.spec.index) else {
            return;
        };
        if written.spec.copy != i32::from(self.copy) {
            return;
        }
        let record = load_shard(&self.pool, &self.layout, index, written);
        let key = ShardKey::new(self.copy, index);
        self.shards
            .insert(index, Arc::new(ShardRecord::new(key, record)));
        self.largest_pod = OnceLock::new();
        self.windows_by_uid.forget();
    }

    /// The most ports one pod of any holder in this copy has (0 when none holds any).
    pub fn largest_pod(&self) -> u32 {
        *self.largest_pod.get_or_init(|| {
            let mut largest = 0;
            for shard in self.shards.values() {
                for (uid, entry) in &shard.record.holders {
                    let pod = if self.shards_of(uid).len() > 1 {
                        // A holder across windows: its pods' ports joined.
                        self.holdings_of(uid).ports_per_pod()
                    } else {
                        entry.holdings.ports_per_pod()
                    };
                    largest = largest.max(pod);
                }
            }
            largest
        })
    }

    /// The shards where `uid` has an entry, ascending.
    pub fn shards_of(&self, uid: &str) -> Vec<u16> {
        self.windows_by_uid.windows_of(uid, || {
            self.shards.iter().flat_map(|(&index, shard)| {
                let record = &shard.record;
                let uids = record.holders.keys().chain(record.opaque.keys());
                uids.map(move |uid| (index, uid.as_str()))
            })
        })
    }

    /// A shard object for window `index` of this copy, with an empty record.
    pub fn new_shard(&self, index: u16) -> PortPoolShard {
        new_shard(&self.pool, ShardKey::new(self.copy, index))
    }

    /// How many ports of window `index` no entry holds (all of them when it has no shard).
    pub fn window_free(&self, index: u16) -> u32 {
        match self.shards.get(&index) {
            Some(shard) => shard.record.state.free_count(),
            None => self.layout.get(index).map_or(0, |span| span.ports.len()),
        }
    }

    /// How many of this copy's ports no entry holds.
    pub fn free_ports(&self) -> u32 {
        self.layout
            .shards()
            .iter()
            .map(|span| match self.shards.get(&span.index) {
                Some(shard) => shard.record.state.free_count(),
                None => span.ports.len(),
            })
            .sum()
    }

    /// How many ports are held in this copy.
    pub fn held(&self) -> u32 {
        self.shards
            .values()
            .map(|s| s.record.state.held_count())
            .sum()
    }
}

/// The newest snapshot of the pool: `pool` (read), or a newer one some shard carries.
pub fn newest_snapshot(pool: PoolSnapshot, shards: &[PortPoolShard]) -> PoolSnapshot {
    shards
        .iter()
        .filter_map(PoolSnapshot::of_shard)
        .fold(pool, |newest, copy| newest.newest(Some(copy)))
}

#[cfg(test)]
#[path = "copy_record_tests.rs"]
mod tests;

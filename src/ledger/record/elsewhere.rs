//! Owners a group commit places outside their home shard, named in that shard
//! (`status.elsewhere`) instead of in their own status (docs/record-at-scale.md, "Placement").
//!
//! The rule that makes a killed client safe is that the next sync of an owner looks wherever
//! its entries may be. An owner whose status names no shards is looked for in its home shard;
//! when that shard names it as placed elsewhere, in the whole pool. So a batch that moves
//! thousands of new owners out of their full homes writes each home once, naming them, before
//! any of their entries, where it wrote each one's status before. Once an owner's status names
//! its shards the name is not needed and goes. Pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::{PlacedElsewhere, PortPoolShard};

use super::pool_record::PoolRecord;
use super::pool_snapshot::PoolSnapshot;
use super::shard_record::{ShardRecord, ShardWrite, load_shard};
use super::windows::ShardKey;

impl ShardRecord {
    /// Name `uid` (`owner`) in `status.elsewhere`: its entries are being placed in other
    /// shards before its status can say so.
    pub fn mark_elsewhere(&mut self, uid: &str, owner: &str) {
        if self.places_elsewhere(uid) {
            return;
        }
        self.elsewhere_changes
            .insert(uid.to_string(), Some(owner.to_string()));
        self.changed = true;
    }

    /// No longer name `uid` in `status.elsewhere` (its status names its shards now).
    pub fn unmark_elsewhere(&mut self, uid: &str) {
        if !self.places_elsewhere(uid) {
            return;
        }
        self.elsewhere_changes.insert(uid.to_string(), None);
        self.changed = true;
    }

    /// Whether `status.elsewhere` names `uid`, as read and changed since.
    pub fn places_elsewhere(&self, uid: &str) -> bool {
        match self.elsewhere_changes.get(uid) {
            Some(change) => change.is_some(),
            None => self.record.places_elsewhere(uid),
        }
    }

    /// `status.elsewhere` as read and changed since, by UID.
    pub(super) fn elsewhere_now(&self) -> Vec<PlacedElsewhere> {
        let mut named: BTreeMap<&str, &str> = self
            .record
            .elsewhere()
            .iter()
            .map(|e| (e.uid.as_str(), e.owner.as_str()))
            .collect();
        for (uid, change) in &self.elsewhere_changes {
            match change {
                Some(owner) => named.insert(uid, owner),
                None => named.remove(uid.as_str()),
            };
        }
        named
            .into_iter()
            .map(|(uid, owner)| PlacedElsewhere {
                uid: uid.to_string(),
                owner: owner.to_string(),
            })
            .collect()
    }
}

/// The writes that name each of `marked` (`uid`, `owner`, home shard) in its home shard, every
/// shard otherwise as `sharded` has it: what must be committed before any of their entries.
pub fn marking_writes<'a>(
    sharded: &PoolRecord,
    marked: impl IntoIterator<Item = (&'a str, &'a str, ShardKey)>,
) -> Vec<ShardWrite> {
    let mut marking = sharded.clone();
    for (uid, owner, home) in marked {
        marking.mark_elsewhere(home, uid, owner);
    }
    marking.writes(false)
}

/// `first` (a pass's writes, not yet committed) with `marking` (writes of the record as `first`
/// leaves it, naming owners in their homes) in place of its write of the same shard: one write
/// per shard, which names the owners along with the pass's own changes.
pub fn with_marks(first: &[ShardWrite], marking: &[ShardWrite]) -> Vec<ShardWrite> {
    let mut merged: Vec<ShardWrite> = first
        .iter()
        .map(|write| {
            marking
                .iter()
                .find(|m| m.key == write.key)
                .unwrap_or(write)
                .clone()
        })
        .collect();
    merged.extend(
        marking
            .iter()
            .filter(|m| !first.iter().any(|w| w.key == m.key))
            .cloned(),
    );
    merged
}

/// `writes` (decided against the record as `before` leaves it) rebased on `before` committed:
/// a shard `before` wrote is written from the version it made (`sharded` has it now), and not
/// at all when the write would be the same status again.
pub fn rebased(
    writes: &[ShardWrite],
    before: &[ShardWrite],
    sharded: &PoolRecord,
) -> Vec<ShardWrite> {
    writes
        .iter()
        .filter_map(|write| match before.iter().find(|b| b.key == write.key) {
            None => Some(write.clone()),
            Some(same) if same.status == write.status => None,
            Some(_) => Some(ShardWrite {
                resource_version: sharded
                    .copy(write.key.copy)
                    .and_then(|c| c.shards.get(&write.key.window))
                    .and_then(|s| s.record.resource_version()),
                ..write.clone()
            }),
        })
        .collect()
}

/// The write that stops `shard` naming `uids` as placed elsewhere, if it names any of them.
/// `pool` is the pool's spec the shard is loaded under (the one it carries wins on write).
pub fn unmarking_write(
    pool: &PoolSnapshot,
    shard: PortPoolShard,
    uids: &BTreeSet<String>,
) -> Option<ShardWrite> {
    let layout = pool.layout().ok()?;
    let key = ShardKey::new(
        u16::try_from(shard.spec.copy).ok()?,
        u16::try_from(shard.spec.index).ok()?,
    );
    let record = load_shard(pool, &layout, key.window, shard);
    let mut changed = ShardRecord::new(key, record);
    for uid in uids {
        changed.unmark_elsewhere(uid);
    }
    changed.is_changed().then(|| changed.write(pool, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fixtures::{holder, pool_of, shard_of, sharded};

    #[test]
    fn marks_are_written_alone_and_unmarked_leaving_every_entry() {
        let pool = pool_of(&["20000-20511"], &[]);
        let record = sharded(
            &pool,
            vec![shard_of(&pool, 0, vec![holder("a", "web.http=20001")])],
        );
        let home = ShardKey::first(0);
        let writes = marking_writes(&record, [("b", "ns/b", home), ("c", "ns/c", home)]);
        assert_eq!(writes.len(), 1, "one write for the one home: {writes:?}");
        let status = &writes[0].status;
        let named: Vec<(&str, &str)> = status
            .elsewhere
            .iter()
            .map(|e| (e.uid.as_str(), e.owner.as_str()))
            .collect();
        assert_eq!(named, [("b", "ns/b"), ("c", "ns/c")]);
        assert_eq!(status.holders, record.first().shards[&0].record.entries());
        assert!(
            marking_writes(&record, []).is_empty(),
            "nothing to name, nothing to write"
        );

        let mut shard = record.first().shards[&0].record.shard.clone();
        shard.status = Some(status.clone());
        let snapshot = record.pool.clone();
        let b: BTreeSet<String> = ["b".to_string()].into();
        let write = unmarking_write(&snapshot, shard.clone(), &b).expect("b is named");
        let left: Vec<&str> = write
            .status
            .elsewhere
            .iter()
            .map(|e| e.uid.as_str())
            .collect();
        assert_eq!(left, ["c"]);
        assert_eq!(write.status.holders, status.holders);
        let absent: BTreeSet<String> = ["zzz".to_string()].into();
        assert_eq!(unmarking_write(&snapshot, shard, &absent), None);
    }
}

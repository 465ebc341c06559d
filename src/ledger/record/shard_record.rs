//! One shard of a pool's record as loaded ([`ShardRecord`]), the write that commits it
//! ([`ShardWrite`]), and the shard objects themselves: a new one, or one read loaded as a record
//! over its window of the pool's ports.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::{PoolHolder, PortPoolShard, PortPoolShardStatus};
use crate::core::{Holdings, Lean, PortSet, StaticBand};

use super::pool_snapshot::PoolSnapshot;
use super::window_record::WindowRecord;
use super::windows::{ShardKey, WindowLayout, shard_name, window};

/// One loaded shard, and what the decisions made since the read changed in it.
///
/// `record.state` and `record.holders` follow every [`ShardRecord::set`]; `record.entries()`
/// stays as read (what repair plans against). The entries decided since are kept apart, and
/// the rest are written verbatim: other holders' text is never rewritten, which the tenancy
/// policy would rightly refuse. Only the changes are kept, not a second copy of every entry: a
/// watcher's round holds the whole record of the pool (150,000 entries at the envelope).
#[derive(Clone, Debug)]
pub struct ShardRecord {
    /// The window.
    pub index: u16,
    /// The copy of the pool's ports this shard records.
    pub copy: u16,
    /// The shard's metadata (name, resourceVersion: the CAS) and status, the pool's spec, and
    /// the shard's ports.
    pub record: WindowRecord,
    /// The entries decided since the read, by UID (`None`: removed).
    changes: BTreeMap<String, Option<PoolHolder>>,
    /// `status.elsewhere` changed since the read, by UID (`Some(owner)`: named, `None`: no
    /// longer; see `elsewhere`).
    pub(super) elsewhere_changes: BTreeMap<String, Option<String>>,
    pub(super) changed: bool,
}

impl ShardRecord {
    pub fn new(key: ShardKey, record: WindowRecord) -> ShardRecord {
        ShardRecord {
            index: key.window,
            copy: key.copy,
            record,
            changes: BTreeMap::new(),
            elsewhere_changes: BTreeMap::new(),
            changed: false,
        }
    }

    /// Make `uid`'s entry here exactly `after` (none when empty): the state changes by the
    /// ports that left and joined its holdings, its text is `after` encoded. An undecodable
    /// entry of `uid` goes too (the decision was made on the rest of the pool).
    pub fn set(&mut self, uid: &str, owner: &str, after: &Holdings) {
        let before = self.record.holdings_of(uid);
        let had_opaque = self.record.opaque.remove(uid).is_some();
        if before == *after && !had_opaque {
            return;
        }
        let (was, now): (BTreeSet<u16>, BTreeSet<u16>) =
            (before.ports().collect(), after.ports().collect());
        for &port in was.difference(&now) {
            self.record.state.release(port);
        }
        for &port in now.difference(&was) {
            // Only a port outside this shard's ports cannot be marked; the counts say so.
            let _ = self.record.state.mark_held(port);
        }
        if after.is_empty() {
            self.changes.insert(uid.to_string(), None);
            self.record.holders.remove(uid);
        } else {
            let entry = PoolHolder {
                uid: uid.to_string(),
                owner: owner.to_string(),
                ports: after.encode(),
            };
            self.changes.insert(uid.to_string(), Some(entry));
            self.record.holders.insert(
                uid.to_string(),
                super::window_record::HolderEntry {
                    owner: owner.to_string(),
                    holdings: after.clone(),
                },
            );
        }
        self.changed = true;
    }

    pub fn key(&self) -> ShardKey {
        ShardKey::new(self.copy, self.index)
    }

    /// Whether a decision changed this shard since it was read.
    pub fn is_changed(&self) -> bool {
        self.changed
    }

    /// Whether this shard carries an older spec of the pool than `pool`.
    pub fn is_behind(&self, pool: &PoolSnapshot) -> bool {
        PoolSnapshot::of_shard(&self.record.shard)
            .is_none_or(|own| own.generation < pool.generation)
    }

    /// The write that commits this shard as it now is, by its own name at the version read.
    /// It keeps the copy of the pool's spec the shard carries; with `carry` (or when it carries
    /// none yet) it carries `pool`'s instead. Only pool administrators may change a shard's
    /// copy (rbac/portalloc-tenancy-policy.yaml), so ordinary allocations never touch it.
    pub fn write(&self, pool: &PoolSnapshot, carry: bool) -> ShardWrite {
        // By UID, as read (the last of two entries of one UID wins), then the changes.
        let mut entries: BTreeMap<&str, &PoolHolder> = self
            .record
            .entries()
            .iter()
            .map(|e| (e.uid.as_str(), e))
            .collect();
        for (uid, change) in &self.changes {
            match change {
                Some(entry) => entries.insert(uid, entry),
                None => entries.remove(uid.as_str()),
            };
        }
        let holders = entries.into_values().cloned().collect();
        let copy = match PoolSnapshot::of_shard(&self.record.shard) {
            Some(own) if !carry => own,
            _ => pool.clone(),
        };
        ShardWrite {
            key: self.key(),
            name: self.record.name().to_string(),
            resource_version: self.record.resource_version(),
            status: PortPoolShardStatus {
                elsewhere: self.elsewhere_now(),
                ..super::window_record::counted_status(&copy, &self.record.state, holders)
            },
        }
    }
}

/// One write of the per-shard compare-and-swap that commits an owner's decided holdings.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardWrite {
    pub key: ShardKey,
    pub name: String,
    /// `None`: the shard does not exist yet and is created with this status.
    pub resource_version: Option<String>,
    pub status: PortPoolShardStatus,
}

/// The shard object for `key` of `pool`, with no status yet. Owned by the PortPool, so a
/// garbage collector deletes it with the pool; nothing here relies on one running (`pool
/// delete` and `repair` remove shards themselves).
pub fn new_shard(pool: &PoolSnapshot, key: ShardKey) -> PortPoolShard {
    let mut shard = PortPoolShard::new(
        &shard_name(&pool.name, key),
        crate::api::PortPoolShardSpec {
            pool: pool.name.clone(),
            pool_uid: pool.uid.clone(),
            index: i32::from(key.window),
            ranges: vec![window(key.window).to_string().as_str().into()],
            copy: i32::from(key.copy),
        },
    );
    if !pool.uid.is_empty() {
        shard.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: format!("{}/{}", crate::api::GROUP, crate::api::VERSION),
                kind: "PortPool".into(),
                name: pool.name.clone(),
                uid: pool.uid.clone(),
                ..Default::default()
            },
        ]);
    }
    shard
}

/// Loads one shard object as a record over its window of `pool`'s ports.
pub fn load_shard(
    pool: &PoolSnapshot,
    layout: &WindowLayout,
    index: u16,
    shard: PortPoolShard,
) -> WindowRecord {
    let (ports, static_band) = layout
        .get(index)
        .map(|span| (span.ports.clone(), span.static_band()))
        .unwrap_or((PortSet::empty(), StaticBand::None));
    let mut record = WindowRecord::load(shard, pool.clone(), ports, static_band);
    record.state = record.state.leaning(window_lean(index));
    record
}

/// Which end a window fills from: even windows from the low end, odd ones from the high end,
/// so the free ports of a pair of windows meet at their shared edge and a block too long for
/// either window's leftover still fits across it (decided on the whole pool).
fn window_lean(index: u16) -> Lean {
    if index.is_multiple_of(2) {
        Lean::Low
    } else {
        Lean::High
    }
}

//! The record of some of a pool's ports, as the allocator sees it: the core's [`PoolState`]
//! plus who holds what. Usually one shard (one 256-port window); for an owner that needs
//! several windows, their shards joined into one record (`CopyRecord::union_record`).
//! Pure: built from one read, and turned back into the shard status to write.

use std::collections::BTreeMap;

use crate::api::{PlacedElsewhere, PoolHolder, PortPoolShard, PortPoolShardStatus};
use crate::core::{Holdings, PoolState, PortSet, SlotKey, StaticBand};

use super::pool_snapshot::PoolSnapshot;

/// One holder's entry, decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct HolderEntry {
    /// `namespace/name` of the PortAllocation.
    pub owner: String,
    pub holdings: Holdings,
}

/// Something in a shard's holders that should not be there. Such ports are never handed out
/// again by us; `repair` reports and fixes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Anomaly {
    /// A holder's `ports` text does not decode; its raw entry is kept untouched.
    Undecodable {
        uid: String,
        owner: String,
        error: String,
    },
    /// A held port outside the pool's ranges, or excluded.
    OutsidePool {
        uid: String,
        owner: String,
        slot: SlotKey,
        port: u16,
    },
    /// A port listed by two holders (or twice by one).
    Duplicate {
        port: u16,
        first: String,
        second: String,
    },
}

/// A record as read, ready for planning.
#[derive(Clone, Debug)]
pub struct WindowRecord {
    /// The shard as read: its name and resourceVersion (the compare-and-swap) and its entries.
    /// For a record of several windows, an object holding all of their entries.
    pub shard: PortPoolShard,
    /// The pool this record is decided under (its spec gives the ports).
    pub pool: PoolSnapshot,
    pub ports: PortSet,
    pub state: PoolState,
    pub holders: BTreeMap<String, HolderEntry>,
    /// Entries whose text did not decode, kept verbatim when we write the status back.
    pub opaque: BTreeMap<String, PoolHolder>,
    pub anomalies: Vec<Anomaly>,
}

impl WindowRecord {
    /// The entries of `shard` over `ports` (the shard's window of the pool, or several
    /// windows), whose lowest ports form a static band of `static_band`.
    pub fn load(
        shard: PortPoolShard,
        pool: PoolSnapshot,
        ports: PortSet,
        static_band: StaticBand,
    ) -> WindowRecord {
        let mut state = PoolState::new(ports.clone(), static_band);
        let mut holders = BTreeMap::new();
        let mut opaque = BTreeMap::new();
        let mut anomalies = Vec::new();
        let mut first_holder: BTreeMap<u16, String> = BTreeMap::new();
        let entries = shard
            .status
            .as_ref()
            .map(|s| s.holders.as_slice())
            .unwrap_or_default();
        for entry in entries {
            let holdings = match Holdings::decode(&entry.ports) {
                Ok(holdings) => holdings,
                Err(e) => {
                    anomalies.push(Anomaly::Undecodable {
                        uid: entry.uid.clone(),
                        owner: entry.owner.clone(),
                        error: e.to_string(),
                    });
                    opaque.insert(entry.uid.clone(), entry.clone());
                    continue;
                }
            };
            // Every port of a block is checked and marked on its own: a block that an edit of
            // the pool cut in two is reported port by port, and the rest of it stays held.
            let held_ports = holdings
                .iter()
                .flat_map(|(slot, block)| block.ports().map(move |port| (slot, port)));
            for (slot, port) in held_ports {
                if !ports.contains(port) {
                    anomalies.push(Anomaly::OutsidePool {
                        uid: entry.uid.clone(),
                        owner: entry.owner.clone(),
                        slot: slot.clone(),
                        port,
                    });
                } else if let Some(first) = first_holder.get(&port) {
                    anomalies.push(Anomaly::Duplicate {
                        port,
                        first: first.clone(),
                        second: entry.owner.clone(),
                    });
                } else {
                    first_holder.insert(port, entry.owner.clone());
                    // Cannot fail: in the pool and not yet held, both checked just above.
                    let _ = state.mark_held(port);
                }
            }
            holders.insert(
                entry.uid.clone(),
                HolderEntry {
                    owner: entry.owner.clone(),
                    holdings,
                },
            );
        }
        WindowRecord {
            shard,
            pool,
            ports,
            state,
            holders,
            opaque,
            anomalies,
        }
    }

    /// A record of `holders` over `ports` that is no one shard: several windows joined.
    pub fn joined(
        pool: PoolSnapshot,
        ports: PortSet,
        static_band: StaticBand,
        holders: Vec<PoolHolder>,
    ) -> WindowRecord {
        let mut shard = PortPoolShard::new(
            &pool.name,
            crate::api::PortPoolShardSpec {
                pool: pool.name.clone(),
                pool_uid: pool.uid.clone(),
                index: 0,
                ranges: vec![],
                copy: 0,
            },
        );
        shard.status = Some(PortPoolShardStatus {
            holders,
            ..Default::default()
        });
        WindowRecord::load(shard, pool, ports, static_band)
    }

    /// This record as it is after `status` is written (the same object, ports and bands).
    pub fn after(&self, status: PortPoolShardStatus) -> WindowRecord {
        let mut shard = self.shard.clone();
        shard.status = Some(status);
        WindowRecord::load(
            shard,
            self.pool.clone(),
            self.ports.clone(),
            self.static_band(),
        )
    }

    /// The static band this record was loaded with, as a count of its lowest ports.
    pub fn static_band(&self) -> StaticBand {
        StaticBand::Count(self.state.static_usage().size)
    }

    /// The shard's name.
    pub fn name(&self) -> &str {
        self.shard.metadata.name.as_deref().unwrap_or_default()
    }

    /// The pool's name, as messages and statuses name it.
    pub fn pool_name(&self) -> &str {
        &self.pool.name
    }

    /// The pool object's UID.
    pub fn pool_uid(&self) -> &str {
        &self.pool.uid
    }

    /// The shard's resourceVersion as read (`None`: the shard does not exist yet).
    pub fn resource_version(&self) -> Option<String> {
        self.shard.metadata.resource_version.clone()
    }

    /// Keep the ports' state (what is held, what is free) and drop who holds them: the holders
    /// decoded, the entries as read and the anomalies. For readers that only count; such a
    /// record must never be written back.
    pub fn keep_port_state_only(&mut self) {
        self.holders = BTreeMap::new();
        self.opaque = BTreeMap::new();
        self.anomalies = Vec::new();
        if let Some(status) = self.shard.status.as_mut() {
            status.holders = Vec::new();
            status.elsewhere = Vec::new();
        }
    }

    /// The owners this shard names as placed in other shards by a group commit, as read
    /// (`status.elsewhere`).
    pub fn elsewhere(&self) -> &[PlacedElsewhere] {
        self.shard
            .status
            .as_ref()
            .map(|s| s.elsewhere.as_slice())
            .unwrap_or_default()
    }

    /// Whether this shard names `uid` as placed in other shards: its entries may be anywhere
    /// in the pool, so no decision on this shard alone may be made for it.
    pub fn places_elsewhere(&self, uid: &str) -> bool {
        self.elsewhere().iter().any(|e| e.uid == uid)
    }

    /// Every entry as read, verbatim.
    pub fn entries(&self) -> &[PoolHolder] {
        self.shard
            .status
            .as_ref()
            .map(|s| s.holders.as_slice())
            .unwrap_or_default()
    }

    /// What `uid` holds here (nothing if it is not a holder).
    pub fn holdings_of(&self, uid: &str) -> Holdings {
        self.holders
            .get(uid)
            .map(|h| h.holdings.clone())
            .unwrap_or_default()
    }

    /// Who holds `port` (alone or inside a block), and in which slot.
    pub fn holder_of(&self, port: u16) -> Option<(&str, &HolderEntry, SlotKey)> {
        self.holders.iter().find_map(|(uid, entry)| {
            entry
                .holdings
                .iter()
                .find(|(_, block)| block.contains(port))
                .map(|(slot, _)| (uid.as_str(), entry, slot.clone()))
        })
    }

    /// Block sizes worth saying how many more fit: 8, 16 and 32, and every size held here.
    pub fn block_sizes_to_report(&self) -> Vec<u32> {
        let held = self
            .holders
            .values()
            .flat_map(|h| h.holdings.iter().map(|(_, block)| u32::from(block.count)));
        let mut sizes: Vec<u32> = [8, 16, 32]
            .into_iter()
            .chain(held)
            .filter(|&n| n > 1)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// The status to write after `uid`'s holdings become `holdings` (an empty set removes the
    /// holder) and `state` reflects that change. Every other holder's entry is kept verbatim.
    pub fn status_with(
        &self,
        state: &PoolState,
        uid: &str,
        owner: &str,
        holdings: &Holdings,
    ) -> PortPoolShardStatus {
        // Other holders' entries are copied as read, byte for byte: rewriting them (even into an
        // equivalent text) would be a change to someone else's entry, which the tenancy policy
        // rightly refuses.
        let mut entries: BTreeMap<String, PoolHolder> = self
            .entries()
            .iter()
            .map(|entry| (entry.uid.clone(), entry.clone()))
            .collect();
        if holdings.is_empty() {
            entries.remove(uid);
        } else {
            entries.insert(
                uid.to_string(),
                PoolHolder {
                    uid: uid.to_string(),
                    owner: owner.to_string(),
                    ports: holdings.encode(),
                },
            );
        }
        self.counted_status(state, entries.into_values().collect())
    }

    /// The status this record would write unchanged (counts recomputed, the pool copy ours).
    pub fn current_status(&self) -> PortPoolShardStatus {
        self.counted_status(&self.state, self.entries().to_vec())
    }

    /// A status with these holders, the counts of `state` and the pool copy decided under:
    /// every write carries the pool's spec along, so the next reader of the shard needs no
    /// read of the pool.
    pub fn counted_status(
        &self,
        state: &PoolState,
        holders: Vec<PoolHolder>,
    ) -> PortPoolShardStatus {
        let mut status = counted_status(&self.pool, state, holders);
        status.elsewhere = self.elsewhere().to_vec();
        status
    }
}

/// [`WindowRecord::counted_status`] for a record not loaded yet.
pub fn counted_status(
    pool: &PoolSnapshot,
    state: &PoolState,
    holders: Vec<PoolHolder>,
) -> PortPoolShardStatus {
    PortPoolShardStatus {
        pool_generation: pool.generation,
        pool_spec: Some(pool.spec.clone()),
        size: state.size() as i32,
        allocated: state.held_count() as i32,
        available: state.free_count() as i32,
        holder_count: holders.len() as i32,
        holders,
        elsewhere: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fixtures::{holder, pool_of, whole_record};

    fn record(holders: Vec<PoolHolder>) -> WindowRecord {
        whole_record(&pool_of(&["100-109"], &["105"]), holders)
    }

    #[test]
    fn load_marks_holdings_and_reports_anomalies() {
        let record = record(vec![
            holder("a", "web.http=100,101"),
            holder("b", "db.sql=101 db.admin=105"),
            holder("c", "not valid text"),
        ]);
        assert_eq!(record.state.size(), 9);
        assert_eq!(record.state.held_count(), 2);
        assert!(record.anomalies.contains(&Anomaly::Duplicate {
            port: 101,
            first: "ns/a".into(),
            second: "ns/b".into()
        }));
        assert!(
            record
                .anomalies
                .iter()
                .any(|a| matches!(a, Anomaly::OutsidePool { port: 105, .. }))
        );
        assert!(
            record
                .anomalies
                .iter()
                .any(|a| matches!(a, Anomaly::Undecodable { uid, .. } if uid == "c"))
        );
        assert_eq!(
            record
                .holder_of(100)
                .map(|(uid, _, slot)| (uid, slot.to_string())),
            Some(("a", "web.http[0]".to_string()))
        );
    }

    #[test]
    fn a_record_kept_for_counting_has_the_same_ports_held_and_free_and_no_holders() {
        let mut record = record(vec![
            holder("a", "web.http=100,101"),
            holder("b", "db.sql=103"),
            holder("c", "not valid text"),
        ]);
        let (held, free) = (record.state.held_count(), record.state.free_count());
        record.keep_port_state_only();
        assert_eq!(
            (record.state.held_count(), record.state.free_count()),
            (held, free)
        );
        assert_eq!(held, 3);
        assert!(record.holders.is_empty() && record.opaque.is_empty());
        assert!(record.entries().is_empty() && record.anomalies.is_empty());
    }

    #[test]
    fn status_with_replaces_only_one_holder_keeps_opaque_entries_and_carries_the_pool_spec() {
        let record = record(vec![holder("a", "web.http=100"), holder("c", "???")]);
        let mut state = record.state.clone();
        state.take_requested(102).unwrap();
        let mut mine = Holdings::new();
        mine.insert(SlotKey::new("x", "y", 0), 102);
        let status = record.status_with(&state, "b", "ns/b", &mine);
        let uids: Vec<_> = status
            .holders
            .iter()
            .map(|h| (h.uid.as_str(), h.ports.as_str()))
            .collect();
        assert_eq!(
            uids,
            vec![("a", "web.http=100"), ("b", "x.y=102"), ("c", "???")]
        );
        assert_eq!(
            (
                status.size,
                status.allocated,
                status.available,
                status.holder_count
            ),
            (9, 2, 7, 3)
        );
        assert_eq!(status.pool_spec.as_ref(), Some(&record.pool.spec));
        assert_eq!(status.pool_generation, record.pool.generation);

        let removed = record.status_with(&record.state, "a", "ns/a", &Holdings::new());
        assert_eq!(removed.holders.len(), 1);
        assert_eq!(record.after(removed).holders.len(), 0);
    }

    #[test]
    fn other_holders_entries_are_copied_byte_for_byte() {
        // Decodable, but not how we would write it (groups out of order).
        let theirs = "web.b=103 web.a=104";
        let record = record(vec![holder("d", theirs)]);
        assert_eq!(record.holdings_of("d").len(), 2);
        assert_ne!(record.holdings_of("d").encode(), theirs);
        let mut mine = Holdings::new();
        mine.insert(SlotKey::new("x", "y", 0), 100);
        let status = record.status_with(&record.state, "b", "ns/b", &mine);
        assert_eq!(status.holders[1].ports, theirs);
    }
}

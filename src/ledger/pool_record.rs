//! A `PortPool` object as the allocator sees it: the core's [`PoolState`] plus who holds what.
//! Pure: built from one read of the pool, and turned back into the status to write.

use std::collections::BTreeMap;

use crate::api::{PoolHolder, PortPool, PortPoolStatus, SpecError};
use crate::core::{Holdings, PoolState, PortSet, SlotKey, StaticBand};

/// One holder's entry, decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct HolderEntry {
    /// `namespace/name` of the PortAllocation.
    pub owner: String,
    pub holdings: Holdings,
}

/// Something in the pool's status that should not be there. Such ports are never handed out
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

/// The pool as read, ready for planning.
#[derive(Clone, Debug)]
pub struct PoolRecord {
    pub pool: PortPool,
    pub ports: PortSet,
    pub state: PoolState,
    pub holders: BTreeMap<String, HolderEntry>,
    /// Entries whose text did not decode, kept verbatim when we write the status back.
    pub opaque: BTreeMap<String, PoolHolder>,
    pub anomalies: Vec<Anomaly>,
}

impl PoolRecord {
    pub fn load(pool: PortPool) -> Result<PoolRecord, SpecError> {
        let ports = pool.spec.port_set()?;
        let static_band = pool.spec.core_static_band();
        Ok(PoolRecord::load_ports(pool, ports, static_band))
    }

    /// The record in `pool.status` over the given ports rather than the spec's: one shard of a
    /// sharded pool, whose ports are a window of the pool's (see `ShardedRecord`).
    pub fn load_ports(pool: PortPool, ports: PortSet, static_band: StaticBand) -> PoolRecord {
        let mut state = PoolState::new(ports.clone(), static_band);
        let mut holders = BTreeMap::new();
        let mut opaque = BTreeMap::new();
        let mut anomalies = Vec::new();
        let mut first_holder: BTreeMap<u16, String> = BTreeMap::new();
        let entries = pool
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
        PoolRecord {
            pool,
            ports,
            state,
            holders,
            opaque,
            anomalies,
        }
    }

    pub fn name(&self) -> &str {
        self.pool.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn uid(&self) -> Option<&str> {
        self.pool.metadata.uid.as_deref()
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
    ) -> PortPoolStatus {
        // Other holders' entries are copied as read, byte for byte: rewriting them (even into an
        // equivalent text) would be a change to someone else's entry, which the tenancy policy
        // rightly refuses.
        let mut entries: BTreeMap<String, PoolHolder> = self
            .pool
            .status
            .iter()
            .flat_map(|s| s.holders.iter())
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
        counted_status(state, entries.into_values().collect())
    }

    /// The status this record would write unchanged (counts recomputed).
    pub fn current_status(&self) -> PortPoolStatus {
        let holders = self
            .pool
            .status
            .as_ref()
            .map(|s| s.holders.clone())
            .unwrap_or_default();
        counted_status(&self.state, holders)
    }
}

fn counted_status(state: &PoolState, holders: Vec<PoolHolder>) -> PortPoolStatus {
    PortPoolStatus {
        // The one-object record: a sharded pool is never written from here.
        format: None,
        size: state.size() as i32,
        allocated: state.held_count() as i32,
        available: state.free_count() as i32,
        holder_count: holders.len() as i32,
        holders,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortPoolSpec, StaticBandSetting};

    fn pool(holders: Vec<PoolHolder>) -> PortPool {
        let mut pool = PortPool::new(
            "p",
            PortPoolSpec {
                ranges: vec!["100-109".into()],
                exclude: vec!["105".into()],
                protocol: Default::default(),
                static_band: StaticBandSetting::None,
            },
        );
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
    fn load_marks_holdings_and_reports_anomalies() {
        let record = PoolRecord::load(pool(vec![
            holder("a", "web.http=100,101"),
            holder("b", "db.sql=101 db.admin=105"),
            holder("c", "not valid text"),
        ]))
        .unwrap();
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
    fn status_with_replaces_only_one_holder_and_keeps_opaque_entries() {
        let record =
            PoolRecord::load(pool(vec![holder("a", "web.http=100"), holder("c", "???")])).unwrap();
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

        let removed = record.status_with(&record.state, "a", "ns/a", &Holdings::new());
        assert_eq!(removed.holders.len(), 1);
    }

    #[test]
    fn other_holders_entries_are_copied_byte_for_byte() {
        // Decodable, but not how we would write it (groups out of order).
        let theirs = "web.b=103 web.a=104";
        let record = PoolRecord::load(pool(vec![holder("d", theirs)])).unwrap();
        assert_eq!(record.holdings_of("d").len(), 2);
        assert_ne!(record.holdings_of("d").encode(), theirs);
        let mut mine = Holdings::new();
        mine.insert(SlotKey::new("x", "y", 0), 100);
        let status = record.status_with(&record.state, "b", "ns/b", &mine);
        assert_eq!(status.holders[1].ports, theirs);
    }
}

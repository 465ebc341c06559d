//! Objects this watcher synced to Ready lately, so that a reconcile queued before its own
//! status write reached the cache does not sync the object again.

use std::time::{Duration, Instant};

use crate::api::PortAllocation;

/// How long an object this watcher synced to Ready is taken as synced while its cached copy
/// still says otherwise. A write's watch event can reach the cache after a reconcile queued by
/// an earlier one has read it (pass 2 widens a status before its shards are written): that
/// reconcile synced again, a read of the whole pool, a 409 on the stale status and a lone sync
/// (77 of the first 659 of 15,000 new PortAllocations were synced twice so). After this long it
/// is synced again (its status may have been overwritten since).
pub(super) const SYNCED_LATELY: Duration = Duration::from_secs(30);

/// Objects synced to Ready lately.
#[derive(Default)]
pub(super) struct SyncedLately(std::sync::Mutex<Lately>);

#[derive(Default)]
struct Lately {
    /// UID -> (generation, when).
    synced: std::collections::HashMap<String, (Option<i64>, Instant)>,
    pruned: Option<Instant>,
}

impl SyncedLately {
    pub(super) fn remember(&self, pa: &PortAllocation) {
        let Some(uid) = pa.metadata.uid.clone() else {
            return;
        };
        let mut lately = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if lately.pruned.is_none_or(|t| t.elapsed() > SYNCED_LATELY) {
            lately
                .synced
                .retain(|_, (_, at)| at.elapsed() < SYNCED_LATELY);
            lately.pruned = Some(Instant::now());
        }
        lately
            .synced
            .insert(uid, (pa.metadata.generation, Instant::now()));
    }

    /// Whether `pa`'s generation was synced to Ready within [`SYNCED_LATELY`].
    pub(super) fn holds(&self, pa: &PortAllocation) -> bool {
        let Some(uid) = &pa.metadata.uid else {
            return false;
        };
        let lately = self.0.lock().unwrap_or_else(|e| e.into_inner());
        lately.synced.get(uid).is_some_and(|(generation, at)| {
            *generation == pa.metadata.generation && at.elapsed() < SYNCED_LATELY
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pa(uid: &str, generation: i64) -> PortAllocation {
        let mut pa = PortAllocation::new("a", Default::default());
        pa.metadata.uid = Some(uid.into());
        pa.metadata.generation = Some(generation);
        pa
    }

    #[test]
    fn a_generation_synced_lately_holds_and_another_does_not() {
        let lately = SyncedLately::default();
        assert!(!lately.holds(&pa("u", 1)));
        lately.remember(&pa("u", 1));
        assert!(lately.holds(&pa("u", 1)));
        assert!(!lately.holds(&pa("u", 2)), "a new spec is synced again");
        assert!(!lately.holds(&pa("v", 1)));
    }
}

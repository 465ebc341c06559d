//! A pool's shards as one LIST just returned them, kept for the allocation that follows in the
//! same process: `create -f` checks a new object against the pool (the LIST), creates it, then
//! allocates it against that very LIST instead of reading again. Taken once, and only while
//! fresh; a copy gone stale meanwhile costs a 409 and a read, never a wrong port (every write
//! carries the resourceVersion listed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::PortPoolShard;
use crate::ledger::PoolSnapshot;

/// How long a listing may wait for the allocation it was made for.
const FRESH_FOR: Duration = Duration::from_secs(5);

/// One pool's listing: the pool's newest snapshot and every one of its shards.
pub type Listing = (PoolSnapshot, Vec<PortPoolShard>);

/// The last complete listing of each pool, by pool name; shared by an Allocator's clones.
#[derive(Clone, Debug, Default)]
pub struct ListingCache {
    listings: Arc<Mutex<HashMap<String, (Instant, Listing)>>>,
    disabled: bool,
}

impl ListingCache {
    pub fn disabled() -> ListingCache {
        ListingCache {
            disabled: true,
            ..Default::default()
        }
    }

    pub fn keep(&self, pool: &str, listing: Listing) {
        if !self.disabled {
            self.lock().insert(pool.into(), (Instant::now(), listing));
        }
    }

    /// The listing of `pool`, once, if it is fresh.
    pub fn take(&self, pool: &str) -> Option<Listing> {
        let (at, listing) = self.lock().remove(pool)?;
        (at.elapsed() < FRESH_FOR).then_some(listing)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Listing)>> {
        // A panic elsewhere while holding the lock leaves a map that is still just a cache.
        self.listings.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortPool, PortPoolSpec, StaticBandSetting};

    fn snapshot() -> PoolSnapshot {
        let pool = PortPool::new(
            "p",
            PortPoolSpec {
                ranges: vec!["100-101".into()],
                exclude: vec![],
                protocol: Default::default(),
                static_band: StaticBandSetting::None,
                node_reuse: None,
                follow_nodes: None,
                guard: None,
                allow_overlap: false,
            },
        );
        PoolSnapshot::of_pool(&pool)
    }

    #[test]
    fn a_listing_is_taken_once_and_never_when_disabled() {
        let cache = ListingCache::default();
        cache.keep("p", (snapshot(), vec![]));
        assert!(cache.take("q").is_none());
        assert!(cache.take("p").is_some());
        assert!(cache.take("p").is_none(), "taken once");
        let off = ListingCache::disabled();
        off.keep("p", (snapshot(), vec![]));
        assert!(off.take("p").is_none());
    }
}

//! The last copy of each pool an [`super::Allocator`] read or wrote, so the next allocation can
//! skip the read: the response to a successful write already is the current object.
//!
//! A copy is only ever a guess. A write decided against it carries its resourceVersion, so a
//! stale copy costs one 409 and then a fresh read, never a wrong port. A decision that writes
//! nothing (unchanged, or a refusal) is not checked by any compare-and-swap, so the allocator
//! makes those only against a fresh read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::{PortPool, PortPoolShard};

/// The last pool objects; the shards of sharded pools are kept the same way.
pub type PoolCache = ObjectCache<PortPool>;
pub type ShardCache = ObjectCache<PortPoolShard>;

/// Shared by the clones of one Allocator (the watcher's tasks, `sync --all`'s batches).
#[derive(Clone, Debug)]
pub struct ObjectCache<T> {
    objects: Arc<Mutex<HashMap<String, (T, Instant)>>>,
    /// Off: every allocation reads the pool first (the behaviour before the cache; the
    /// benchmark compares both).
    disabled: bool,
}

impl<T> Default for ObjectCache<T> {
    fn default() -> Self {
        ObjectCache {
            objects: Arc::default(),
            disabled: false,
        }
    }
}

impl<T: Clone + kube::Resource> ObjectCache<T> {
    pub fn disabled() -> ObjectCache<T> {
        ObjectCache {
            disabled: true,
            ..Default::default()
        }
    }

    pub fn get(&self, name: &str) -> Option<T> {
        self.get_younger_than(name, Duration::MAX)
    }

    /// The copy of `name` if it was remembered less than `age` ago.
    pub fn get_younger_than(&self, name: &str, age: Duration) -> Option<T> {
        if self.disabled {
            return None;
        }
        self.lock()
            .get(name)
            .filter(|(_, at)| at.elapsed() < age)
            .map(|(object, _)| object.clone())
    }

    /// Keep `object` as the latest copy of its name.
    pub fn remember(&self, object: &T) {
        if self.disabled {
            return;
        }
        let name = object.name_any();
        if !name.is_empty() {
            self.lock().insert(name, (object.clone(), Instant::now()));
        }
    }

    pub fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (T, Instant)>> {
        // A panic elsewhere while holding the lock leaves a map that is still just a cache.
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortPoolSpec, StaticBandSetting};

    fn pool(name: &str, version: &str) -> PortPool {
        let spec = PortPoolSpec {
            ranges: vec!["1-2".into()],
            exclude: vec![],
            protocol: Default::default(),
            static_band: StaticBandSetting::None,
        };
        let mut pool = PortPool::new(name, spec);
        pool.metadata.resource_version = Some(version.into());
        pool
    }

    #[test]
    fn clones_share_the_latest_copy_and_forget_drops_it() {
        let cache = PoolCache::default();
        let clone = cache.clone();
        cache.remember(&pool("p", "1"));
        clone.remember(&pool("p", "2"));
        let version = |c: &PoolCache| c.get("p").and_then(|p| p.metadata.resource_version);
        assert_eq!(version(&cache).as_deref(), Some("2"));
        clone.forget("p");
        assert_eq!(version(&cache), None);
        let off = PoolCache::disabled();
        off.remember(&pool("p", "3"));
        assert_eq!(version(&off), None);
        cache.remember(&pool("p", "4"));
        assert!(
            cache
                .get_younger_than("p", Duration::from_secs(60))
                .is_some()
        );
        assert!(cache.get_younger_than("p", Duration::ZERO).is_none());
    }
}

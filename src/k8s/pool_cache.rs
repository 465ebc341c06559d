//! The last copy of each shard an [`super::Allocator`] read or wrote, and of each pool's spec,
//! so the next allocation can skip the read: the response to a successful write already is the
//! current object.
//!
//! A copy is only ever a guess. A write decided against it carries its resourceVersion, so a
//! stale copy costs one 409 and then a fresh read, never a wrong port. A decision that writes
//! nothing (unchanged, or a refusal) is not checked by any compare-and-swap, so the allocator
//! makes those only against a fresh read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::PortPoolShard;
use crate::ledger::PoolCopy;

/// The last shard objects, by name.
pub type ShardCache = ObjectCache<PortPoolShard>;
/// The newest spec of each pool seen (read, or carried by a shard), by pool name: what an
/// owner's home shard is computed from.
pub type PoolCache = ObjectCache<PoolCopy>;

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

impl<T: Clone> ObjectCache<T> {
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

    /// Keep `object` as the latest copy of `name`.
    pub fn remember(&self, name: &str, object: &T) {
        if self.disabled || name.is_empty() {
            return;
        }
        self.lock()
            .insert(name.to_string(), (object.clone(), Instant::now()));
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

    #[test]
    fn clones_share_the_latest_copy_and_forget_drops_it() {
        let cache: ObjectCache<u32> = ObjectCache::default();
        let clone = cache.clone();
        cache.remember("p", &1);
        clone.remember("p", &2);
        assert_eq!(cache.get("p"), Some(2));
        clone.forget("p");
        assert_eq!(cache.get("p"), None);
        let off: ObjectCache<u32> = ObjectCache::disabled();
        off.remember("p", &3);
        assert_eq!(off.get("p"), None);
        cache.remember("p", &4);
        assert!(
            cache
                .get_younger_than("p", Duration::from_secs(60))
                .is_some()
        );
        assert!(cache.get_younger_than("p", Duration::ZERO).is_none());
    }
}

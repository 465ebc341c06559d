//! The watcher's cache of PortAllocations, lent to the pod webhook of the same process. An
//! admission needs the pod's PortAllocation; reading it from the API server was one request per
//! pod (a burst of 1,000 pods: 1,000 GETs beside the pods' own writes). While the watcher runs,
//! its controller's cache holds every PortAllocation it watches, current within a watch event,
//! and the webhook may take it from there.
//!
//! The cache is a fast path, never the last word: the webhook takes a cached object only when
//! its status is current, the record check still proves each port is its owner's in the pool's
//! record, and any denial is decided again from a fresh read. A replica that stops leading stops
//! its controller and takes the cache back ([`Lent`]), so a cache no longer kept current by a
//! watch is never read.

use std::sync::{Arc, RwLock};

use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::PortAllocation;

/// Shared by the clones of one [`Allocator`](super::Allocator): empty until a watcher lends
/// its cache.
#[derive(Clone, Default)]
pub struct WatchedAllocations(Arc<RwLock<Option<Store<PortAllocation>>>>);

impl WatchedAllocations {
    /// Lend `store` until the returned guard is dropped (the watcher's work ends).
    pub fn lend(&self, store: Store<PortAllocation>) -> Lent {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(store);
        Lent(self.clone())
    }

    /// The cached PortAllocation `namespace/name`, if a watcher has lent its cache and it
    /// holds the object.
    pub fn get(&self, namespace: &str, name: &str) -> Option<PortAllocation> {
        let lent = self.0.read().unwrap_or_else(|e| e.into_inner());
        let key = ObjectRef::new(name).within(namespace);
        lent.as_ref()?.get(&key).map(|pa| pa.as_ref().clone())
    }
}

/// The cache is lent while this lives.
pub struct Lent(WatchedAllocations);

impl Drop for Lent {
    fn drop(&mut self) {
        *self.0.0.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;

    use super::WatchedAllocations;
    use crate::api::PortAllocation;

    fn allocation(namespace: &str, name: &str) -> PortAllocation {
        let mut pa = PortAllocation::new(
            name,
            serde_json::from_value(serde_json::json!({
                "pool": "default",
                "roles": [{"name": "web", "replicas": 1, "ports": [{"name": "http", "env": "HTTP_PORT"}]}],
            }))
            .unwrap(),
        );
        pa.metadata.namespace = Some(namespace.into());
        pa
    }

    #[test]
    fn an_object_is_found_only_while_the_cache_is_lent() {
        let (reader, mut writer) = store::<PortAllocation>();
        writer.apply_watcher_event(&Event::Apply(allocation("apps", "w")));
        let watched = WatchedAllocations::default();
        assert!(watched.get("apps", "w").is_none(), "nothing lent yet");
        let lent = watched.clone().lend(reader);
        assert_eq!(
            watched.get("apps", "w").map(|pa| pa.metadata.name),
            Some(Some("w".to_string()))
        );
        assert!(
            watched.get("other", "w").is_none(),
            "another namespace's name"
        );
        drop(lent);
        assert!(
            watched.get("apps", "w").is_none(),
            "taken back when the work ends"
        );
    }
}

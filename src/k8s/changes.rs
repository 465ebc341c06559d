//! `get -w`: the changes to a kind after the table was printed, as kubectl's watch prints
//! them: one object per change, deleted ones too. Built on the runtime's watcher, which
//! re-lists after a broken watch; objects it lists again unchanged are not repeated.

use std::collections::BTreeMap;

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};

/// One change to an object of the watched kind.
#[derive(Clone, Debug)]
pub enum Seen<K> {
    Changed(K),
    Deleted(K),
    /// The watch broke; it is being restarted (the text says why).
    Interrupted(String),
}

/// Every change to the objects of `api` matching `selector`, after those in `listed` (by
/// their resourceVersions: what the table already shows is not printed again).
pub fn changes<K>(
    api: Api<K>,
    selector: Option<&str>,
    listed: &[K],
) -> impl Stream<Item = Seen<K>> + Send + use<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let mut config = watcher::Config::default();
    if let Some(selector) = selector {
        config = config.labels(selector);
    }
    let mut versions: BTreeMap<(Option<String>, String), Option<String>> = listed
        .iter()
        .map(|o| ((o.namespace(), o.name_any()), o.resource_version()))
        .collect();
    watcher::watcher(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let seen = match event {
                Ok(Event::Apply(object) | Event::InitApply(object)) => {
                    let key = (object.namespace(), object.name_any());
                    let version = object.resource_version();
                    match versions.insert(key, version.clone()) {
                        Some(known) if known == version => None,
                        _ => Some(Seen::Changed(object)),
                    }
                }
                Ok(Event::Delete(object)) => {
                    versions.remove(&(object.namespace(), object.name_any()));
                    Some(Seen::Deleted(object))
                }
                Ok(Event::Init | Event::InitDone) => None,
                Err(e) => Some(Seen::Interrupted(crate::k8s::error_chain(&e))),
            };
            futures::future::ready(seen)
        })
}

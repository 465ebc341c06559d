//! A watch of every PortPoolShard that keeps the remembered copies current, so the pod
//! webhook's record check can take a copy older than its few seconds of trust at its word: the
//! watch has said whether the shard changed since (`docs/webhook-record-check.md`).
//!
//! A copy is vouched for while the watch is live (listed, and not failed since) and the copy
//! is at least as new as the last version the watch saw of its shard. Every change reaches the
//! copy as an event, so a vouched copy is at most one event's delay behind the API server;
//! without the watch the check trusts a copy for [`MAX_AGE`](crate::k8s::webhook) only, and
//! reads the shard again after that. Events for shards nobody remembered are only counted: the
//! copies stay the ones this process uses, and its memory with them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};

use super::ShardCache;
use crate::api::PortPoolShard;
use crate::k8s::client::lean;
use crate::k8s::error::error_chain;
use crate::k8s::process::Metrics;

/// Never vouched for: a shard deleted, or one whose version is not a number.
const UNTRUSTED: u64 = u64::MAX;
/// The longest wait before the watch starts over after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What the watch has seen of each shard, shared by the watch and the record check.
#[derive(Clone, Debug, Default)]
pub struct ShardVersions {
    state: Arc<Mutex<Seen>>,
}

#[derive(Debug, Default)]
struct Seen {
    /// Listed, and no failure since.
    live: bool,
    /// The newest version the watch saw of each shard.
    latest: HashMap<String, u64>,
    /// The shards of the list in progress (to find those deleted while no watch ran).
    listing: HashSet<String>,
}

impl ShardVersions {
    /// Whether `copy` of shard `name` is known to be current (as of the watch's last event).
    pub fn vouches_for(&self, name: &str, copy: &PortPoolShard) -> bool {
        let seen = self.lock();
        let (Some(version), Some(&latest)) = (version(copy), seen.latest.get(name)) else {
            return false;
        };
        seen.live && latest != UNTRUSTED && version >= latest
    }

    /// A list starts: nothing is vouched for until it ends.
    fn relisting(&self) {
        let mut seen = self.lock();
        seen.live = false;
        seen.listing.clear();
    }

    fn listed_one(&self, name: &str, version: Option<u64>) {
        let mut seen = self.lock();
        seen.listing.insert(name.to_string());
        seen.latest
            .insert(name.to_string(), version.unwrap_or(UNTRUSTED));
    }

    /// The list is complete: a shard it did not name was deleted while no watch ran.
    fn listed(&self) -> usize {
        let mut seen = self.lock();
        let Seen {
            latest, listing, ..
        } = &mut *seen;
        for (name, version) in latest.iter_mut() {
            if !listing.contains(name) {
                *version = UNTRUSTED;
            }
        }
        let count = listing.len();
        seen.listing = HashSet::new();
        seen.live = true;
        count
    }

    fn changed(&self, name: &str, version: Option<u64>) {
        self.lock()
            .latest
            .insert(name.to_string(), version.unwrap_or(UNTRUSTED));
    }

    fn deleted(&self, name: &str) {
        self.lock().latest.insert(name.to_string(), UNTRUSTED);
    }

    /// The watch failed: events may be missed until it has listed again.
    fn lost(&self) {
        self.lock().live = false;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        // A panic elsewhere while holding the lock leaves versions that are still only hints.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The shard's resourceVersion as a number (etcd's revision), `None` if it is not one: such a
/// copy is never vouched for, and the check reads as it would without the watch.
fn version(shard: &PortPoolShard) -> Option<u64> {
    shard.metadata.resource_version.as_deref()?.parse().ok()
}

/// Watch every PortPoolShard for as long as the task runs: each event updates `versions` and,
/// when newer, the copy `copies` remembers. A failure starts the watch over from a list.
pub async fn keep_copies_current(
    client: Client,
    copies: ShardCache,
    versions: ShardVersions,
    metrics: Metrics,
) {
    let api: Api<PortPoolShard> = Api::all(client);
    let mut backoff = Duration::from_secs(1);
    let mut first = true;
    loop {
        let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => versions.relisting(),
                Ok(Event::InitApply(shard)) => {
                    versions.listed_one(&shard.name_any(), version(&shard));
                    refresh(&copies, lean(shard));
                }
                Ok(Event::InitDone) => {
                    let listed = versions.listed();
                    backoff = Duration::from_secs(1);
                    if first {
                        tracing::info!(
                            "watching PortPoolShards ({listed} listed): the record check trusts \
                             the remembered copies the watch keeps current"
                        );
                        first = false;
                    }
                }
                Ok(Event::Apply(shard)) => {
                    versions.changed(&shard.name_any(), version(&shard));
                    refresh(&copies, lean(shard));
                }
                Ok(Event::Delete(shard)) => {
                    let name = shard.name_any();
                    versions.deleted(&name);
                    copies.forget(&name);
                }
                Err(e) => {
                    versions.lost();
                    metrics.record_watch_restart("shards");
                    tracing::warn!(
                        "watching PortPoolShards: {}; until it lists again, the record check \
                         reads a shard it has not read in the last few seconds (it needs list \
                         and watch on portpoolshards.portalloc.dev)",
                        error_chain(&e)
                    );
                    break;
                }
            }
        }
        versions.lost();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Replace the remembered copy of `shard` by this newer one (an event may arrive after the
/// copy of a later write was remembered). Kept without its `managedFields`, as every kept
/// object is.
fn refresh(copies: &ShardCache, shard: PortPoolShard) {
    let Some(new) = version(&shard) else {
        return;
    };
    copies.refresh(&shard.name_any(), &shard, |copy| {
        version(copy).is_none_or(|old| old < new)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(version: &str) -> PortPoolShard {
        let mut shard: PortPoolShard = serde_json::from_value(serde_json::json!({
            "apiVersion": "portalloc.dev/v1alpha1",
            "kind": "PortPoolShard",
            "metadata": {"name": "gpu-0-30000"},
            "spec": {"pool": "gpu", "poolUID": "u", "index": 0, "ranges": ["30000-30999"]},
        }))
        .expect("a shard");
        shard.metadata.resource_version = Some(version.to_string());
        shard
    }

    #[test]
    fn nothing_is_vouched_for_before_the_list_ends_or_after_a_failure() {
        let versions = ShardVersions::default();
        versions.relisting();
        versions.listed_one("gpu-0-30000", Some(7));
        assert!(!versions.vouches_for("gpu-0-30000", &shard("7")), "listing");
        assert_eq!(versions.listed(), 1);
        assert!(versions.vouches_for("gpu-0-30000", &shard("7")));
        assert!(versions.vouches_for("gpu-0-30000", &shard("9")), "newer");
        versions.lost();
        assert!(!versions.vouches_for("gpu-0-30000", &shard("7")), "failed");
    }

    #[test]
    fn a_copy_older_than_the_last_event_or_of_an_unseen_shard_is_not_vouched_for() {
        let versions = ShardVersions::default();
        versions.relisting();
        versions.listed_one("gpu-0-30000", Some(7));
        versions.listed();
        versions.changed("gpu-0-30000", Some(12));
        assert!(!versions.vouches_for("gpu-0-30000", &shard("7")));
        assert!(versions.vouches_for("gpu-0-30000", &shard("12")));
        // A shard the watch has not reported yet (just created): its copy goes by its age.
        assert!(!versions.vouches_for("gpu-0-31000", &shard("20")));
        assert!(!versions.vouches_for("gpu-0-30000", &shard("not-a-number")));
    }

    #[test]
    fn a_deleted_shard_is_never_vouched_for_until_it_is_created_again() {
        let versions = ShardVersions::default();
        versions.relisting();
        versions.listed_one("a", Some(3));
        versions.listed_one("b", Some(4));
        versions.listed();
        versions.deleted("a");
        assert!(!versions.vouches_for("a", &shard("99")));
        versions.changed("a", Some(100));
        assert!(versions.vouches_for("a", &shard("100")));
        // Deleted while no watch ran: the next list does not name it.
        versions.lost();
        versions.relisting();
        versions.listed_one("a", Some(100));
        versions.listed();
        assert!(!versions.vouches_for("b", &shard("4")));
        assert!(versions.vouches_for("a", &shard("100")));
    }

    #[test]
    fn an_event_replaces_an_older_copy_never_a_newer_one_nor_adds_one() {
        let copies = ShardCache::default();
        refresh(&copies, shard("5"));
        assert!(
            copies.get("gpu-0-30000").is_none(),
            "not remembered: left out"
        );
        copies.remember("gpu-0-30000", &shard("8"));
        refresh(&copies, shard("6"));
        let kept = copies.get("gpu-0-30000").unwrap();
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("8"));
        refresh(&copies, shard("9"));
        let kept = copies.get("gpu-0-30000").unwrap();
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("9"));
    }
}

//! A batch's owners placed outside their home shard: each home shard names them
//! (`status.elsewhere`, written with pass 1's writes, see `widening`) before any of their
//! entries is written, and stops naming them once their statuses name their shards (the
//! ledger's `elsewhere` says why): at most one write more per home shard, where a status write
//! per owner widened it before.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, stream};

use super::allocator::Allocator;
use crate::api::{PortAllocation, PortPoolShard};
use crate::k8s::record::ShardStore;
use crate::ledger::{
    BatchItem, PoolRecord, PoolSnapshot, ShardKey, listed_shards, unmarking_write,
};

/// Home shards written (or read back) at once while unmarking.
const UNMARKS_AT_ONCE: usize = 8;

/// Tries at one home shard's unmarking before it is left to the next batch or `repair`.
const UNMARK_TRIES: usize = 3;

/// Where a batch may name an owner instead of widening its status: its home shard, when its
/// status names no shards (so its next sync reads that shard first).
pub(super) fn home_alone(pa: &PortAllocation, item: &BatchItem) -> Option<ShardKey> {
    let [home] = item.known.iter().copied().collect::<Vec<_>>()[..] else {
        return None;
    };
    listed_shards(pa.status.as_ref()).is_empty().then_some(home)
}

/// The home shards that name an owner of a batch, and whom: what to unmark once statuses say.
#[derive(Default)]
pub(super) struct Marks {
    by_home: BTreeMap<ShardKey, BTreeSet<String>>,
    /// Owners named in their home in vain: refused, with no entry outside it.
    needless: BTreeSet<String>,
}

impl Marks {
    /// `uid`, named (or to be named) in `home`.
    pub(super) fn add(&mut self, home: ShardKey, uid: &str) {
        self.by_home
            .entry(home)
            .or_default()
            .insert(uid.to_string());
    }

    /// `uid` was named in its home before it was decided, and holds nothing outside it now:
    /// its name goes whatever its status says.
    pub(super) fn needless(&mut self, uid: &str) {
        self.needless.insert(uid.to_string());
    }

    /// The marks of `items` that `sharded` carries already (a batch stopped before unmarking).
    pub(super) fn add_found(&mut self, sharded: &PoolRecord, items: &[BatchItem]) {
        for item in items {
            for &home in &item.known {
                if sharded.places_elsewhere(home, &item.uid) {
                    self.add(home, &item.uid);
                }
            }
        }
    }
}

impl Allocator {
    /// Stop naming, in each home shard of `marks`, the owners whose status now names their
    /// shards (`written`: by UID), and those named in vain. A shard written meanwhile is read again; one that keeps
    /// failing keeps its names, which the next batch or `repair` removes.
    pub(super) async fn unmark(
        &self,
        pool: &PoolSnapshot,
        marks: Marks,
        written: &BTreeSet<String>,
        label: &str,
    ) {
        let work: Vec<(ShardKey, BTreeSet<String>)> = marks
            .by_home
            .into_iter()
            .map(|(home, uids)| {
                let gone = |uid: &&String| written.contains(*uid) || marks.needless.contains(*uid);
                (home, uids.iter().filter(gone).cloned().collect())
            })
            .filter(|(_, uids): &(ShardKey, BTreeSet<String>)| !uids.is_empty())
            .collect();
        if work.is_empty() {
            return;
        }
        let store = ShardStore::new(self.client.clone());
        let left = stream::iter(work)
            .map(|(home, uids)| {
                let store = &store;
                async move { self.unmark_one(store, pool, home, &uids).await }
            })
            .buffer_unordered(UNMARKS_AT_ONCE)
            .filter(|done| futures::future::ready(!done))
            .count()
            .await;
        if left > 0 {
            tracing::info!(
                "{label}: {left} home shards still name owners placed elsewhere (written \
                 meanwhile); the next batch or `kubectl portalloc repair` removes the names"
            );
        }
    }

    /// One home shard's unmarking; whether it is done.
    async fn unmark_one(
        &self,
        store: &ShardStore,
        pool: &PoolSnapshot,
        home: ShardKey,
        uids: &BTreeSet<String>,
    ) -> bool {
        let name = crate::ledger::shard_name(&pool.name, home);
        for _ in 0..UNMARK_TRIES {
            let shard: PortPoolShard = match self.shards.get(&name) {
                Some(remembered) => remembered,
                None => match store.get(&name).await {
                    Ok(Some(shard)) => shard,
                    Ok(None) => return true,
                    Err(_) => return false,
                },
            };
            let Some(write) = unmarking_write(pool, shard, uids) else {
                return true;
            };
            match store.commit(pool, &write).await {
                Ok(written) => {
                    self.shards.remember(&name, &written);
                    return true;
                }
                Err(_) => self.shards.forget(&name),
            }
        }
        false
    }
}

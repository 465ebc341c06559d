//! The check before `create` makes a new PortAllocation: would its sync be refused? Decided as
//! the sync decides it, with nothing written, so a create that would be refused is never made.
//!
//! Requests: with the pool's spec and the owner's home shard remembered, none but what the
//! remembered copy needs; with nothing remembered, one LIST of the pool's first shards, which
//! carry the pool's spec. For a pool of few windows that LIST is the whole record, and the
//! allocation after the create decides against it without reading again (`ListingCache`), so
//! a new object costs the LIST, its create, one write per shard it lands in and its status.

use kube::ResourceExt;

use super::allocator::{AllocateError, Allocator, Where};
use super::commit::{Request, pool_spec, pool_spec_empty};
use crate::api::{PortAllocation, PortPoolShard};
use crate::k8s::record::ShardStore;
use crate::k8s::retry::Attempts;
use crate::ledger::{
    BatchItem, ItemOutcome, Operation, PoolRecord, PoolSnapshot, Refusal, ShardKey, decide,
    home_shard, known_shards, load_shard, newest_snapshot, owner_of, place, shard_name,
};

/// Shards the first LIST asks for: a pool of up to this many windows (4,096 ports) is read
/// whole in one request, a larger one yields its spec.
const FIRST_SHARDS: u32 = 16;

impl Allocator {
    /// Whether `pa` can be allocated as its spec now says. Against its home shard (remembered,
    /// so the sync after the create reads nothing more); against the whole pool when one shard
    /// cannot decide it, or with `whole` (an existing object's new spec, whose entries may be
    /// anywhere).
    pub(super) async fn precheck(
        &self,
        pa: &PortAllocation,
        whole: bool,
    ) -> Result<(), AllocateError> {
        let operation = Operation::sync_of(pa)?;
        let (uid, owner) = (pa.uid().unwrap_or_default(), owner_of(pa));
        let request = Request {
            pool: &pa.spec.pool,
            uid: &uid,
            owner: &owner,
            operation: &operation,
            without_object: Where::Anywhere,
        };
        let store = ShardStore::new(self.client.clone());
        let mut attempts = Attempts::new(self.policy);
        let item = |record: &PoolRecord| BatchItem {
            known: known_shards(pa.status.as_ref(), &record.layout, &owner),
            uid: uid.clone(),
            owner: owner.clone(),
            operation: Ok(operation.clone()),
        };
        loop {
            if !whole && self.pools.get(request.pool).is_none() {
                // Nothing remembered of the pool: its first shards say what it is.
                match store.list_first(request.pool, FIRST_SHARDS).await {
                    Ok((shards, complete)) => {
                        if let Some(record) = self.listed(&request, shards, complete) {
                            let record = record.map_err(|error| pool_spec(&request, error))?;
                            return match place(&record, &item(&record), &mut rand::rng()).outcome {
                                ItemOutcome::Refused { refusal, .. } => Err(refusal.into()),
                                _ => Ok(()),
                            };
                        }
                    }
                    Err((e, target)) => {
                        self.retry(&request, &mut attempts, e, target).await?;
                        continue;
                    }
                }
            }
            if !whole {
                let Some(copy) = self
                    .pool_snapshot(&request, &mut attempts, false)
                    .await
                    .map_err(|f| f.error)?
                else {
                    continue;
                };
                let layout = copy.layout().map_err(|error| pool_spec(&request, error))?;
                let Some(home) = home_shard(&layout, &owner) else {
                    return Err(pool_spec_empty(&request));
                };
                let name = shard_name(request.pool, ShardKey::first(home));
                let Some((shard, from_memory)) =
                    self.shard_copy(&request, &mut attempts, &name).await?
                else {
                    continue;
                };
                if let Some(shard) = shard.filter(|s| s.spec.pool_uid == copy.uid) {
                    let copy = PoolSnapshot::of_shard(&shard)
                        .map_or(copy.clone(), |c| c.newest(Some(copy)));
                    let record = load_shard(&copy, &layout, home, shard.clone());
                    match decide(&record, &uid, &owner, &operation, &mut rand::rng()) {
                        Ok(_) => {
                            self.shards.remember(&name, &shard);
                            return Ok(());
                        }
                        // A remembered copy may be stale: refuse only on a fresh read.
                        Err(_) if from_memory => {
                            self.shards.forget(&name);
                            continue;
                        }
                        // No room there, or a port of another window: the whole pool decides;
                        // with reuse, a held requested port may be free in another copy.
                        Err(Refusal::Core { .. }) => {}
                        Err(Refusal::PortHeld { .. }) if copy.spec.reuse() > 1 => {}
                        Err(refusal) => return Err(refusal.into()),
                    }
                }
            }
            let Some(copy) = self
                .pool_snapshot(&request, &mut attempts, true)
                .await
                .map_err(|f| f.error)?
            else {
                continue;
            };
            let shards = match store.list(request.pool).await {
                Ok(shards) => shards,
                Err((e, target)) => {
                    self.retry(&request, &mut attempts, e, target).await?;
                    continue;
                }
            };
            self.listings
                .keep(request.pool, (copy.clone(), shards.clone()));
            let record =
                PoolRecord::load(copy, shards).map_err(|error| pool_spec(&request, error))?;
            return match place(&record, &item(&record), &mut rand::rng()).outcome {
                ItemOutcome::Refused { refusal, .. } => Err(refusal.into()),
                _ => Ok(()),
            };
        }
    }

    /// What the first shards of a pool tell: `None` when they do not say what the pool is
    /// (none listed, none written yet, or shards of an earlier pool object among them: the pool
    /// itself is read then). The spec they carry is remembered; when the LIST was the whole
    /// pool, the record, which is also kept for the allocation that follows.
    fn listed(
        &self,
        request: &Request<'_>,
        shards: Vec<PortPoolShard>,
        complete: bool,
    ) -> Option<Result<PoolRecord, crate::api::SpecError>> {
        let first = shards.iter().find_map(PoolSnapshot::of_shard)?;
        if shards.iter().any(|s| s.spec.pool_uid != first.uid) {
            return None;
        }
        let snapshot = newest_snapshot(first, &shards);
        self.pools.remember(request.pool, &snapshot);
        if !complete {
            return None;
        }
        for shard in &shards {
            self.shards.remember(&shard.name_any(), shard);
        }
        self.listings
            .keep(request.pool, (snapshot.clone(), shards.clone()));
        Some(PoolRecord::load(snapshot, shards))
    }
}

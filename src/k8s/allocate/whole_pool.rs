//! The whole-pool path of one owner's commit (docs/record-at-scale.md): taken when its one
//! known shard cannot decide it. The pool and every shard are read in one LIST, the owner is
//! placed there ([`crate::ledger::place`]), its status is widened to name every shard the
//! writes reach, and only then are the shards written, in ascending order: a client killed
//! between two shard writes leaves parts that the next sync finds, keeps and completes.

use std::collections::BTreeSet;

use kube::ResourceExt;
use kube::api::Api;

use super::allocator::{AllocateError, Allocator, Committed, Failed, Where};
use super::commit::{Request, RoundEnd, blocked_shard, pool_spec};
use crate::api::PortAllocation;
use crate::k8s::error::KubeError;
use crate::k8s::record::{Listing, ShardStore};
use crate::k8s::resources::{ALLOCATION_STATUS, ALLOCATIONS};
use crate::k8s::retry::Attempts;
use crate::ledger::{
    BatchItem, ItemOutcome, PoolRecord, ShardKey, ShardWrite, known_shards, place,
};

impl Allocator {
    /// Read the pool and every shard, decide where the owner goes, widen its known shards if
    /// needed, and write the shards in ascending order.
    pub(super) async fn whole_pool(
        &self,
        request: &Request<'_>,
        pa: Option<&mut PortAllocation>,
        attempts: &mut Attempts,
        listed: Option<Listing>,
    ) -> Result<RoundEnd, Failed> {
        let listing = match listed {
            Some(listing) => listing,
            None => match self.list_pool(request, attempts).await? {
                Some(listing) => listing,
                None => return Ok(RoundEnd::Again),
            },
        };
        let (copy, shards) = listing;
        let sharded = PoolRecord::load(copy, shards).map_err(|error| pool_spec(request, error))?;
        let item = whole_pool_item(request, pa.as_deref(), &sharded);
        let placed = place(&sharded, &item, &mut rand::rng());
        let (holdings, allocated, released) = match placed.outcome {
            ItemOutcome::Refused { refusal, holdings } => {
                // A refusal writes only the drop of what a race left in another copy.
                if !placed.writes.is_empty()
                    && !self
                        .write_placed(request, pa, attempts, &sharded, &placed.writes, None)
                        .await?
                {
                    return Ok(RoundEnd::Again);
                }
                return Err(Failed {
                    error: refusal.into(),
                    holdings: Some(holdings),
                });
            }
            ItemOutcome::Unchanged(holdings) => {
                return Ok(RoundEnd::Done(Committed {
                    holdings,
                    pool_uid: sharded.pool.uid.clone(),
                    allocated: 0,
                    released: 0,
                    written: false,
                    shards: placed.shards,
                    copies: placed.copies,
                }));
            }
            ItemOutcome::Changed {
                holdings,
                allocated,
                released,
            } => (holdings, allocated, released),
        };
        if !self
            .write_placed(
                request,
                pa,
                attempts,
                &sharded,
                &placed.writes,
                placed.widen.as_ref(),
            )
            .await?
        {
            return Ok(RoundEnd::Again);
        }
        tracing::info!(
            "{} in pool {:?}: {allocated} ports allocated, {released} released, {} held in {} \
             shards (attempt {}, {} conflicts)",
            request.owner,
            request.pool,
            holdings.port_count(),
            placed.shards.len(),
            attempts.attempts,
            attempts.conflicts
        );
        Ok(RoundEnd::Done(Committed {
            holdings,
            pool_uid: sharded.pool.uid.clone(),
            allocated,
            released,
            written: true,
            shards: placed.shards,
            copies: placed.copies,
        }))
    }

    /// The pool's spec, read now, and every shard of it in one LIST. `None`: a read failed and
    /// was waited for; go round again.
    async fn list_pool(
        &self,
        request: &Request<'_>,
        attempts: &mut Attempts,
    ) -> Result<Option<Listing>, Failed> {
        let Some(copy) = self.pool_snapshot(request, attempts, true).await? else {
            return Ok(None);
        };
        match ShardStore::new(self.client.clone())
            .list(request.pool)
            .await
        {
            Ok(shards) => Ok(Some((copy, shards))),
            Err((e, target)) => {
                self.retry(request, attempts, e, target).await?;
                Ok(None)
            }
        }
    }

    /// Widen the owner's known shards if the writes need it, then write the shards in order,
    /// each a compare-and-swap on the version listed. `false`: a write failed and was waited
    /// for, or the PortAllocation changed; go round again (the next round decides from a new
    /// LIST).
    async fn write_placed(
        &self,
        request: &Request<'_>,
        pa: Option<&mut PortAllocation>,
        attempts: &mut Attempts,
        sharded: &PoolRecord,
        writes: &[ShardWrite],
        widen: Option<&BTreeSet<ShardKey>>,
    ) -> Result<bool, Failed> {
        if let Some((shard, reason)) = blocked_shard(sharded, writes) {
            return Err(AllocateError::BlockedShard {
                owner: request.owner.into(),
                pool: request.pool.into(),
                shard,
                reason,
            }
            .into());
        }
        if let (Some(widened), Some(pa)) = (widen, pa)
            && !self
                .widen_known_shards(pa, widened, attempts, request)
                .await?
        {
            return Ok(false);
        }
        let store = ShardStore::new(self.client.clone());
        for write in writes {
            match store.commit(&sharded.pool, write).await {
                Ok(written) => self.shards.remember(&write.name, &written),
                Err((e, target)) => {
                    self.shards.forget(&write.name);
                    self.retry(request, attempts, e, target).await?;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Write `status.shards = widened` before any entry outside the known shards. `false`: the
    /// PortAllocation changed meanwhile (re-read into `pa`); go round again.
    async fn widen_known_shards(
        &self,
        pa: &mut PortAllocation,
        widened: &BTreeSet<ShardKey>,
        attempts: &mut Attempts,
        request: &Request<'_>,
    ) -> Result<bool, Failed> {
        let namespace = pa.namespace().unwrap_or_default();
        let name = pa.name_any();
        let api: Api<PortAllocation> = Api::namespaced(self.client.clone(), &namespace);
        let mut updated = pa.clone();
        let mut status = updated.status.take().unwrap_or_default();
        status.shards = crate::ledger::status_shards(widened);
        updated.status = Some(status);
        match api
            .replace_status(&name, &crate::k8s::client::write_params(), &updated)
            .await
        {
            Ok(written) => {
                *pa = written;
                Ok(true)
            }
            Err(e) => {
                let target = ALLOCATION_STATUS.on("update", &name, Some(&namespace));
                self.retry(request, attempts, e, target).await?;
                *pa = api.get(&name).await.map_err(|e| {
                    KubeError::from_kube(e, ALLOCATIONS.on("get", &name, Some(&namespace)))
                })?;
                Ok(false)
            }
        }
    }
}

/// The owner as the whole pool decides it. Its known shards come from its status; without a
/// PortAllocation, from what the caller knows, or else from the entries themselves.
fn whole_pool_item(
    request: &Request<'_>,
    pa: Option<&PortAllocation>,
    sharded: &PoolRecord,
) -> BatchItem {
    let status = pa.and_then(|pa| pa.status.as_ref());
    let known = match (pa, &request.without_object) {
        (None, Where::Listed(listed)) => listed.clone(),
        (None, Where::Anywhere) => sharded.shards_of(request.uid),
        _ => known_shards(status, &sharded.layout, request.owner),
    };
    BatchItem {
        uid: request.uid.into(),
        owner: request.owner.into(),
        operation: Ok(request.operation.clone()),
        known,
    }
}

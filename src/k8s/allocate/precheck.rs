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

/// How one way of checking ended.
enum Checked {
    /// Allocated as the spec says, it would not be refused.
    Allowed,
    /// Go round again: a read failed and was waited for, or a remembered copy went stale.
    Again,
    /// This way cannot tell; the next one decides.
    Undecided,
}

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
        let mut attempts = Attempts::new(self.policy);
        loop {
            if !whole && self.pools.get(request.pool).is_none() {
                // Nothing remembered of the pool: its first shards say what it is.
                match self.check_first_shards(pa, &request, &mut attempts).await? {
                    Checked::Allowed => return Ok(()),
                    Checked::Again => continue,
                    Checked::Undecided => {}
                }
            }
            if !whole {
                match self.check_home_shard(&request, &mut attempts).await? {
                    Checked::Allowed => return Ok(()),
                    Checked::Again => continue,
                    Checked::Undecided => {}
                }
            }
            match self.check_whole_pool(pa, &request, &mut attempts).await? {
                Checked::Allowed => return Ok(()),
                Checked::Again | Checked::Undecided => continue,
            }
        }
    }

    /// Against the pool's first shards, in one LIST, when they are the whole pool.
    async fn check_first_shards(
        &self,
        pa: &PortAllocation,
        request: &Request<'_>,
        attempts: &mut Attempts,
    ) -> Result<Checked, AllocateError> {
        let store = ShardStore::new(self.client.clone());
        match store.list_first(request.pool, FIRST_SHARDS).await {
            Ok((shards, complete)) => match self.listed(request, shards, complete) {
                Some(record) => {
                    let record = record.map_err(|error| pool_spec(request, error))?;
                    placed(pa, request, &record)
                }
                None => Ok(Checked::Undecided),
            },
            Err((e, target)) => {
                self.retry(request, attempts, e, target).await?;
                Ok(Checked::Again)
            }
        }
    }

    /// Against the owner's home shard, as the sync after the create decides first. It cannot
    /// tell when the shard does not exist yet, belongs to an earlier pool object, or has no
    /// room (or, with reuse, holds a requested port another copy may have free).
    async fn check_home_shard(
        &self,
        request: &Request<'_>,
        attempts: &mut Attempts,
    ) -> Result<Checked, AllocateError> {
        let Some(copy) = self
            .pool_snapshot(request, attempts, false)
            .await
            .map_err(|f| f.error)?
        else {
            return Ok(Checked::Again);
        };
        let layout = copy.layout().map_err(|error| pool_spec(request, error))?;
        let Some(home) = home_shard(&layout, request.owner) else {
            return Err(pool_spec_empty(request));
        };
        let name = shard_name(request.pool, ShardKey::first(home));
        let Some((shard, from_memory)) = self.shard_copy(request, attempts, &name).await? else {
            return Ok(Checked::Again);
        };
        let Some(shard) = shard.filter(|s| s.spec.pool_uid == copy.uid) else {
            return Ok(Checked::Undecided);
        };
        let copy = PoolSnapshot::of_shard(&shard).map_or(copy.clone(), |c| c.newest(Some(copy)));
        let record = load_shard(&copy, &layout, home, shard.clone());
        let decision = decide(
            &record,
            request.uid,
            request.owner,
            request.operation,
            &mut rand::rng(),
        );
        match decision {
            Ok(_) => {
                self.shards.remember(&name, &shard);
                Ok(Checked::Allowed)
            }
            // A remembered copy may be stale: refuse only on a fresh read.
            Err(_) if from_memory => {
                self.shards.forget(&name);
                Ok(Checked::Again)
            }
            // No room there, or a port of another window: the whole pool decides;
            // with reuse, a held requested port may be free in another copy.
            Err(Refusal::Core { .. }) => Ok(Checked::Undecided),
            Err(Refusal::PortHeld { .. }) if copy.spec.may_reuse() => Ok(Checked::Undecided),
            Err(refusal) => Err(refusal.into()),
        }
    }

    /// Against the pool and every shard, read now; the listing is kept for the allocation
    /// that follows the create.
    async fn check_whole_pool(
        &self,
        pa: &PortAllocation,
        request: &Request<'_>,
        attempts: &mut Attempts,
    ) -> Result<Checked, AllocateError> {
        let Some(copy) = self
            .pool_snapshot(request, attempts, true)
            .await
            .map_err(|f| f.error)?
        else {
            return Ok(Checked::Again);
        };
        let shards = match ShardStore::new(self.client.clone())
            .list(request.pool)
            .await
        {
            Ok(shards) => shards,
            Err((e, target)) => {
                self.retry(request, attempts, e, target).await?;
                return Ok(Checked::Again);
            }
        };
        self.listings
            .keep(request.pool, (copy.clone(), shards.clone()));
        let record = PoolRecord::load(copy, shards).map_err(|error| pool_spec(request, error))?;
        placed(pa, request, &record)
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

/// Whether `record` takes the owner wherever it fits, as its sync would place it.
fn placed(
    pa: &PortAllocation,
    request: &Request<'_>,
    record: &PoolRecord,
) -> Result<Checked, AllocateError> {
    let item = BatchItem {
        known: known_shards(pa.status.as_ref(), &record.layout, request.owner),
        uid: request.uid.to_string(),
        owner: request.owner.to_string(),
        operation: Ok(request.operation.clone()),
    };
    match place(record, &item, &mut rand::rng()).outcome {
        ItemOutcome::Refused { refusal, .. } => Err(refusal.into()),
        _ => Ok(Checked::Allowed),
    }
}

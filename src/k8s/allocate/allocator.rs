//! The [`Allocator`]: the client, its retry policy and its remembered copies of shards and pools,
//! shared by the paths that allocate with it — one PortAllocation at a time (`sync.rs`), its
//! compare-and-swap loop over a pool's shards (`commit.rs`) and many at once (`batch.rs`) — and
//! the errors they end with.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::Api;
use kube::{Client, ResourceExt};

use super::watched::WatchedAllocations;
use crate::api::{PortAllocation, PortAllocationStatus};
use crate::core::{Holdings, SlotKey};
use crate::k8s::error::{KubeError, Target};
use crate::k8s::record::{ListingCache, PoolCache, ShardCache, read_pool};
use crate::k8s::resources::POOLS;
use crate::k8s::retry::{Attempts, Exhausted, RetryPolicy, Stop};
use crate::ledger::{PoolSnapshot, Refusal, ShardKey};

/// Why an allocation did not happen. Nothing is half-done in any of these cases: each shard
/// write is all-or-nothing, and an owner spanning shards completes on its next sync.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// A lasting refusal, recorded on the PortAllocation: the same command fails the same way
    /// until someone changes the spec or the pool.
    #[error(transparent)]
    Refused(#[from] Refusal),

    #[error(
        "PortAllocation {owner}: gave up after {attempts} attempts in {elapsed_ms} ms ({conflicts} conflicts on \
         the shards of PortPool {pool:?}; last: {last}). Nothing was half-allocated: it is safe to run the command again"
    )]
    Exhausted {
        owner: String,
        pool: String,
        attempts: u32,
        elapsed_ms: u128,
        conflicts: u32,
        last: String,
    },

    #[error(
        "PortAllocation {owner}: PortPoolShard {shard} holds the name a shard of PortPool {pool:?} \
         needs, but is not part of its record ({reason}): run `kubectl portalloc repair --pool \
         {pool} --apply`, which gives an earlier pool's holders their ports back in this one and \
         removes such shards, then run this again"
    )]
    BlockedShard {
        owner: String,
        pool: String,
        shard: String,
        reason: String,
    },

    #[error(transparent)]
    Kube(#[from] KubeError),
}

impl AllocateError {
    /// The lasting refusal, if this is one (transport trouble and conflicts are not).
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            AllocateError::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }
}

/// An error, and what the owner held in the record it was decided against, when one was read:
/// the status of a refused sync must not go on claiming ports the shards no longer give it.
pub(super) struct Failed {
    pub(super) error: AllocateError,
    pub(super) holdings: Option<Holdings>,
}

impl<E: Into<AllocateError>> From<E> for Failed {
    fn from(error: E) -> Failed {
        Failed {
            error: error.into(),
            holdings: None,
        }
    }
}

/// What the shard step committed.
pub(super) struct Committed {
    pub(super) holdings: Holdings,
    pub(super) pool_uid: String,
    pub(super) allocated: usize,
    pub(super) released: usize,
    pub(super) written: bool,
    /// The shards where the owner's entries now are (`status.shards`).
    pub(super) shards: BTreeSet<ShardKey>,
    /// Where its pods are spread over copies, the copy of each slot (else empty).
    pub(super) copies: BTreeMap<SlotKey, u16>,
}

/// Allocates and releases ports for PortAllocations.
#[derive(Clone)]
pub struct Allocator {
    pub(super) client: Client,
    pub policy: RetryPolicy,
    /// The last copy of each shard read or written, decided against instead of a new read.
    pub(super) shards: ShardCache,
    /// The newest spec of each pool seen, which homes are computed from.
    pub(super) pools: PoolCache,
    /// A pool's shards as `create`'s check just listed them, for the allocation that follows.
    pub(super) listings: ListingCache,
    /// The watcher's PortAllocations, while one runs in this process (for the webhook).
    watched: WatchedAllocations,
}

impl Allocator {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            policy: RetryPolicy::default(),
            shards: ShardCache::default(),
            pools: PoolCache::default(),
            listings: ListingCache::default(),
            watched: WatchedAllocations::default(),
        }
    }

    /// The same, retrying by `policy`.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Keep the copies in `dir` too (one cluster's directory), so the next process starts from
    /// them: a CLI command's first allocation then needs no read of the pool or its shard.
    pub fn cache_dir(mut self, dir: Option<std::path::PathBuf>) -> Self {
        if let Some(dir) = dir {
            self.shards = ShardCache::on_disk(dir.join("shards"));
            self.pools = PoolCache::on_disk(dir.join("pools"));
        }
        self
    }

    /// The remembered shard copies, shared with its clones: the pod webhook checks a pod's
    /// ports against them, and what it reads afresh serves the next allocation too.
    pub fn shard_copies(&self) -> &ShardCache {
        &self.shards
    }

    /// The watcher's cache of PortAllocations, shared with its clones: lent by the watcher,
    /// read by the pod webhook.
    pub fn watched(&self) -> &WatchedAllocations {
        &self.watched
    }

    /// Whether to decide against the shards returned by the last writes (default) or read
    /// every shard before deciding (one more request each; for comparison).
    pub fn remember_shards(mut self, on: bool) -> Self {
        if !on {
            self.shards = ShardCache::disabled();
            self.pools = PoolCache::disabled();
            self.listings = ListingCache::disabled();
        }
        self
    }

    /// The spec of the pool `pa`'s ports were committed to: the copy this allocator keeps (from
    /// its last read or write of the pool's record) when it is of that pool object, else read
    /// now and kept. `None`: no such pool. The pod webhook asks this at every hostNetwork pod's
    /// admission (the protocol its ports are declared in), so the copy saves a read per pod.
    pub async fn pool_of(&self, pa: &PortAllocation) -> Result<Option<PoolSnapshot>, KubeError> {
        let pool = pa.spec.pool.as_str();
        let uid = pa.status.as_ref().and_then(|s| s.pool_uid.as_deref());
        if let Some(copy) = self.pools.get(pool)
            && uid.is_none_or(|uid| uid == copy.uid)
        {
            return Ok(Some(copy));
        }
        match read_pool(&self.client, pool).await {
            Ok(Some(object)) => {
                let copy = PoolSnapshot::of_pool(&object);
                self.pools.remember(pool, &copy);
                Ok(Some(copy))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(KubeError::from_kube(e, POOLS.on("get", pool, None))),
        }
    }

    /// Wait before the next round, or end the loop with the error the caller reports.
    pub(super) async fn backoff(
        &self,
        attempts: &mut Attempts,
        err: kube::Error,
        target: Target,
        label: &str,
        pool: &str,
        owner: &str,
    ) -> Result<(), AllocateError> {
        attempts
            .backoff(err, target, label)
            .await
            .map_err(|stop| match stop {
                Stop::Final(e) => AllocateError::Kube(e),
                Stop::Exhausted(exhausted) => exhausted_error(exhausted, pool, owner),
            })
    }
}

/// The error for a retry budget that ran out.
pub(super) fn exhausted_error(exhausted: Exhausted, pool: &str, owner: &str) -> AllocateError {
    let Exhausted {
        attempts,
        elapsed,
        conflicts,
        last,
    } = exhausted;
    AllocateError::Exhausted {
        owner: owner.into(),
        pool: pool.into(),
        attempts,
        elapsed_ms: elapsed.as_millis(),
        conflicts,
        last: last.to_string(),
    }
}

/// Where an owner's entries may be (docs/record-at-scale.md, "Placement").
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Where {
    /// In the shards its status names (`status.shards`).
    Listed(BTreeSet<ShardKey>),
    /// In its home shard, if anywhere: its status names no shard.
    Home,
    /// Not known (no status to go by): every shard is read.
    Anywhere,
}

impl Where {
    pub(super) fn of(status: Option<&PortAllocationStatus>) -> Where {
        let listed = crate::ledger::listed_shards(status);
        if listed.is_empty() {
            Where::Home
        } else {
            Where::Listed(listed)
        }
    }
}

pub(super) fn allocations(client: &Client, pa: &PortAllocation) -> Api<PortAllocation> {
    Api::namespaced(client.clone(), &pa.namespace().unwrap_or_default())
}

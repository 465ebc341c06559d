//! The compare-and-swap loop of one owner over a pool's shards (docs/record-at-scale.md).
//!
//! Each `PortPoolShard`'s resourceVersion is the lock for its window's ports. An owner whose
//! entries are (or will be) in one shard — the one its status names, else its home shard, a
//! hash of its `namespace/name` — is decided against that shard alone and committed with one
//! write to it: the shard carries a copy of the pool's spec, so no read of the PortPool is
//! needed, and concurrent clients mostly write different objects.
//!
//! Anything else (no room there, a requested port in another window, an owner spanning shards,
//! an entry whose shards are unknown) reads the pool and every shard in one LIST and decides
//! there ([`crate::ledger::place`]). Before any write outside the owner's known shards, its
//! status is widened to name them, so a client killed between two shard writes leaves parts
//! that the next sync finds, keeps and completes. A group commit names such an owner in its
//! home shard's `status.elsewhere` instead (`batch`); an owner known by its home alone that
//! its home names so is decided over the whole pool.

use std::collections::BTreeMap;

use super::allocator::{AllocateError, Allocator, Committed, Failed, Where, exhausted_error};
use crate::api::{PortAllocation, PortPoolShard};
use crate::core::Holdings;
use crate::k8s::error::Target;
use crate::k8s::record::{ShardStore, read_pool};
use crate::k8s::resources::POOLS;
use crate::k8s::retry::Attempts;
use crate::ledger::{
    Decision, Operation, PoolRecord, PoolSnapshot, Refusal, ShardAnomaly, ShardKey, ShardRecord,
    ShardWrite, WindowRecord, decide, home_shard, load_shard, loose_in_window, new_shard,
    shard_name, single_shard, split_by_shard,
};

/// One operation on one pool, as the rounds of its loop share it.
pub(super) struct Request<'a> {
    pub(super) pool: &'a str,
    pub(super) uid: &'a str,
    pub(super) owner: &'a str,
    pub(super) operation: &'a Operation,
    /// Where the entries may be when there is no PortAllocation to read it from (a removal
    /// after the object is gone).
    pub(super) without_object: Where,
}

/// How one read-decide-write round of a commit ended: committed, or what to read next.
pub(super) enum RoundEnd {
    Done(Committed),
    /// Read again (a conflict, already counted, or a remembered copy that could not decide).
    Again,
    /// One shard alone cannot decide this: read every shard.
    WholePool,
}

impl Allocator {
    /// Commit `request` into its pool's shards. `pa` is the PortAllocation when there is one
    /// (not for [`Operation::Remove`]); its status may be widened here.
    pub(super) async fn commit(
        &self,
        request: &Request<'_>,
        mut pa: Option<&mut PortAllocation>,
        attempts: &mut Attempts,
    ) -> Result<Committed, Failed> {
        loop {
            // Listed a moment ago by the check before a create: decided on without a read.
            if let Some(listing) = self.listings.take(request.pool) {
                match self
                    .whole_pool(request, pa.as_deref_mut(), attempts, Some(listing))
                    .await?
                {
                    RoundEnd::Done(committed) => return Ok(committed),
                    RoundEnd::Again | RoundEnd::WholePool => continue,
                }
            }
            let known = match pa.as_deref() {
                Some(pa) => Where::of(pa.status.as_ref()),
                None => request.without_object.clone(),
            };
            let home = matches!(known, Where::Home);
            let one = match known {
                Where::Listed(listed) => single_shard(&listed, request.operation),
                Where::Home => match self.pool_snapshot(request, attempts, false).await? {
                    Some(copy) => {
                        let layout = copy.layout().map_err(|error| pool_spec(request, error))?;
                        home_shard(&layout, request.owner)
                            .map(ShardKey::first)
                            .filter(|&home| {
                                single_shard(&[home].into(), request.operation).is_some()
                            })
                    }
                    None => continue,
                },
                Where::Anywhere => None,
            };
            if let Some(key) = one {
                match self.one_shard(request, key, home, attempts).await? {
                    RoundEnd::Done(committed) => return Ok(committed),
                    RoundEnd::Again => continue,
                    RoundEnd::WholePool => {}
                }
            }
            match self
                .whole_pool(request, pa.as_deref_mut(), attempts, None)
                .await?
            {
                RoundEnd::Done(committed) => return Ok(committed),
                RoundEnd::Again | RoundEnd::WholePool => continue,
            }
        }
    }

    /// The newest spec of the pool: remembered (unless `fresh`), else read. `None`: a read
    /// failed and was waited for; go round again.
    pub(super) async fn pool_snapshot(
        &self,
        request: &Request<'_>,
        attempts: &mut Attempts,
        fresh: bool,
    ) -> Result<Option<PoolSnapshot>, Failed> {
        if !fresh && let Some(copy) = self.pools.get(request.pool) {
            return Ok(Some(copy));
        }
        match read_pool(&self.client, request.pool).await {
            Ok(Some(pool)) => {
                let mut copy = PoolSnapshot::of_pool(&pool);
                crate::k8s::nodes::count_if_unknown(&self.client, &mut copy).await;
                self.pools.remember(request.pool, &copy);
                Ok(Some(copy))
            }
            Ok(None) => Err(Refusal::PoolNotFound {
                pool: request.pool.into(),
                owner: request.owner.into(),
            }
            .into()),
            Err(e) => {
                let target = POOLS.on("get", request.pool, None);
                self.retry(request, attempts, e, target).await?;
                Ok(None)
            }
        }
    }

    /// Shard `name` (`None` inside: it does not exist), and whether it is a remembered copy
    /// rather than a read made now. A fresh read is the current object and is remembered, so
    /// the next decision may start from it. `None`: the read failed and was waited for; go round
    /// again.
    pub(super) async fn shard_copy(
        &self,
        request: &Request<'_>,
        attempts: &mut Attempts,
        name: &str,
    ) -> Result<Option<(Option<PortPoolShard>, bool)>, AllocateError> {
        let remembered = self.shards.get(name);
        if let Some(shard) = &remembered
            && self.shards.trusted()
        {
            return Ok(Some((Some(shard.clone()), true)));
        }
        match ShardStore::new(self.client.clone()).get(name).await {
            Ok(shard) => {
                if let Some(shard) = &shard {
                    if let Some(old) = &remembered {
                        let version = |s: &PortPoolShard| s.metadata.resource_version.clone();
                        self.shards.observe(version(old) == version(shard));
                    }
                    self.shards.remember(name, shard);
                }
                Ok(Some((shard, false)))
            }
            Err((e, target)) => {
                self.retry(request, attempts, e, target).await?;
                Ok(None)
            }
        }
    }

    /// Decide against one shard (a remembered copy when there is one) and write it. `home`:
    /// the shard is the owner's home, known as such because its status names no shards.
    async fn one_shard(
        &self,
        request: &Request<'_>,
        key: ShardKey,
        home: bool,
        attempts: &mut Attempts,
    ) -> Result<RoundEnd, Failed> {
        let read = match self.read_one_shard(request, key, attempts).await? {
            Ok(read) => read,
            Err(step) => return Ok(step),
        };
        if home && read.record.places_elsewhere(request.uid) {
            // A group commit placed it in other shards and was stopped before its status
            // could say where (or has not said so yet): only the whole pool shows them.
            return Ok(RoundEnd::WholePool);
        }
        let decision = decide(
            &read.record,
            request.uid,
            request.owner,
            request.operation,
            &mut rand::rng(),
        );
        if read.from_memory && !matches!(decision, Ok(Decision::Write { .. })) {
            // Nothing to write, or a refusal: no compare-and-swap would check the copy.
            self.shards.forget(&read.name);
            return Ok(RoundEnd::Again);
        }
        let (holdings, allocated, released) = match decision {
            Err(Refusal::Core { .. }) => return Ok(RoundEnd::WholePool),
            // A block this window would put in a loose run: the whole pool may fit it tighter
            // (the ledger's batches decide the same way).
            Ok(ref decided)
                if !read.copy.spec.may_reuse()
                    && loose_in_window(
                        &read.record,
                        &read.record.holdings_of(request.uid),
                        decided,
                    ) =>
            {
                return Ok(RoundEnd::WholePool);
            }
            // With reuse, another copy may have the requested port free: the whole pool tells.
            Err(Refusal::PortHeld { .. })
                if read.copy.spec.may_reuse()
                    && read.record.holdings_of(request.uid).is_empty() =>
            {
                return Ok(RoundEnd::WholePool);
            }
            // New ports in a copy past nodeReuse: the whole pool refuses it with the reason.
            // A pool that follows its nodes: whether any copy may take new ports depends on
            // every copy (the highest in use, the largest pod), which only the whole pool shows.
            Ok(Decision::Write { allocated, .. })
                if allocated > 0
                    && (key.copy >= read.copy.spec.reuse()
                        || read.copy.spec.follow_nodes.is_some()) =>
            {
                return Ok(RoundEnd::WholePool);
            }
            Err(refusal) => {
                return Err(Failed {
                    holdings: Some(read.record.holdings_of(request.uid)),
                    error: refusal.into(),
                });
            }
            Ok(Decision::Unchanged(holdings)) => {
                return Ok(RoundEnd::Done(committed(
                    &read.copy, key.copy, holdings, 0, 0, false,
                )));
            }
            Ok(Decision::Write {
                holdings,
                allocated,
                released,
            }) => (holdings, allocated, released),
        };
        self.write_one_shard(request, attempts, read, holdings, allocated, released)
            .await
    }

    /// Shard `key` loaded under the pool's spec it is decided by, or how the round ends
    /// without it.
    async fn read_one_shard(
        &self,
        request: &Request<'_>,
        key: ShardKey,
        attempts: &mut Attempts,
    ) -> Result<Result<ShardRead, RoundEnd>, Failed> {
        let name = shard_name(request.pool, key);
        let Some((shard, from_memory)) = self.shard_copy(request, attempts, &name).await? else {
            return Ok(Err(RoundEnd::Again));
        };
        // The pool's spec: the shard's copy (newer than a remembered one, if any); for a shard
        // not written yet, the pool itself, read now, so no shard is created for a pool that
        // was deleted.
        let carried = shard.as_ref().and_then(PoolSnapshot::of_shard);
        let copy = match carried {
            Some(carried) => carried.newest(self.pools.get(request.pool)),
            None => match self.pool_snapshot(request, attempts, true).await? {
                Some(copy) => copy,
                None => return Ok(Err(RoundEnd::Again)),
            },
        };
        if shard.as_ref().is_some_and(|s| s.spec.pool_uid != copy.uid) {
            // A shard of an earlier pool object of this name, or a copy of the pool from before
            // it was recreated: the whole pool sorts it out.
            self.pools.forget(request.pool);
            self.shards.forget(&name);
            return Ok(Err(RoundEnd::WholePool));
        }
        self.pools.remember(request.pool, &copy);
        let layout = copy.layout().map_err(|error| pool_spec(request, error))?;
        let record = load_shard(
            &copy,
            &layout,
            key.window,
            shard.unwrap_or_else(|| new_shard(&copy, key)),
        );
        Ok(Ok(ShardRead {
            key,
            name,
            from_memory,
            copy,
            record,
        }))
    }

    /// Compare-and-swap the owner's new holdings into the shard read. A conflict on a
    /// remembered copy is read afresh at once rather than waited for: the copy was stale.
    async fn write_one_shard(
        &self,
        request: &Request<'_>,
        attempts: &mut Attempts,
        read: ShardRead,
        holdings: Holdings,
        allocated: usize,
        released: usize,
    ) -> Result<RoundEnd, Failed> {
        let ShardRead {
            key,
            name,
            from_memory,
            copy,
            record,
        } = read;
        let mut changed = ShardRecord::new(key, record);
        changed.set(request.uid, request.owner, &holdings);
        let store = ShardStore::new(self.client.clone());
        match store.commit(&copy, &changed.write(&copy, false)).await {
            Ok(written) => {
                if from_memory {
                    self.shards.observe(true);
                }
                self.shards.remember(&name, &written);
                tracing::info!(
                    "{} in pool {:?}: {allocated} ports allocated, {released} released, {} held \
                     (shard {name}, attempt {}, {} conflicts)",
                    request.owner,
                    request.pool,
                    holdings.port_count(),
                    attempts.attempts,
                    attempts.conflicts
                );
                Ok(RoundEnd::Done(committed(
                    &copy, key.copy, holdings, allocated, released, true,
                )))
            }
            Err((e, target)) => {
                self.shards.forget(&name);
                if from_memory && is_conflict(&e) {
                    // The copy was stale: read afresh at once (see `Attempts::stale_copy`).
                    self.shards.observe(false);
                    attempts
                        .stale_copy()
                        .map_err(|x| exhausted_error(x, request.pool, request.owner))?;
                } else if !(from_memory && is_not_found(&e)) {
                    // A remembered shard deleted since (its pool was): read again, which tells.
                    self.retry(request, attempts, e, target).await?;
                }
                Ok(RoundEnd::Again)
            }
        }
    }

    /// Wait before the next round of `request`'s loop, or end it with the error to report.
    pub(super) async fn retry(
        &self,
        request: &Request<'_>,
        attempts: &mut Attempts,
        e: kube::Error,
        target: Target,
    ) -> Result<(), AllocateError> {
        let label = format!("{} in pool {:?}", request.owner, request.pool);
        self.backoff(attempts, e, target, &label, request.pool, request.owner)
            .await
    }
}

/// One shard as a decision starts from it.
struct ShardRead {
    key: ShardKey,
    name: String,
    /// A remembered copy rather than a read made now: only the write's compare-and-swap
    /// checks it.
    from_memory: bool,
    /// The pool's spec the shard is decided under.
    copy: PoolSnapshot,
    record: WindowRecord,
}

/// A write that would create a shard whose name an object that is not part of the record
/// holds (an earlier pool object's shard, mostly): (its name, why it is not loaded).
pub(super) fn blocked_shard(
    sharded: &PoolRecord,
    writes: &[ShardWrite],
) -> Option<(String, String)> {
    writes
        .iter()
        .filter(|w| w.resource_version.is_none())
        .find_map(|w| {
            sharded.all_anomalies().find_map(|(_, a)| match a {
                ShardAnomaly::NotLoaded { name, reason } if *name == w.name => {
                    Some((name.clone(), reason.clone()))
                }
                _ => None,
            })
        })
}

fn committed(
    copy: &PoolSnapshot,
    in_copy: u16,
    holdings: crate::core::Holdings,
    allocated: usize,
    released: usize,
    written: bool,
) -> Committed {
    Committed {
        shards: split_by_shard(&holdings)
            .into_keys()
            .map(|window| ShardKey::new(in_copy, window))
            .collect(),
        holdings,
        copies: BTreeMap::new(),
        pool_uid: copy.uid.clone(),
        allocated,
        released,
        written,
    }
}

pub(super) fn pool_spec(request: &Request<'_>, error: crate::api::SpecError) -> Refusal {
    Refusal::PoolSpec {
        pool: request.pool.into(),
        error,
    }
}

/// A pool whose spec leaves no port at all has no shard to decide in.
pub(super) fn pool_spec_empty(request: &Request<'_>) -> AllocateError {
    Refusal::PoolSpec {
        pool: request.pool.into(),
        error: crate::api::SpecError {
            field: "spec.ranges".into(),
            message: "the ranges less the exclusions leave no port".into(),
        },
    }
    .into()
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.is_not_found())
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.is_conflict())
}

//! The compare-and-swap loop for a pool whose record is sharded (docs/record-at-scale.md).
//!
//! Each `PortPoolShard`'s resourceVersion is the lock for its window's ports. An owner that
//! lives in one shard (the common case: its home shard, chosen by a hash of its UID) is decided
//! against that shard alone and committed with one write to it, so concurrent clients mostly
//! write different objects, and each write carries at most 256 holders.
//!
//! Anything else (the home shard is full, a requested port lies in another window, the owner
//! already spans shards, or its entry is to be removed) reads every shard of the pool in one
//! LIST and decides there: first each shard alone in home order (so an owner stays in one shard
//! when one has room), else the whole pool as one record, cut back into per-shard writes
//! committed in ascending order. Before any write outside the owner's known shards
//! (`status.shards`), the PortAllocation's status is widened to name them, so a client killed
//! between two shard writes leaves parts that the next sync finds, keeps and completes.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, PostParams};

use super::allocator::{AllocateError, Allocator, Committed};
use super::error::{KubeError, Target};
use super::resources::{ALLOCATION_STATUS, ALLOCATIONS};
use super::retry::Attempts;
use super::shards::ShardStore;
use crate::api::{PortAllocation, PortPool};
use crate::ledger::{
    Decision, Operation, Refusal, ShardLayout, ShardWrite, ShardedRecord, decide, known_shards,
    load_shard, new_shard, shard_name, single_shard, split_by_shard,
};

/// How long a copy of a sharded pool (its spec and UID) is decided against without a new read:
/// no shard write checks the pool's resourceVersion, so a spec edit reaches a client after at
/// most this long, and an allocation meanwhile is as if made just before the edit.
pub const POOL_SPEC_TTL: Duration = Duration::from_secs(2);

/// How a round ended.
enum Step {
    Done(Committed),
    /// Read again (a conflict, already counted, or a remembered copy that could not decide).
    Again,
    /// One shard alone cannot decide this: read every shard.
    WholePool,
}

impl Allocator {
    /// Commit `operation` for `uid` into the sharded `pool`. `pa` is the PortAllocation when
    /// there is one (not for [`Operation::Remove`]); its status may be widened here.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit_to_shards(
        &self,
        pool: PortPool,
        mut pa: Option<&mut PortAllocation>,
        uid: &str,
        owner: &str,
        attempts: &mut Attempts,
        operation: &Operation,
    ) -> Result<Committed, AllocateError> {
        let pool_name = pool.name_any();
        let ports = pool.spec.port_set().map_err(|error| Refusal::PoolSpec {
            pool: pool_name.clone(),
            error,
        })?;
        let round = Round {
            store: ShardStore::new(self.client.clone()),
            layout: ShardLayout::new(&ports, pool.spec.core_static_band()),
            label: format!("{owner} in pool {pool_name:?}"),
            pool,
            uid,
            owner,
            operation,
        };
        loop {
            let known = known_shards(
                pa.as_deref().and_then(|pa| pa.status.as_ref()),
                round.pool.metadata.uid.as_deref(),
                &round.layout,
                uid,
            );
            if let Some(index) = single_shard(&known, operation) {
                match self.one_shard(&round, index, attempts).await? {
                    Step::Done(committed) => return Ok(committed),
                    Step::Again => continue,
                    Step::WholePool => {}
                }
            }
            match self
                .all_shards(&round, &known, pa.as_deref_mut(), attempts)
                .await?
            {
                Step::Done(committed) => return Ok(committed),
                Step::Again | Step::WholePool => continue,
            }
        }
    }

    /// Decide against one shard (a remembered copy when there is one) and write it.
    async fn one_shard(
        &self,
        round: &Round<'_>,
        index: u16,
        attempts: &mut Attempts,
    ) -> Result<Step, AllocateError> {
        let name = shard_name(&round.pool.name_any(), index);
        let remembered = self.shards.get(&name);
        let from_memory = remembered.is_some();
        let shard = match remembered {
            Some(shard) => Some(shard),
            None => match round.store.get(&name).await {
                Ok(shard) => shard,
                Err((e, target)) => {
                    self.retry(round, attempts, e, target).await?;
                    return Ok(Step::Again);
                }
            },
        };
        let shard = shard.unwrap_or_else(|| new_shard(&round.pool, index));
        let record = load_shard(&round.pool, &round.layout, index, shard);
        let decision = decide(
            &record,
            round.uid,
            round.owner,
            round.operation,
            &mut rand::rng(),
        );
        if from_memory && !matches!(decision, Ok(Decision::Write { .. })) {
            // Nothing to write, or a refusal: no compare-and-swap would check the copy.
            self.shards.forget(&name);
            return Ok(Step::Again);
        }
        match decision {
            Err(Refusal::Core { .. }) => Ok(Step::WholePool),
            Err(refusal) => Err(refusal.into()),
            Ok(Decision::Unchanged(holdings)) => {
                Ok(Step::Done(round.committed(holdings, 0, 0, false)))
            }
            Ok(Decision::Write {
                status,
                holdings,
                allocated,
                released,
            }) => {
                let write = ShardWrite::replacing(index, &record, status);
                match round.store.commit(&round.pool, &write).await {
                    Ok(written) => {
                        self.shards.remember(&written);
                        Ok(Step::Done(
                            round.committed(holdings, allocated, released, true),
                        ))
                    }
                    Err((e, target)) => {
                        self.shards.forget(&name);
                        if !(from_memory && is_not_found(&e)) {
                            self.retry(round, attempts, e, target).await?;
                        }
                        Ok(Step::Again)
                    }
                }
            }
        }
    }

    /// Read every shard, decide (one shard in home order if one can take it all, else the whole
    /// pool), widen the owner's known shards if needed, and write the shards in ascending order.
    async fn all_shards(
        &self,
        round: &Round<'_>,
        known: &BTreeSet<u16>,
        pa: Option<&mut PortAllocation>,
        attempts: &mut Attempts,
    ) -> Result<Step, AllocateError> {
        let pool_name = round.pool.name_any();
        let shards = match round.store.list(&pool_name).await {
            Ok(shards) => shards,
            Err((e, target)) => {
                self.retry(round, attempts, e, target).await?;
                return Ok(Step::Again);
            }
        };
        let sharded =
            ShardedRecord::load(round.pool.clone(), shards).map_err(|error| Refusal::PoolSpec {
                pool: pool_name.clone(),
                error,
            })?;
        let present = sharded.shards_of(round.uid);
        let decided = match one_shard_of(&sharded, &present, round)? {
            Some(decided) => decided,
            None => match spanning(&sharded, &present, round)? {
                Decision::Unchanged(holdings) => Decided::Unchanged(holdings),
                Decision::Write {
                    holdings,
                    allocated,
                    released,
                    ..
                } => Decided::Writes {
                    writes: sharded.writes_for(round.uid, round.owner, &holdings),
                    holdings,
                    allocated,
                    released,
                },
            },
        };
        let (writes, holdings, allocated, released) = match decided {
            Decided::Unchanged(holdings) => {
                return Ok(Step::Done(round.committed(holdings, 0, 0, false)));
            }
            Decided::Writes {
                writes,
                holdings,
                allocated,
                released,
            } => (writes, holdings, allocated, released),
        };
        let touched: BTreeSet<u16> = writes.iter().map(|w| w.index).collect();
        if let Some(pa) = pa
            && !touched.is_subset(known)
        {
            let widened: BTreeSet<u16> = known
                .iter()
                .chain(&touched)
                .chain(&present)
                .copied()
                .collect();
            if !self
                .widen_known_shards(pa, &widened, attempts, round)
                .await?
            {
                return Ok(Step::Again);
            }
        }
        for write in &writes {
            match round.store.commit(&round.pool, write).await {
                Ok(written) => self.shards.remember(&written),
                Err((e, target)) => {
                    self.shards.forget(&write.name);
                    self.retry(round, attempts, e, target).await?;
                    return Ok(Step::Again);
                }
            }
        }
        Ok(Step::Done(
            round.committed(holdings, allocated, released, true),
        ))
    }

    /// Write `status.shards = widened` before any entry outside the known shards. `false`: the
    /// PortAllocation changed meanwhile (re-read into `pa`); go round again.
    async fn widen_known_shards(
        &self,
        pa: &mut PortAllocation,
        widened: &BTreeSet<u16>,
        attempts: &mut Attempts,
        round: &Round<'_>,
    ) -> Result<bool, AllocateError> {
        let namespace = pa.namespace().unwrap_or_default();
        let name = pa.name_any();
        let api: Api<PortAllocation> = Api::namespaced(self.client.clone(), &namespace);
        let mut updated = pa.clone();
        let mut status = updated.status.take().unwrap_or_default();
        status.shards = widened.iter().map(|&k| i32::from(k)).collect();
        updated.status = Some(status);
        match api
            .replace_status(&name, &PostParams::default(), &updated)
            .await
        {
            Ok(written) => {
                *pa = written;
                Ok(true)
            }
            Err(e) => {
                let target = ALLOCATION_STATUS.on("update", &name, Some(&namespace));
                self.retry(round, attempts, e, target).await?;
                *pa = api.get(&name).await.map_err(|e| {
                    KubeError::from_kube(e, ALLOCATIONS.on("get", &name, Some(&namespace)))
                })?;
                Ok(false)
            }
        }
    }
}

impl Allocator {
    /// Wait before the next round of `round`'s loop, or end it with the error to report.
    async fn retry(
        &self,
        round: &Round<'_>,
        attempts: &mut Attempts,
        e: kube::Error,
        target: Target,
    ) -> Result<(), AllocateError> {
        let pool = round.pool.name_any();
        self.backoff(attempts, e, target, &round.label, &pool, round.owner)
            .await
    }
}

/// One operation on one sharded pool, as the rounds of its loop share it.
struct Round<'a> {
    store: ShardStore,
    layout: ShardLayout,
    label: String,
    pool: PortPool,
    uid: &'a str,
    owner: &'a str,
    operation: &'a Operation,
}

impl Round<'_> {
    fn committed(
        &self,
        holdings: crate::core::Holdings,
        allocated: usize,
        released: usize,
        written: bool,
    ) -> Committed {
        let shards = split_by_shard(&holdings)
            .into_keys()
            .map(i32::from)
            .collect();
        Committed {
            holdings,
            pool_uid: self.pool.metadata.uid.clone(),
            allocated,
            released,
            written,
            shards: Some(shards),
        }
    }
}

/// What the whole-pool read decided.
enum Decided {
    Unchanged(crate::core::Holdings),
    Writes {
        writes: Vec<ShardWrite>,
        holdings: crate::core::Holdings,
        allocated: usize,
        released: usize,
    },
}

/// An owner in at most one shard, decided there alone: its own shard, or the first shard in
/// its home order that takes it. `None` when no single shard can (the whole pool decides).
fn one_shard_of(
    sharded: &ShardedRecord,
    present: &[u16],
    round: &Round<'_>,
) -> Result<Option<Decided>, Refusal> {
    if present.len() > 1 || matches!(round.operation, Operation::Remove) {
        return Ok(None);
    }
    let candidates = match present {
        [only] => vec![*only],
        _ => round.layout.home_order(round.uid),
    };
    for index in candidates {
        let record = sharded.shard_record(index);
        match decide(
            &record,
            round.uid,
            round.owner,
            round.operation,
            &mut rand::rng(),
        ) {
            Ok(Decision::Unchanged(holdings)) => return Ok(Some(Decided::Unchanged(holdings))),
            Ok(Decision::Write {
                status,
                holdings,
                allocated,
                released,
            }) => {
                let write = ShardWrite::replacing(index, &record, status);
                return Ok(Some(Decided::Writes {
                    writes: vec![write],
                    holdings,
                    allocated,
                    released,
                }));
            }
            Err(Refusal::Core { .. }) => continue,
            Err(refusal) => return Err(refusal),
        }
    }
    Ok(None)
}

/// The decision for an owner no single shard can serve, on as few shards as it fits: its own
/// shards plus the first 2, 4, 8, ... of its home order, then the whole pool (whose refusal,
/// if any, is the answer). Each try is one decision in memory; nothing is read again.
fn spanning(
    sharded: &ShardedRecord,
    present: &[u16],
    round: &Round<'_>,
) -> Result<Decision, Refusal> {
    let order = round.layout.home_order(round.uid);
    let mut take = 2;
    while take < order.len() {
        let windows: BTreeSet<u16> = present
            .iter()
            .chain(order.iter().take(take))
            .copied()
            .collect();
        let record = sharded.union_record_of(&windows);
        match decide(
            &record,
            round.uid,
            round.owner,
            round.operation,
            &mut rand::rng(),
        ) {
            Err(Refusal::Core { .. }) => take *= 2,
            other => return other,
        }
    }
    decide(
        &sharded.union_record(),
        round.uid,
        round.owner,
        round.operation,
        &mut rand::rng(),
    )
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.is_not_found())
}

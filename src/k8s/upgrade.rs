//! Upgrading a pool in place from the one-object record to PortPoolShards
//! (docs/record-at-scale.md, section 4), and writing the empty shards of a pool created sharded.
//!
//! 1. Freeze: a CAS on the pool's status sets `format: Migrating`, holders unchanged. From then
//!    on the CRD's transition rule refuses any write that changes `holders`.
//! 2. Copy: every shard of [`upgrade_plan`] is created when missing and its status overwritten
//!    with the planned one, by a CAS per shard. The plan is a pure function of the frozen pool,
//!    so two upgraders racing write the same content.
//! 3. Flip: a CAS on the pool with the resourceVersion read before the copy sets
//!    `format: Sharded` and empties `holders` (the counts stay as they were). A pool changed
//!    meanwhile (its spec edited) fails the CAS, and the copy runs again against what it is now.
//!
//! A crash leaves `Migrating`; the next run resumes at step 2. A `Sharded` pool is left alone.

use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use super::error::{KubeError, Target};
use super::pools::get_pool;
use super::resources::POOL_STATUS;
use super::retry::{Attempts, Exhausted, RetryPolicy, Stop};
use super::shards::ShardStore;
use crate::api::{PortPool, PortPoolShard, RecordFormat, SpecError};
use crate::ledger::{ShardWrite, UpgradedShard, upgrade_plan};

/// Why a pool could not be upgraded (or its shards written).
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("PortPool {pool:?}: {error}")]
    Invalid { pool: String, error: SpecError },

    #[error(
        "PortPoolShard {shard:?} exists but is not a shard of PortPool {pool:?} as it is now \
         ({reason}); it is left over from an earlier pool of that name: check it with `kubectl get \
         portpoolshard {shard} -o yaml`, delete it, and run `kubectl portalloc pool upgrade {pool}` again"
    )]
    ForeignShard {
        pool: String,
        shard: String,
        reason: String,
    },

    #[error(
        "PortPool {pool:?}: gave up during the {step} after {} attempts in {:.1}s (last: {}); \
         the pool stays as it is (while Migrating its holders are frozen): run \
         `kubectl portalloc pool upgrade {pool}` again, it resumes where it stopped",
        .exhausted.attempts,
        .exhausted.elapsed.as_secs_f64(),
        .exhausted.last
    )]
    Exhausted {
        pool: String,
        step: &'static str,
        exhausted: Exhausted,
    },

    #[error(
        "PortPool {pool:?}: the API server dropped status.format, so its PortPool CRD predates \
         sharded pools (the pool stays in the one-object format): run `kubectl portalloc install` \
         to update the CRDs, then `kubectl portalloc pool upgrade {pool}`"
    )]
    OutdatedCrds { pool: String },

    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// Where the upgrade found the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpgradeStart {
    /// Today's one-object record: frozen, copied and flipped by this run.
    OneObject,
    /// Already `Migrating` (an upgrade stopped after the freeze): resumed at the copy.
    Resumed,
    /// Already `Sharded`: nothing to do.
    AlreadySharded,
}

/// What one upgrade did.
#[derive(Clone, Debug)]
pub struct UpgradeReport {
    pub start: UpgradeStart,
    /// The shards of the plan (every window of the layout, plus windows only stray entries use).
    pub shards: usize,
    /// Shards created or whose status was overwritten by this run (over all its rounds); the
    /// rest already held the planned record.
    pub shards_written: usize,
    /// Entries of the frozen holder list that the shards now hold.
    pub holders_copied: usize,
    /// Another upgrader flipped the pool while this one was retrying.
    pub finished_elsewhere: bool,
    /// The pool as last written or read: `Sharded`, with no holders.
    pub pool: PortPool,
}

/// What writing a plan's shards did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardsWritten {
    pub shards: usize,
    pub written: usize,
}

/// Upgrade pool `name` to the sharded record: freeze, copy, flip (see the module comment).
pub async fn upgrade_pool(client: &Client, name: &str) -> Result<UpgradeReport, UpgradeError> {
    let store = ShardStore::new(client.clone());
    let pools: Api<PortPool> = Api::all(client.clone());
    let mut start = None;
    let mut attempts = Attempts::new(RetryPolicy::default());
    // Summed over rounds: a round whose flip loses a race still wrote its shards.
    let (mut shards, mut shards_written, mut holders_copied) = (0, 0, 0);
    loop {
        let pool = get_pool(client, name).await?;
        let format = format_of(&pool);
        let first = *start.get_or_insert(match format {
            None => UpgradeStart::OneObject,
            Some(RecordFormat::Migrating) => UpgradeStart::Resumed,
            Some(RecordFormat::Sharded) => UpgradeStart::AlreadySharded,
        });
        let frozen = match format {
            Some(RecordFormat::Sharded) => {
                // Already so, or another upgrader flipped it while this one went round.
                return Ok(UpgradeReport {
                    start: first,
                    shards,
                    shards_written,
                    holders_copied,
                    finished_elsewhere: first != UpgradeStart::AlreadySharded,
                    pool,
                });
            }
            Some(RecordFormat::Migrating) => pool,
            None => {
                // Shards readable before anything is written: a missing CRD or a missing right
                // must not leave the pool frozen.
                store
                    .list(name)
                    .await
                    .map_err(|(err, target)| KubeError::from_kube(err, target))?;
                match write_format(&pools, pool, RecordFormat::Migrating).await {
                    // A CRD without `format` prunes it silently; flipping such a pool would
                    // empty its holders with nothing to say where they went.
                    Ok(frozen) if format_of(&frozen) != Some(RecordFormat::Migrating) => {
                        return Err(UpgradeError::OutdatedCrds {
                            pool: name.to_string(),
                        });
                    }
                    Ok(frozen) => {
                        tracing::info!("PortPool {name}: frozen (format Migrating)");
                        frozen
                    }
                    Err((err, target)) => {
                        retry(&mut attempts, err, target, name, "freeze").await?;
                        continue;
                    }
                }
            }
        };
        let plan = plan_for(&frozen)?;
        holders_copied = frozen.status.as_ref().map_or(0, |s| s.holders.len());
        let written = write_shards(&store, &frozen, &plan).await?;
        (shards, shards_written) = (written.shards, shards_written + written.written);
        match write_format(&pools, frozen, RecordFormat::Sharded).await {
            Ok(flipped) => {
                tracing::info!(
                    "PortPool {name}: sharded ({shards} shards, {shards_written} written, \
                     {holders_copied} holders copied)"
                );
                return Ok(UpgradeReport {
                    start: first,
                    shards,
                    shards_written,
                    holders_copied,
                    finished_elsewhere: false,
                    pool: flipped,
                });
            }
            Err((err, target)) => retry(&mut attempts, err, target, name, "flip").await?,
        }
    }
}

/// Create every shard of `plan` that is missing and overwrite the status of every one that
/// differs from the plan, each by its own CAS; a shard already as planned is not written.
/// `pool` is the pool as read (its UID goes into new shards' specs).
pub async fn write_shards(
    store: &ShardStore,
    pool: &PortPool,
    plan: &[UpgradedShard],
) -> Result<ShardsWritten, UpgradeError> {
    let pool_name = pool.name_any();
    let mut written = 0;
    for planned in plan {
        let mut attempts = Attempts::new(RetryPolicy::default());
        loop {
            let existing = match store.get(&planned.name).await {
                Ok(existing) => existing,
                Err((err, target)) => {
                    retry(&mut attempts, err, target, &pool_name, "copy").await?;
                    continue;
                }
            };
            if let Some(shard) = &existing {
                if let Some(reason) = foreign(pool, planned, shard) {
                    return Err(UpgradeError::ForeignShard {
                        pool: pool_name,
                        shard: planned.name.clone(),
                        reason,
                    });
                }
                if shard.status.as_ref() == Some(&planned.status) {
                    break;
                }
            }
            let write = ShardWrite {
                index: planned.index,
                name: planned.name.clone(),
                resource_version: existing.as_ref().and_then(|s| s.resource_version()),
                status: planned.status.clone(),
            };
            match store.commit(pool, &write).await {
                Ok(_) => {
                    written += 1;
                    break;
                }
                // A create that finds the shard there (another upgrader) comes back as a
                // conflict too: read again.
                Err((err, target)) => retry(&mut attempts, err, target, &pool_name, "copy").await?,
            }
        }
    }
    Ok(ShardsWritten {
        shards: plan.len(),
        written,
    })
}

/// The shards for `pool` as it is (today's record cut by window; every window of the layout).
pub fn plan_for(pool: &PortPool) -> Result<Vec<UpgradedShard>, UpgradeError> {
    upgrade_plan(pool).map_err(|error| UpgradeError::Invalid {
        pool: pool.name_any(),
        error,
    })
}

fn format_of(pool: &PortPool) -> Option<RecordFormat> {
    pool.status.as_ref().and_then(|s| s.format)
}

/// Why an existing shard object cannot be this pool's shard `planned` (its spec is immutable).
fn foreign(pool: &PortPool, planned: &UpgradedShard, shard: &PortPoolShard) -> Option<String> {
    let spec = &shard.spec;
    if spec.pool != pool.name_any() {
        Some(format!("it belongs to pool {:?}", spec.pool))
    } else if pool.uid().is_some_and(|uid| uid != spec.pool_uid) {
        Some(format!("it names pool UID {}", spec.pool_uid))
    } else if spec.index != i32::from(planned.index) || spec.ranges != planned.ranges {
        Some(format!(
            "it is for window {} ({:?})",
            spec.index,
            spec.ranges.iter().map(|r| r.as_str()).collect::<Vec<_>>()
        ))
    } else {
        None
    }
}

/// Write `pool`'s status with `format` (holders emptied for `Sharded`), by a CAS on the
/// resourceVersion it was read with.
async fn write_format(
    pools: &Api<PortPool>,
    mut pool: PortPool,
    format: RecordFormat,
) -> Result<PortPool, (kube::Error, Target)> {
    let name = pool.name_any();
    let status = pool.status.get_or_insert_with(Default::default);
    status.format = Some(format);
    if format == RecordFormat::Sharded {
        status.holders.clear();
    }
    pools
        .replace_status(&name, &PostParams::default(), &pool)
        .await
        .map_err(|e| (e, POOL_STATUS.on("update", &name, None)))
}

async fn retry(
    attempts: &mut Attempts,
    err: kube::Error,
    target: Target,
    pool: &str,
    step: &'static str,
) -> Result<(), UpgradeError> {
    let label = format!("upgrade of pool {pool:?} ({step})");
    attempts
        .backoff(err, target, &label)
        .await
        .map_err(|stop| match stop {
            Stop::Final(err) => UpgradeError::Kube(err),
            Stop::Exhausted(exhausted) => UpgradeError::Exhausted {
                pool: pool.to_string(),
                step,
                exhausted,
            },
        })
}

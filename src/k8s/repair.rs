//! `repair`, the reads and the write: read a pool, then list its PortAllocations, compute the
//! diff with [`crate::ledger::plan_repair`] (whose docs say why one pass is safe), and write it
//! back with a compare-and-swap on the resourceVersion read.

use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};

use std::collections::BTreeMap;

use super::allocator::{AllocateError, Allocator, SyncReport};
use super::error::{KubeError, Target};
use super::resources::{ALLOCATIONS, POOL_STATUS, POOLS};
use super::retry::{Attempts, Exhausted, RetryCause, RetryPolicy, Stop};
use super::shards::ShardStore;
use crate::api::{PortAllocation, PortPool, SpecError};
use crate::ledger::{
    Change, FreeReason, PoolRecord, RepairPlan, Restored, is_sharded, plan_repair,
};

#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error(transparent)]
    Kube(#[from] KubeError),

    #[error(
        "PortPool {pool:?} has an unusable spec: {error}; fix it with kubectl edit portpool {pool}"
    )]
    PoolSpec { pool: String, error: SpecError },

    #[error(
        "repair of PortPool {pool:?} gave up after {attempts} attempts in {elapsed_ms} ms ({conflicts} \
         conflicts with other writers of the pool; last: {last}). Nothing was written: it is safe to \
         run the command again"
    )]
    Exhausted {
        pool: String,
        attempts: u32,
        elapsed_ms: u128,
        conflicts: u32,
        last: String,
    },
}

/// What happened after the write to a PortAllocation whose holdings were restored.
#[derive(Debug)]
pub enum FollowUp {
    /// Synced: its status now names the pool's new UID.
    Synced(Box<SyncReport>),
    /// It was deleted meanwhile; its restored entry was freed again.
    Gone { owner: String, freed: usize },
    Failed {
        owner: String,
        error: Box<AllocateError>,
    },
}

/// The outcome of repairing one pool.
#[derive(Debug)]
pub struct PoolRepair {
    pub plan: RepairPlan,
    pub applied: bool,
    pub attempts: u32,
    pub conflicts: u32,
    pub follow_ups: Vec<FollowUp>,
}

/// Reads, plans and (with `apply`) writes, one pool at a time.
pub struct Repairer {
    pub(super) client: Client,
    allocator: Allocator,
    pub policy: RetryPolicy,
}

impl Repairer {
    pub fn new(client: Client, allocator: Allocator) -> Self {
        Self {
            client,
            policy: allocator.policy,
            allocator,
        }
    }

    /// Repair `only` that pool, or every pool, in name order, handing each outcome to `each`
    /// as it completes. Returns how many pools there were.
    ///
    /// Every pool is read before the PortAllocations are listed, so one list serves all pools
    /// (see [`plan_repair`] for why that order makes one pass enough). A pool repaired alone
    /// lists only its own PortAllocations (a field selector on `spec.pool`).
    pub async fn repair(
        &self,
        only: Option<&str>,
        apply: bool,
        mut each: impl FnMut(PoolRepair),
    ) -> Result<usize, RepairError> {
        let pools: Api<PortPool> = Api::all(self.client.clone());
        let mut objects = match only {
            Some(name) => vec![
                pools
                    .get(name)
                    .await
                    .map_err(|e| KubeError::from_kube(e, POOLS.on("get", name, None)))?,
            ],
            None => {
                pools
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| KubeError::from_kube(e, POOLS.all("list", None)))?
                    .items
            }
        };
        objects.sort_by_key(|p| p.name_any());
        // A sharded pool's shards are listed before the PortAllocations, as a pool is read.
        let mut shards = BTreeMap::new();
        for object in objects.iter().filter(|p| is_sharded(p)) {
            let name = object.name_any();
            let listed = ShardStore::new(self.client.clone())
                .list(&name)
                .await
                .map_err(|(e, target)| KubeError::from_kube(e, target))?;
            shards.insert(name, listed);
        }
        let shared = match only {
            Some(_) => None,
            None => Some(
                self.list_allocations(None)
                    .await
                    .map_err(|e| KubeError::from_kube(e, ALLOCATIONS.all("list", None)))?,
            ),
        };
        let count = objects.len();
        for object in objects {
            let repair = match shards.remove(&object.name_any()) {
                Some(listed) => {
                    self.repair_sharded(object, Some(listed), shared.as_deref(), apply)
                        .await?
                }
                None => self.repair_pool(object, shared.as_deref(), apply).await?,
            };
            each(repair);
        }
        Ok(count)
    }

    /// Plan one pool's repair and, with `apply`, carry it out with a compare-and-swap on the
    /// resourceVersion read; on 409 start again from the read. `object` and `listed` are a read
    /// of the pool and a later list of PortAllocations, used for the first round.
    async fn repair_pool(
        &self,
        mut object: PortPool,
        mut listed: Option<&[PortAllocation]>,
        apply: bool,
    ) -> Result<PoolRepair, RepairError> {
        let pools: Api<PortPool> = Api::all(self.client.clone());
        let pool = object.name_any();
        let mut attempts = Attempts::new(self.policy);
        loop {
            let record =
                PoolRecord::load(object.clone()).map_err(|error| RepairError::PoolSpec {
                    pool: pool.clone(),
                    error,
                })?;
            let plan = match listed.take() {
                Some(all) => plan_repair(&record, all),
                None => self.plan_alone(&record, &mut attempts).await?,
            };
            let Some(status) = plan.status.clone().filter(|_| apply) else {
                return Ok(PoolRepair {
                    plan,
                    applied: false,
                    attempts: attempts.attempts,
                    conflicts: attempts.conflicts,
                    follow_ups: Vec::new(),
                });
            };
            let mut updated = object;
            updated.status = Some(status);
            // `updated` carries the resourceVersion of the read: the compare-and-swap.
            match pools
                .replace_status(&pool, &PostParams::default(), &updated)
                .await
            {
                Ok(_) => {
                    tracing::info!(
                        "repair {pool}: {} changes written (attempt {}, {} conflicts)",
                        plan.changes.len(),
                        attempts.attempts,
                        attempts.conflicts
                    );
                    let follow_ups = self.follow_up(&pool, &plan.restored).await;
                    return Ok(PoolRepair {
                        plan,
                        applied: true,
                        attempts: attempts.attempts,
                        conflicts: attempts.conflicts,
                        follow_ups,
                    });
                }
                Err(e) => {
                    let target = POOL_STATUS.on("update", &pool, None);
                    self.backoff(&mut attempts, e, target, &pool).await?;
                }
            }
            object = self.reread_pool(&pool, &mut attempts).await?;
        }
    }

    /// The plan from this pool's own PortAllocations, listed after `record` was read. Freeing
    /// needs to know whether a missing UID is gone or belongs to another pool, so when the plan
    /// frees anything, every PortAllocation is listed once more (leaks are rare).
    async fn plan_alone(
        &self,
        record: &PoolRecord,
        attempts: &mut Attempts,
    ) -> Result<RepairPlan, RepairError> {
        let pool = record.name();
        let mine = loop {
            match self.list_allocations(Some(pool)).await {
                Ok(mine) => break mine,
                Err(e) => {
                    let target = ALLOCATIONS.all("list", None);
                    self.backoff(attempts, e, target, pool).await?;
                }
            }
        };
        let plan = plan_repair(record, &mine);
        let frees = plan.changes.iter().any(|c| {
            matches!(
                c,
                Change::Free {
                    reason: FreeReason::OwnerGone,
                    ..
                }
            )
        });
        if !frees {
            return Ok(plan);
        }
        let all = self
            .list_allocations(None)
            .await
            .map_err(|e| KubeError::from_kube(e, ALLOCATIONS.all("list", None)))?;
        Ok(plan_repair(record, &all))
    }

    /// PortAllocations of one pool (by a field selector on `spec.pool`, served by CRDs installed
    /// by this version), or of every pool. A consistent list: no resourceVersion is given, so it
    /// is served at a revision after any read made before it.
    pub(super) async fn list_allocations(
        &self,
        pool: Option<&str>,
    ) -> Result<Vec<PortAllocation>, kube::Error> {
        let api: Api<PortAllocation> = Api::all(self.client.clone());
        let Some(pool) = pool else {
            return Ok(api.list(&ListParams::default()).await?.items);
        };
        let selected = ListParams::default().fields(&format!("spec.pool={pool}"));
        match api.list(&selected).await {
            Ok(list) => Ok(list.items),
            // CRDs installed by an older version have no selectable spec.pool: list them all.
            Err(kube::Error::Api(status)) if status.code == 400 => {
                Ok(api.list(&ListParams::default()).await?.items)
            }
            Err(e) => Err(e),
        }
    }

    /// Sync every PortAllocation whose holdings were restored, so its status names the pool's
    /// current UID. One deleted meanwhile gets its restored entry freed again.
    pub(super) async fn follow_up(&self, pool: &str, restored: &[Restored]) -> Vec<FollowUp> {
        let mut out = Vec::new();
        for r in restored {
            let owner = format!("{}/{}", r.namespace, r.name);
            let api: Api<PortAllocation> = Api::namespaced(self.client.clone(), &r.namespace);
            let current = match api.get_opt(&r.name).await {
                Ok(current) => current,
                Err(e) => {
                    let error =
                        KubeError::from_kube(e, ALLOCATIONS.on("get", &r.name, Some(&r.namespace)));
                    out.push(FollowUp::Failed {
                        owner,
                        error: Box::new(error.into()),
                    });
                    continue;
                }
            };
            match current {
                Some(pa) if pa.uid().as_deref() == Some(r.uid.as_str()) => {
                    match self.allocator.sync(pa, None).await {
                        Ok(report) => out.push(FollowUp::Synced(Box::new(report))),
                        Err(error) => out.push(FollowUp::Failed {
                            owner,
                            error: Box::new(error),
                        }),
                    }
                }
                _ => match self.allocator.release_holder(pool, &r.uid, &owner).await {
                    Ok(freed) => out.push(FollowUp::Gone { owner, freed }),
                    Err(error) => out.push(FollowUp::Failed {
                        owner,
                        error: Box::new(error),
                    }),
                },
            }
        }
        out
    }

    /// Sleep before the next round if the failure is worth retrying, else say what failed.
    /// Read the pool again after a lost compare-and-swap, retrying within the same budget.
    pub(super) async fn reread_pool(
        &self,
        pool: &str,
        attempts: &mut Attempts,
    ) -> Result<PortPool, RepairError> {
        let pools: Api<PortPool> = Api::all(self.client.clone());
        loop {
            match pools.get(pool).await {
                Ok(object) => return Ok(object),
                Err(e) => {
                    let target = POOLS.on("get", pool, None);
                    self.backoff(attempts, e, target, pool).await?;
                }
            }
        }
    }

    pub(super) async fn backoff(
        &self,
        attempts: &mut Attempts,
        err: kube::Error,
        target: Target,
        pool: &str,
    ) -> Result<(), RepairError> {
        attempts
            .backoff(err, target, &format!("repair {pool}"))
            .await
            .map_err(|stop| match stop {
                Stop::Final(e) => RepairError::Kube(e),
                Stop::Exhausted(exhausted) => exhausted_error(pool, exhausted),
            })
    }
}

fn exhausted_error(pool: &str, exhausted: Exhausted) -> RepairError {
    RepairError::Exhausted {
        pool: pool.to_string(),
        attempts: exhausted.attempts,
        elapsed_ms: exhausted.elapsed.as_millis(),
        conflicts: exhausted.conflicts,
        last: match exhausted.last {
            RetryCause::Conflict => "409 Conflict".to_string(),
            RetryCause::Transient(message) => message,
        },
    }
}

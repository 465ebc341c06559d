//! `repair`, the reads and the writes: LIST a pool's shards, then list its PortAllocations,
//! plan per shard ([`crate::ledger::plan_pool_repair`], whose docs carry the one-pass
//! argument), and write each changed shard with a compare-and-swap on the version listed. A
//! conflict on any shard starts again from the LIST: the shards already written hold what was
//! planned for them, and the new plan sees them as they now are.

use std::collections::BTreeMap;

use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};

use super::allocate::{AllocateError, Allocator, SyncReport, list_in_pages};
use super::error::{KubeError, Target};
use super::process::cpu_bound;
use super::record::ShardStore;
use super::resources::{ALLOCATIONS, POOLS, SHARDS};
use super::retry::{Attempts, Exhausted, RetryCause, RetryPolicy, Stop};
use crate::api::{PortAllocation, PortPool, PortPoolShard, SpecError};
use crate::ledger::{
    Change, Finding, FreeReason, PoolRecord, PoolRepairPlan, PoolSnapshot, RepairPlan, Restored,
    SharedPorts, StaleShard, all_overlaps, plan_pool_repair,
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
        // Every pool's shards are listed before the PortAllocations.
        let mut shards = BTreeMap::new();
        for object in &objects {
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
        let overlaps = self.overlaps(only, &objects).await;
        let count = objects.len();
        for object in objects {
            let name = object.name_any();
            let listed = shards.remove(&name);
            let mut repaired = self
                .repair_pool(object, listed, shared.as_deref(), apply)
                .await?;
            repaired
                .plan
                .findings
                .extend(
                    overlaps
                        .iter()
                        .filter(|o| o.pool == name)
                        .map(|o| Finding::SharesPorts {
                            other: o.other.clone(),
                            protocol: o.protocol.to_string(),
                            ports: o.shared.to_string(),
                        }),
                );
            each(repaired);
        }
        Ok(count)
    }

    /// The pools that share ports (written before the admission policy, or with it absent):
    /// among `objects` when they are every pool, else among all pools, listed again. A list
    /// that fails leaves them unreported (the repair itself goes on).
    async fn overlaps(&self, only: Option<&str>, objects: &[PortPool]) -> Vec<SharedPorts> {
        if only.is_none() {
            return all_overlaps(objects);
        }
        match Api::<PortPool>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(all) => all_overlaps(&all.items),
            Err(e) => {
                let error = KubeError::from_kube(e, POOLS.all("list", None));
                tracing::warn!("checking which pools share ports: {error}");
                Vec::new()
            }
        }
    }

    /// The repair of one pool. `shards` and `listed`, when given, are a LIST of its shards and
    /// a later list of PortAllocations, used for the first round.
    async fn repair_pool(
        &self,
        mut object: PortPool,
        mut shards: Option<Vec<PortPoolShard>>,
        mut listed: Option<&[PortAllocation]>,
        apply: bool,
    ) -> Result<PoolRepair, RepairError> {
        let pool = object.name_any();
        let store = ShardStore::new(self.client.clone());
        let mut attempts = Attempts::new(self.policy);
        loop {
            // 1. The shards (at R), 2. then the PortAllocations (after R).
            let listed_shards = match shards.take() {
                Some(shards) => shards,
                None => match store.list(&pool).await {
                    Ok(shards) => shards,
                    Err((e, target)) => {
                        self.backoff(&mut attempts, e, target, &pool).await?;
                        continue;
                    }
                },
            };
            let sharded = cpu_bound(|| {
                PoolRecord::load(PoolSnapshot::of_pool(&object), listed_shards.clone())
            })
            .map_err(|error| RepairError::PoolSpec {
                pool: pool.clone(),
                error,
            })?;
            let planned = match listed.take() {
                Some(all) => cpu_bound(|| plan_pool_repair(&sharded, &listed_shards, all)),
                None => {
                    self.plan_sharded_alone(&sharded, &listed_shards, &mut attempts)
                        .await?
                }
            };
            if !apply || (planned.writes.is_empty() && planned.replace.is_empty()) {
                return Ok(PoolRepair {
                    plan: planned.plan,
                    applied: false,
                    attempts: attempts.attempts,
                    conflicts: attempts.conflicts,
                    follow_ups: Vec::new(),
                });
            }
            if !planned.replace.is_empty() {
                // Shards naming another pool UID are an earlier pool's only if this pool object
                // still exists after the LIST: it existed before it too, and a name has one live
                // object at a time. Otherwise they may be a newer pool's: start again.
                let pools: Api<PortPool> = Api::all(self.client.clone());
                let current = pools
                    .get(&pool)
                    .await
                    .map_err(|e| KubeError::from_kube(e, POOLS.on("get", &pool, None)))?;
                if current.uid() != object.uid() {
                    object = current;
                    continue;
                }
            }
            match self.write_shards(&store, &sharded.pool, &planned).await {
                Ok(()) => {
                    tracing::info!(
                        "repair {pool}: {} changes written to {} shards (attempt {}, {} conflicts)",
                        planned.plan.changes.len(),
                        planned.writes.len(),
                        attempts.attempts,
                        attempts.conflicts
                    );
                    let follow_ups = self.follow_up(&pool, &planned.plan.restored).await;
                    return Ok(PoolRepair {
                        plan: planned.plan,
                        applied: true,
                        attempts: attempts.attempts,
                        conflicts: attempts.conflicts,
                        follow_ups,
                    });
                }
                Err((e, target)) => self.backoff(&mut attempts, e, target, &pool).await?,
            }
            object = self.reread_pool(&pool, &mut attempts).await?;
        }
    }

    /// The plan from this pool's own PortAllocations, listed after the shards were. Freeing
    /// needs to know whether a missing UID is gone or belongs to another pool, so when the plan
    /// frees anything, every PortAllocation is listed once more (leaks are rare).
    async fn plan_sharded_alone(
        &self,
        sharded: &PoolRecord,
        listed: &[PortPoolShard],
        attempts: &mut Attempts,
    ) -> Result<PoolRepairPlan, RepairError> {
        let pool = sharded.name();
        let mine = loop {
            match self.list_allocations(Some(pool)).await {
                Ok(mine) => break mine,
                Err(e) => {
                    let target = ALLOCATIONS.all("list", None);
                    self.backoff(attempts, e, target, pool).await?;
                }
            }
        };
        let planned = plan_pool_repair(sharded, listed, &mine);
        let frees = planned.plan.changes.iter().any(|c| {
            matches!(
                c,
                Change::Free {
                    reason: FreeReason::OwnerGone,
                    ..
                }
            )
        });
        if !frees {
            return Ok(planned);
        }
        let all = self
            .list_allocations(None)
            .await
            .map_err(|e| KubeError::from_kube(e, ALLOCATIONS.all("list", None)))?;
        Ok(plan_pool_repair(sharded, listed, &all))
    }

    /// Delete the earlier pool objects' shards, then commit each shard write in
    /// ascending order, each a compare-and-swap (or a create) on what was listed.
    async fn write_shards(
        &self,
        store: &ShardStore,
        pool: &PoolSnapshot,
        planned: &PoolRepairPlan,
    ) -> Result<(), (kube::Error, super::error::Target)> {
        for stale in &planned.replace {
            delete_stale(&self.client, stale).await?;
        }
        for write in &planned.writes {
            store.commit(pool, write).await?;
        }
        Ok(())
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
            return list_in_pages(&api, &ListParams::default()).await;
        };
        let selected = ListParams::default().fields(&format!("spec.pool={pool}"));
        match list_in_pages(&api, &selected).await {
            Ok(items) => Ok(items),
            // CRDs installed by an older version have no selectable spec.pool: list them all.
            Err(kube::Error::Api(status)) if status.code == 400 => {
                list_in_pages(&api, &ListParams::default()).await
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
                    match self.allocator.sync(pa).await {
                        Ok(report) => out.push(FollowUp::Synced(Box::new(report))),
                        Err(error) => out.push(FollowUp::Failed {
                            owner,
                            error: Box::new(error),
                        }),
                    }
                }
                _ => match self
                    .allocator
                    .release_holder(pool, &r.uid, &owner, None)
                    .await
                {
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

/// Delete a shard of an earlier pool object, only that object (its UID as precondition).
async fn delete_stale(
    client: &Client,
    stale: &StaleShard,
) -> Result<(), (kube::Error, super::error::Target)> {
    let api: Api<PortPoolShard> = Api::all(client.clone());
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(stale.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&stale.name, &params).await {
        Ok(_) => {
            tracing::info!("repair: deleted shard {} of an earlier pool", stale.name);
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err((e, SHARDS.on("delete", &stale.name, None))),
    }
}

//! `repair` of a sharded pool: LIST its shards, then list its PortAllocations, plan per shard
//! ([`plan_sharded_repair`], whose docs carry the one-pass argument), and write each changed
//! shard with a compare-and-swap on the version listed. A conflict on any shard starts again
//! from the LIST: the shards already written hold what was planned for them, and the new
//! plan sees them as they now are.

use kube::api::{Api, DeleteParams, Preconditions};
use kube::{Client, ResourceExt};

use super::error::KubeError;
use super::repair::{PoolRepair, RepairError, Repairer};
use super::resources::{ALLOCATIONS, POOLS, SHARDS};
use super::retry::Attempts;
use super::shards::ShardStore;
use crate::api::{PortAllocation, PortPool, PortPoolShard};
use crate::ledger::{
    Change, FreeReason, ShardRepairPlan, ShardedRecord, StaleShard, plan_sharded_repair,
};

impl Repairer {
    /// The repair of one sharded pool. `shards` and `listed`, when given, are a LIST of its
    /// shards and a later list of PortAllocations, used for the first round.
    pub(super) async fn repair_sharded(
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
            let sharded =
                ShardedRecord::load(object.clone(), listed_shards.clone()).map_err(|error| {
                    RepairError::PoolSpec {
                        pool: pool.clone(),
                        error,
                    }
                })?;
            let planned = match listed.take() {
                Some(all) => plan_sharded_repair(&sharded, &listed_shards, all),
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
            match self.write_shards(&store, &object, &planned).await {
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

    /// As `plan_alone` for one-object pools: this pool's PortAllocations, and every one when
    /// the plan frees an entry (gone, or an object of another pool?).
    async fn plan_sharded_alone(
        &self,
        sharded: &ShardedRecord,
        listed: &[PortPoolShard],
        attempts: &mut Attempts,
    ) -> Result<ShardRepairPlan, RepairError> {
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
        let planned = plan_sharded_repair(sharded, listed, &mine);
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
        Ok(plan_sharded_repair(sharded, listed, &all))
    }

    /// Delete the earlier pool objects' shards, then commit each shard write in
    /// ascending order, each a compare-and-swap (or a create) on what was listed.
    async fn write_shards(
        &self,
        store: &ShardStore,
        pool: &PortPool,
        planned: &ShardRepairPlan,
    ) -> Result<(), (kube::Error, super::error::Target)> {
        for stale in &planned.replace {
            delete_stale(&self.client, stale).await?;
        }
        for write in &planned.writes {
            store.commit(pool, write).await?;
        }
        Ok(())
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

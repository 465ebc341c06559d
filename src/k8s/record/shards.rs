//! Reads and writes of a pool's `PortPoolShard` objects (docs/record-at-scale.md).
//!
//! Each shard's `resourceVersion` is the lock for its window's ports: a write replaces the
//! shard's status with the version read. A shard that does not exist yet is created (its spec)
//! and then written (its status: the API server ignores the status of a create); a create that
//! finds the shard already there is a conflict like any other, and the caller reads again.

use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};

use crate::api::PortPoolShard;
use crate::k8s::client::lean;
use crate::k8s::error::{KubeError, Target};
use crate::k8s::resources::{SHARD_STATUS, SHARDS};
use crate::ledger::{PoolSnapshot, ShardWrite, new_shard};

/// The shards of pools, through one client. Reads and writes return the raw error with the
/// request, for the callers' retry loops; `KubeError::from_kube` makes the message.
#[derive(Clone)]
pub struct ShardStore {
    api: Api<PortPoolShard>,
}

impl ShardStore {
    pub fn new(client: Client) -> Self {
        Self {
            api: Api::all(client),
        }
    }

    /// Every shard object of `pool` (by the selectable field `spec.pool`), in one consistent
    /// list; foreign or malformed ones are sorted out by `CopyRecord::load`.
    pub async fn list(&self, pool: &str) -> Result<Vec<PortPoolShard>, (kube::Error, Target)> {
        let params = ListParams::default().fields(&format!("spec.pool={pool}"));
        self.api
            .list(&params)
            .await
            .map(|list| list.items.into_iter().map(lean).collect())
            .map_err(|e| (e, SHARDS.all("list", None)))
    }

    /// The first `limit` shards of `pool` in one LIST, and whether that is all of them: enough
    /// to learn the pool's spec (every shard carries it), and the whole record of a pool of
    /// few windows.
    pub async fn list_first(
        &self,
        pool: &str,
        limit: u32,
    ) -> Result<(Vec<PortPoolShard>, bool), (kube::Error, Target)> {
        let params = ListParams::default()
            .fields(&format!("spec.pool={pool}"))
            .limit(limit);
        self.api
            .list(&params)
            .await
            .map(|list| {
                let complete = list.metadata.continue_.is_none_or(|token| token.is_empty());
                (list.items.into_iter().map(lean).collect(), complete)
            })
            .map_err(|e| (e, SHARDS.all("list", None)))
    }

    /// One shard by name; `None` when it does not exist (yet).
    pub async fn get(&self, name: &str) -> Result<Option<PortPoolShard>, (kube::Error, Target)> {
        self.api
            .get_opt(name)
            .await
            .map(|shard| shard.map(lean))
            .map_err(|e| (e, SHARDS.on("get", name, None)))
    }

    /// Commit one shard write with the resourceVersion it carries, creating the shard first when
    /// the write says it did not exist. Returns the shard as written. The raw error is returned
    /// so the caller's retry loop can tell a conflict (409) from the rest.
    pub async fn commit(
        &self,
        pool: &PoolSnapshot,
        write: &ShardWrite,
    ) -> Result<PortPoolShard, (kube::Error, Target)> {
        let resource_version = match &write.resource_version {
            Some(version) => version.clone(),
            None => {
                let created = self
                    .api
                    .create(
                        &crate::k8s::client::write_params(),
                        &new_shard(pool, write.key),
                    )
                    .await
                    .map_err(|e| (created_meanwhile(e), SHARDS.on("create", &write.name, None)))?;
                created.resource_version().unwrap_or_default()
            }
        };
        let mut shard = new_shard(pool, write.key);
        shard.metadata.name = Some(write.name.clone());
        shard.metadata.resource_version = Some(resource_version);
        shard.status = Some(write.status.clone());
        self.api
            .replace_status(&write.name, &crate::k8s::client::write_params(), &shard)
            .await
            .map(lean)
            .map_err(|e| (e, SHARD_STATUS.on("update", &write.name, None)))
    }

    /// The write [`ShardStore::commit`] would send, with `dryRun=All`: the API server checks
    /// it (schema, admission policies, RBAC) and stores nothing. A shard that does not exist yet
    /// is checked by its create alone (no status can be written to an object never stored).
    pub async fn commit_dry_run(
        &self,
        pool: &PoolSnapshot,
        write: &ShardWrite,
    ) -> Result<(), KubeError> {
        let dry_run = PostParams {
            dry_run: true,
            ..crate::k8s::client::write_params()
        };
        let mut shard = new_shard(pool, write.key);
        shard.metadata.name = Some(write.name.clone());
        let Some(version) = &write.resource_version else {
            return self
                .api
                .create(&dry_run, &shard)
                .await
                .map(|_| ())
                .map_err(|e| KubeError::from_kube(e, SHARDS.on("create", &write.name, None)));
        };
        shard.metadata.resource_version = Some(version.clone());
        shard.status = Some(write.status.clone());
        self.api
            .replace_status(&write.name, &dry_run, &shard)
            .await
            .map(|_| ())
            .map_err(|e| KubeError::from_kube(e, SHARD_STATUS.on("update", &write.name, None)))
    }

    /// Delete one shard (pool deletion, and tests).
    pub async fn delete(&self, name: &str) -> Result<(), KubeError> {
        match self.api.delete(name, &Default::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(e) => Err(KubeError::from_kube(e, SHARDS.on("delete", name, None))),
        }
    }
}

/// Another client created the shard first: for the caller that is a lost compare-and-swap like
/// any other (read again and decide again), so it is reported as a conflict.
fn created_meanwhile(e: kube::Error) -> kube::Error {
    match e {
        kube::Error::Api(mut status) if status.is_already_exists() => {
            status.reason = "Conflict".into();
            kube::Error::Api(status)
        }
        other => other,
    }
}

//! PortPools: reading, creating (with the status counts written from the start; sharded on
//! request), applying from a manifest, and deleting only while nobody holds a port.

use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};

use super::error::{ApiErrorKind, KubeError};
use super::resources::{POOL_STATUS, POOLS};
use super::shards::ShardStore;
use super::upgrade::{UpgradeError, plan_for, upgrade_pool, write_shards};
use crate::api::{PortPool, PortPoolStatus, Protocol, RecordFormat, SpecError};
use crate::core::PortSet;
use crate::ledger::{PoolOverlap, PoolRecord, overlapping_pool};

/// Why a pool could not be created or deleted.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("PortPool {pool:?}: {error}")]
    Invalid { pool: String, error: SpecError },

    #[error(
        "PortPool {pool:?} would overlap {protocol} pool {:?} ({}): a port could then be handed out \
         by both; choose disjoint ranges, or pass --allow-overlap",
        .overlap.other,
        .overlap.other_ports
    )]
    Overlaps {
        pool: String,
        protocol: Protocol,
        overlap: PoolOverlap,
    },

    #[error(
        "PortPool {pool:?} already exists: see it with `kubectl portalloc pool describe {pool}`"
    )]
    AlreadyExists { pool: String },

    #[error(
        "PortPool {pool:?} still has {} holders: {}. Delete those PortAllocations first \
         (`kubectl portalloc delete NAME -n NAMESPACE`), or pass --force",
        .holders.len(),
        .holders.join(", ")
    )]
    Held { pool: String, holders: Vec<String> },

    #[error(
        "PortPool {pool:?} changed while deleting it (a new allocation?): run the command again"
    )]
    Changed { pool: String },

    /// Writing the shards of a pool created sharded.
    #[error(transparent)]
    Shards(#[from] UpgradeError),

    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// What applying a pool from a manifest did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Created,
    Unchanged,
    Configured,
}

/// A deleted pool, and how many holders still record ports of it.
#[derive(Clone, Debug)]
pub struct DeletedPool {
    pub holders: usize,
}

pub async fn get_pool(client: &Client, name: &str) -> Result<PortPool, KubeError> {
    let pools: Api<PortPool> = Api::all(client.clone());
    pools.get(name).await.map_err(|e| {
        KubeError::from_kube(e, POOLS.on("get", name, None))
            .with_hint(": list pools with `kubectl portalloc pool get`")
    })
}

/// Every pool, sorted by name.
pub async fn list_pools(client: &Client) -> Result<Vec<PortPool>, KubeError> {
    let pools: Api<PortPool> = Api::all(client.clone());
    let mut items = pools
        .list(&ListParams::default())
        .await
        .map_err(|e| KubeError::from_kube(e, POOLS.all("list", None)))?
        .items;
    items.sort_by_key(|p| p.name_any());
    Ok(items)
}

/// The pool's port set, or why its spec is unusable.
pub fn pool_ports(pool: &PortPool) -> Result<PortSet, PoolError> {
    pool.spec.port_set().map_err(|error| PoolError::Invalid {
        pool: pool.name_any(),
        error,
    })
}

/// Create a pool, refusing one that overlaps a pool of the same protocol unless
/// `allow_overlap`. Returns the pool as written, with its status counts. A `sharded` pool
/// records its holders in PortPoolShards from the start (docs/record-at-scale.md).
pub async fn create_pool(
    client: &Client,
    pool: PortPool,
    allow_overlap: bool,
    sharded: bool,
) -> Result<PortPool, PoolError> {
    let name = pool.name_any();
    let ports = pool_ports(&pool)?;
    if !allow_overlap
        && let Some(overlap) = overlapping_pool(&pool.spec, &ports, &list_pools(client).await?)
    {
        return Err(PoolError::Overlaps {
            pool: name,
            protocol: pool.spec.protocol,
            overlap,
        });
    }
    let pools: Api<PortPool> = Api::all(client.clone());
    let created = match pools.create(&PostParams::default(), &pool).await {
        Ok(created) => created,
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            return Err(PoolError::AlreadyExists { pool: name });
        }
        Err(e) => return Err(KubeError::from_kube(e, POOLS.on("create", &name, None)).into()),
    };
    tracing::info!("created PortPool {name}: {ports}");
    if !sharded {
        return Ok(initialize_status(&pools, created, None).await?);
    }
    // Every shard exists, empty, before the pool says Sharded, as after an upgrade's copy.
    let store = ShardStore::new(client.clone());
    write_shards(&store, &created, &plan_for(&created)?).await?;
    match initialize_status(&pools, created, Some(RecordFormat::Sharded)).await {
        // A PortPool CRD from before sharded pools drops `format` without a word.
        Ok(written) if written.status.as_ref().and_then(|s| s.format).is_none() => {
            Err(UpgradeError::OutdatedCrds { pool: name }.into())
        }
        Ok(written) => Ok(written),
        // A client allocated into the new pool (today's record) before its status said Sharded:
        // upgrade it in place instead, holders and all.
        Err(e) if e.kind() == ApiErrorKind::Conflict => Ok(upgrade_pool(client, &name).await?.pool),
        Err(e) => Err(e.into()),
    }
}

/// Counts for the printer columns from the start, not only after the first allocation; the
/// record's `format` for a pool created sharded.
async fn initialize_status(
    pools: &Api<PortPool>,
    created: PortPool,
    format: Option<RecordFormat>,
) -> Result<PortPool, KubeError> {
    let name = created.name_any();
    let record = PoolRecord::load(created.clone()).map_err(|error| {
        KubeError::new(
            ApiErrorKind::Invalid,
            POOLS.on("create", &name, None),
            format!("PortPool {name:?}: {error}"),
        )
    })?;
    let mut initialized = created;
    initialized.status = Some(PortPoolStatus {
        format,
        ..record.current_status()
    });
    pools
        .replace_status(&name, &PostParams::default(), &initialized)
        .await
        .map_err(|e| KubeError::from_kube(e, POOL_STATUS.on("update", &name, None)))
}

/// Create the pool, or update its spec if it differs (a manifest applied again).
pub async fn apply_pool(client: &Client, pool: PortPool) -> Result<Applied, KubeError> {
    let api: Api<PortPool> = Api::all(client.clone());
    let name = pool.name_any();
    match api.create(&PostParams::default(), &pool).await {
        Ok(created) => {
            initialize_status(&api, created, None).await?;
            Ok(Applied::Created)
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            let mut existing = api
                .get(&name)
                .await
                .map_err(|e| KubeError::from_kube(e, POOLS.on("get", &name, None)))?;
            if existing.spec == pool.spec {
                return Ok(Applied::Unchanged);
            }
            existing.spec = pool.spec;
            // The resourceVersion just read makes this a compare-and-swap: a conflict is
            // reported (a rerun is safe) rather than overwriting someone else's change.
            api.replace(&name, &PostParams::default(), &existing)
                .await
                .map_err(|e| KubeError::from_kube(e, POOLS.on("update", &name, None)))?;
            Ok(Applied::Configured)
        }
        Err(e) => Err(KubeError::from_kube(e, POOLS.on("create", &name, None))),
    }
}

/// Delete a pool; refused while any PortAllocation holds ports in it, unless `force`.
pub async fn delete_pool(
    client: &Client,
    name: &str,
    force: bool,
) -> Result<DeletedPool, PoolError> {
    let pools: Api<PortPool> = Api::all(client.clone());
    let pool = get_pool(client, name).await?;
    if crate::ledger::is_sharded(&pool) {
        return super::shard_pools::delete_sharded_pool(client, pool, force).await;
    }
    let holders: Vec<String> = PoolRecord::load(pool.clone())
        .map(|r| {
            r.holders
                .values()
                .map(|h| format!("{} ({} ports)", h.owner, h.holdings.port_count()))
                .collect()
        })
        .unwrap_or_default();
    if !holders.is_empty() && !force {
        return Err(PoolError::Held {
            pool: name.to_string(),
            holders,
        });
    }
    // The resourceVersion precondition makes "no holders" and "deleted" one atomic step: an
    // allocation that lands in between makes this delete fail instead of orphaning its ports.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: if force { None } else { pool.resource_version() },
            uid: pool.uid(),
        }),
        ..Default::default()
    };
    match pools.delete(name, &params).await {
        Ok(_) => {
            tracing::info!("deleted PortPool {name} ({} holders)", holders.len());
            Ok(DeletedPool {
                holders: holders.len(),
            })
        }
        Err(kube::Error::Api(s)) if s.is_conflict() => Err(PoolError::Changed {
            pool: name.to_string(),
        }),
        Err(e) => Err(KubeError::from_kube(e, POOLS.on("delete", name, None)).into()),
    }
}

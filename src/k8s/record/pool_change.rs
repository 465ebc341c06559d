//! A pool's spec changing under its holders: what applying a PortPool would do, read before
//! anything is written, and the refusal of a change that would strand a holder (its ports
//! outside the new ranges, excluded, in another protocol, or in a copy past a lowered
//! `nodeReuse`), and applying a PortPool from a manifest under those rules.

use kube::api::Api;
use kube::{Client, ResourceExt};

use super::pools::{
    Applied, PoolError, carry_spec, create_shards, initialize_status, kube_error, pool_ports,
    pool_ports_to_write, read_pool, write_size,
};
use super::shards::ShardStore;
use crate::api::{PortPool, PortPoolSpec};
use crate::k8s::error::KubeError;
use crate::k8s::resources::POOLS;
use crate::ledger::{PoolRecord, PoolSnapshot, spec_differences, stranded_holders};

/// What creating or applying a pool would do, decided before anything is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolPlan {
    Create,
    Unchanged,
    /// The pool exists with another spec: `field: old -> new` for each field; no holder would
    /// be stranded by it.
    Change {
        differences: Vec<String>,
    },
}

/// What applying `pool` would do, read before anything is written: created, unchanged, or
/// changed (with what differs). A change that would leave a holder without its ports (outside
/// the new ranges, excluded, another protocol, a copy past a lowered `nodeReuse`) is refused
/// with the holders named, here and again by [`apply_pool`] itself.
pub async fn plan_pool(client: &Client, pool: &PortPool) -> Result<PoolPlan, PoolError> {
    let name = pool.name_any();
    pool_ports(pool)?;
    let existing = read_pool(client, &name)
        .await
        .map_err(|e| KubeError::from_kube(e, POOLS.on("get", &name, None)))?;
    let Some(existing) = existing else {
        return Ok(PoolPlan::Create);
    };
    if existing.spec == pool.spec {
        return Ok(PoolPlan::Unchanged);
    }
    refuse_stranding(client, &existing, &pool.spec).await?;
    Ok(PoolPlan::Change {
        differences: spec_differences(&existing.spec, &pool.spec),
    })
}

/// A new spec for `existing` must keep every holder's ports in the pool and in its protocol,
/// and no copy past a lowered `nodeReuse` may hold ports.
pub(super) async fn refuse_stranding(
    client: &Client,
    existing: &PortPool,
    spec: &PortPoolSpec,
) -> Result<(), PoolError> {
    let name = existing.name_any();
    if spec.follow_nodes.is_none() && spec.reuse() < existing.spec.reuse() {
        refuse_reuse_below_use(client, existing, spec.reuse()).await?;
    }
    let pool_uid = existing.uid().unwrap_or_default();
    let shards = ShardStore::new(client.clone())
        .list(&name)
        .await
        .map_err(kube_error)?;
    let entries = shards
        .iter()
        .filter(|s| s.spec.pool_uid == pool_uid)
        .flat_map(|s| s.status.iter().flat_map(|st| st.holders.iter()));
    let protocol_changes = spec.protocol != existing.spec.protocol;
    let holders =
        stranded_holders(spec, protocol_changes, entries).map_err(|error| PoolError::Invalid {
            pool: name.clone(),
            error,
        })?;
    if holders.is_empty() {
        return Ok(());
    }
    Err(PoolError::Strands {
        pool: name,
        holders,
    })
}

/// Lowering `nodeReuse` to `asked` must leave no holder in a copy past it.
async fn refuse_reuse_below_use(
    client: &Client,
    pool: &PortPool,
    asked: u16,
) -> Result<(), PoolError> {
    let name = pool.name_any();
    let shards = ShardStore::new(client.clone())
        .list(&name)
        .await
        .map_err(kube_error)?;
    let record = PoolRecord::load(PoolSnapshot::of_pool(pool), shards).map_err(|error| {
        PoolError::Invalid {
            pool: name.clone(),
            error,
        }
    })?;
    let Some(&last) = record.copies_in_use().last() else {
        return Ok(());
    };
    if last < asked {
        return Ok(());
    }
    let mut holders: Vec<String> = record
        .copies
        .range(asked..)
        .flat_map(|(_, copy)| copy.shards.values())
        .flat_map(|shard| shard.record.holders.values().map(|h| h.owner.clone()))
        .collect();
    holders.sort();
    holders.dedup();
    Err(PoolError::ReuseInUse {
        pool: name,
        asked,
        in_use: last + 1,
        holders,
    })
}

/// Create the pool, or update its spec if it differs (a manifest applied again); a changed
/// spec is then written to every shard, so clients that read only a shard decide under it.
pub async fn apply_pool(client: &Client, pool: PortPool) -> Result<Applied, PoolError> {
    let api: Api<PortPool> = Api::all(client.clone());
    let name = pool.name_any();
    let ports = pool_ports_to_write(&pool)?;
    match api.create(&crate::k8s::client::write_params(), &pool).await {
        Ok(created) => {
            let written = initialize_status(&api, created, &ports).await?;
            create_shards(client, &written).await?;
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
            refuse_stranding(client, &existing, &pool.spec).await?;
            existing.spec = pool.spec;
            // The resourceVersion just read makes this a compare-and-swap: a conflict is
            // reported (a rerun is safe) rather than overwriting someone else's change.
            let updated = api
                .replace(&name, &crate::k8s::client::write_params(), &existing)
                .await
                .map_err(|e| KubeError::from_kube(e, POOLS.on("update", &name, None)))?;
            // The usage summary stays until the watcher counts under the new spec.
            write_size(&api, updated, ports.len()).await?;
            carry_spec(client, &name).await?;
            Ok(Applied::Configured)
        }
        Err(e) => Err(KubeError::from_kube(e, POOLS.on("create", &name, None)).into()),
    }
}

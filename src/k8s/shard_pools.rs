//! Deleting a sharded pool: refused while any of its shards holds an entry (as a one-object
//! pool is refused while its status does), then the PortPool and its shards are deleted. The
//! shards go by list, not by garbage collection: nothing may be assumed to run one.

use std::collections::BTreeMap;

use kube::api::{Api, DeleteParams, Preconditions};
use kube::{Client, ResourceExt};

use super::error::{KubeError, Target};
use super::pools::{DeletedPool, PoolError};
use super::resources::{POOLS, SHARDS};
use super::shards::ShardStore;
use crate::api::{PortPool, PortPoolShard};
use crate::core::Holdings;

fn kube_error((e, target): (kube::Error, Target)) -> KubeError {
    KubeError::from_kube(e, target)
}

/// `owner (N ports)` for every holder listed in the pool's own shards (by UID, the parts of a
/// spanning owner added up), sorted.
fn holders_of(pool_uid: &str, shards: &[PortPoolShard]) -> Vec<String> {
    let mut by_uid: BTreeMap<&str, (&str, u32)> = BTreeMap::new();
    let entries = shards
        .iter()
        .filter(|s| s.spec.pool_uid == pool_uid)
        .flat_map(|s| s.status.iter().flat_map(|st| st.holders.iter()));
    for entry in entries {
        let ports = Holdings::decode(&entry.ports).map_or(0, |h| h.port_count());
        let seen = by_uid.entry(&entry.uid).or_insert((&entry.owner, 0));
        seen.1 += ports;
    }
    let mut holders: Vec<String> = by_uid
        .values()
        .map(|(owner, ports)| format!("{owner} ({ports} ports)"))
        .collect();
    holders.sort();
    holders
}

/// Delete a sharded pool; refused while held, unless `force`.
///
/// The pool goes first (with its UID as precondition), so no new allocation starts; then its
/// shards, each only at the version listed unless `force`. A shard that an allocation already
/// under way wrote between the check and the delete is kept, and counted as held: its
/// PortAllocation's status records the ports, and recreating the pool and `repair` restore them.
pub(super) async fn delete_sharded_pool(
    client: &Client,
    pool: PortPool,
    force: bool,
) -> Result<DeletedPool, PoolError> {
    let name = pool.name_any();
    let pool_uid = pool.uid().unwrap_or_default();
    let store = ShardStore::new(client.clone());
    let holders = holders_of(&pool_uid, &store.list(&name).await.map_err(kube_error)?);
    if !holders.is_empty() && !force {
        return Err(PoolError::Held {
            pool: name,
            holders,
        });
    }
    let pools: Api<PortPool> = Api::all(client.clone());
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: if force { None } else { pool.resource_version() },
            uid: pool.uid(),
        }),
        ..Default::default()
    };
    match pools.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            return Err(PoolError::Changed { pool: name });
        }
        Err(e) => return Err(KubeError::from_kube(e, POOLS.on("delete", &name, None)).into()),
    }
    let shards: Vec<PortPoolShard> = store
        .list(&name)
        .await
        .map_err(kube_error)?
        .into_iter()
        .filter(|s| s.spec.pool_uid == pool_uid)
        .collect();
    let api: Api<PortPoolShard> = Api::all(client.clone());
    let mut kept = Vec::new();
    for shard in shards {
        let held = shard.status.as_ref().is_some_and(|s| !s.holders.is_empty());
        if held && !force {
            kept.push(shard);
            continue;
        }
        let shard_name = shard.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: if force {
                    None
                } else {
                    shard.resource_version()
                },
                uid: shard.uid(),
            }),
            ..Default::default()
        };
        match api.delete(&shard_name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            // Written since the list: someone's ports are in it now; keep it.
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                if let Some(current) = store.get(&shard_name).await.map_err(kube_error)? {
                    kept.push(current);
                }
            }
            Err(e) => {
                return Err(KubeError::from_kube(e, SHARDS.on("delete", &shard_name, None)).into());
            }
        }
    }
    let recorded = if force {
        holders.len()
    } else {
        holders_of(&pool_uid, &kept).len()
    };
    if !kept.is_empty() {
        tracing::warn!(
            "PortPool {name} deleted; {} shards kept: they were written during the delete",
            kept.len()
        );
    }
    tracing::info!("deleted PortPool {name} and its shards ({recorded} holders)");
    Ok(DeletedPool { holders: recorded })
}

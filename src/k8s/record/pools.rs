//! PortPools: reading, creating (with every shard of its record, so the first allocation in
//! each window reads one object), carrying a changed spec to every shard, and deleting only
//! while no shard holds a port. Applying a manifest's pool is in `pool_change`.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};

use super::shards::ShardStore;
use crate::api::{PortPool, PortPoolShard, PortPoolStatus, Protocol, SpecError};
use crate::core::{Holdings, PortSet};
use crate::k8s::error::{ApiErrorKind, KubeError, Target};
use crate::k8s::resources::{POOL_STATUS, POOLS, SHARDS};
use crate::k8s::retry::{Attempts, RetryPolicy, Stop};
use crate::ledger::{
    PoolOverlap, PoolRecord, PoolSnapshot, ShardKey, ShardRecord, all_overlaps, load_shard,
    new_shard, overlapping_pool, spec_differences,
};

/// Shard writes in flight at once when a pool is created or its spec carried to its shards.
const SHARD_WRITES_AT_ONCE: usize = 8;

/// Why a pool could not be created or deleted.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("PortPool {pool:?}: {error}")]
    Invalid { pool: String, error: SpecError },

    #[error(
        "PortPool {pool:?} would share {protocol} ports {} with PortPool {:?} ({}): a port could \
         then be handed out by both; choose ranges clear of it, or, if the two pools' pods never \
         run on one node, pass --allow-overlap and set spec.allowOverlap: true on {:?} too",
        .overlap.shared,
        .overlap.other,
        .overlap.other_ports,
        .overlap.other
    )]
    Overlaps {
        pool: String,
        protocol: Protocol,
        overlap: Box<PoolOverlap>,
    },

    #[error("{}", already_exists(.pool, .differences))]
    AlreadyExists {
        pool: String,
        /// `field: old -> new` for each field the asked spec changes; empty when unknown.
        differences: Vec<String>,
    },

    #[error(
        "PortPool {pool:?}: the new spec would strand {} holders: {}; nothing was changed. Keep \
         their ports in the pool, or release those PortAllocations first (`kubectl portalloc \
         release NAME -n NAMESPACE`)",
        .holders.len(),
        .holders.join(", ")
    )]
    Strands { pool: String, holders: Vec<String> },

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

    #[error(
        "PortPool {pool:?}: nodeReuse {asked} would leave copies {asked}-{} of its ports, which \
         hold ports of {}, past the setting; nothing was changed. Keep nodeReuse at {in_use} or \
         more, or release those PortAllocations first (`kubectl portalloc release NAME -n \
         NAMESPACE`)",
        .in_use - 1,
        .holders.join(", ")
    )]
    ReuseInUse {
        pool: String,
        asked: u16,
        /// Copies 0 to in_use-1 hold ports.
        in_use: u16,
        holders: Vec<String>,
    },

    #[error(transparent)]
    Kube(#[from] KubeError),
}

fn already_exists(pool: &str, differences: &[String]) -> String {
    if differences.is_empty() {
        return format!(
            "PortPool {pool:?} already exists: see it with `kubectl portalloc pool describe {pool}`"
        );
    }
    format!(
        "PortPool {pool:?} already exists and differs ({}); nothing was changed. To change it, \
         apply its manifest with `kubectl portalloc create -f FILE --force`; to keep it, use \
         another name",
        differences.join("; ")
    )
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
    list_pools_matching(client, None).await
}

/// [`list_pools`] of those whose labels match `selector` (as `kubectl -l` takes it).
pub async fn list_pools_matching(
    client: &Client,
    selector: Option<&str>,
) -> Result<Vec<PortPool>, KubeError> {
    let pools: Api<PortPool> = Api::all(client.clone());
    let mut params = ListParams::default();
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    let mut items = pools
        .list(&params)
        .await
        .map_err(|e| KubeError::from_kube(e, POOLS.all("list", None)))?
        .items;
    items.sort_by_key(|p| p.name_any());
    Ok(items)
}

/// A pool spec fit to be written: its ports, and no guard the kernel cannot apply. Pools
/// already stored are read with [`pool_ports`] alone, so an SCTP pool stored with a guard (one
/// this refuses) still hands out its ports.
pub(super) fn pool_ports_to_write(pool: &PortPool) -> Result<PortSet, PoolError> {
    pool.spec
        .check_guard()
        .map_err(|error| PoolError::Invalid {
            pool: pool.name_any(),
            error,
        })?;
    pool_ports(pool)
}

/// The pool's port set, or why its spec is unusable.
pub fn pool_ports(pool: &PortPool) -> Result<PortSet, PoolError> {
    pool.spec.port_set().map_err(|error| PoolError::Invalid {
        pool: pool.name_any(),
        error,
    })
}

/// What `pool describe` and `repair` say of the pools `name` shares ports with, written before
/// the admission policy (or with it absent); a listing that fails is said too.
pub async fn pool_overlaps_of(client: &Client, name: &str) -> Vec<String> {
    match list_pools(client).await {
        Ok(pools) => all_overlaps(&pools)
            .into_iter()
            .filter(|o| o.pool == name)
            .map(|o| o.describe())
            .collect(),
        Err(e) => vec![format!(
            "could not check whether PortPool {name} shares ports with another pool: {e}"
        )],
    }
}

/// Create a pool, refusing one that overlaps a pool of the same protocol unless
/// `allow_overlap` (which also sets its `spec.allowOverlap`: where the portalloc-pool-overlap
/// policy is installed, the API server still refuses it unless the other pool allows it too),
/// then every shard of its record, empty and carrying its spec. Returns the pool as written.
pub async fn create_pool(
    client: &Client,
    pool: PortPool,
    allow_overlap: bool,
) -> Result<PortPool, PoolError> {
    Ok(create_or_keep_pool(client, pool, allow_overlap).await?.0)
}

/// [`create_pool`], except that a pool of that name with the same spec is kept as it is
/// (`Applied::Unchanged`, as `kubectl apply` says) and one with another spec is refused with
/// what differs (`AlreadyExists`), never mistaken for an overlap with itself.
pub async fn create_or_keep_pool(
    client: &Client,
    mut pool: PortPool,
    allow_overlap: bool,
) -> Result<(PortPool, Applied), PoolError> {
    let name = pool.name_any();
    let ports = pool_ports_to_write(&pool)?;
    pool.spec.allow_overlap |= allow_overlap;
    if !allow_overlap {
        let mut others = list_pools(client).await?;
        if let Some(at) = others.iter().position(|p| p.name_any() == name) {
            return keep_existing(others.swap_remove(at), pool);
        }
        if let Some(overlap) = overlapping_pool(&name, &pool.spec, &others) {
            return Err(PoolError::Overlaps {
                pool: name,
                protocol: pool.spec.protocol,
                overlap: Box::new(overlap),
            });
        }
    }
    let pools: Api<PortPool> = Api::all(client.clone());
    let created = match pools
        .create(&crate::k8s::client::write_params(), &pool)
        .await
    {
        Ok(created) => created,
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            let existing = get_pool(client, &name).await?;
            return keep_existing(existing, pool);
        }
        Err(e) => return Err(KubeError::from_kube(e, POOLS.on("create", &name, None)).into()),
    };
    tracing::info!("created PortPool {name}: {ports}");
    let written = initialize_status(&pools, created, &ports).await?;
    create_shards(client, &written).await?;
    Ok((written, Applied::Created))
}

/// The existing pool when it is what was asked, else why not.
fn keep_existing(existing: PortPool, asked: PortPool) -> Result<(PortPool, Applied), PoolError> {
    if existing.spec == asked.spec {
        return Ok((existing, Applied::Unchanged));
    }
    Err(PoolError::AlreadyExists {
        pool: asked.name_any(),
        differences: spec_differences(&existing.spec, &asked.spec),
    })
}

/// The size for the printer column from the start.
pub(super) async fn initialize_status(
    pools: &Api<PortPool>,
    created: PortPool,
    ports: &PortSet,
) -> Result<PortPool, KubeError> {
    write_size(pools, created, ports.len()).await
}

/// Write the pool's size on its status (a compare-and-swap on `pool` as read), keeping the rest
/// (the watcher's usage summary). The watcher writes the status too: after a conflict, read
/// again and write again, the size then by the spec read, as long as that spec is unchanged.
pub(super) async fn write_size(
    pools: &Api<PortPool>,
    mut pool: PortPool,
    size: u32,
) -> Result<PortPool, KubeError> {
    let name = pool.name_any();
    let spec = pool.spec.clone();
    let mut attempts = 0;
    loop {
        pool.status = Some(PortPoolStatus {
            size: i32::try_from(size).unwrap_or(i32::MAX),
            ..pool.status.take().unwrap_or_default()
        });
        attempts += 1;
        match pools
            .replace_status(&name, &crate::k8s::client::write_params(), &pool)
            .await
        {
            Ok(written) => return Ok(written),
            Err(kube::Error::Api(s)) if s.is_conflict() && attempts < 3 => {
                pool = pools
                    .get(&name)
                    .await
                    .map_err(|e| KubeError::from_kube(e, POOLS.on("get", &name, None)))?;
                if pool.spec != spec {
                    // Someone else changed the spec, and writes its size.
                    return Ok(pool);
                }
            }
            Err(e) => {
                return Err(KubeError::from_kube(
                    e,
                    POOL_STATUS.on("update", &name, None),
                ));
            }
        }
    }
}

/// Every shard of a new pool's first copy, empty, with the pool's spec (the shards of further
/// copies, `nodeReuse`, come with their first holder). A shard someone else created first (an
/// allocation into the new pool) is theirs and stays as it is.
pub(super) async fn create_shards(client: &Client, pool: &PortPool) -> Result<(), PoolError> {
    let copy = PoolSnapshot::of_pool(pool);
    let layout = copy.layout().map_err(|error| PoolError::Invalid {
        pool: copy.name.clone(),
        error,
    })?;
    let store = ShardStore::new(client.clone());
    let writes: Vec<_> = layout
        .shards()
        .iter()
        .map(|span| {
            let key = ShardKey::first(span.index);
            let record = load_shard(&copy, &layout, span.index, new_shard(&copy, key));
            ShardRecord::new(key, record).write(&copy, true)
        })
        .collect();
    stream::iter(&writes)
        .map(|write| {
            let (store, copy) = (store.clone(), &copy);
            async move {
                match store.commit(copy, write).await {
                    Ok(_) => Ok(()),
                    Err((kube::Error::Api(s), _)) if s.is_conflict() => Ok(()),
                    Err((e, target)) => Err(KubeError::from_kube(e, target)),
                }
            }
        })
        .buffer_unordered(SHARD_WRITES_AT_ONCE)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Write the pool's current spec to every shard that carries an older one, re-reading after a
/// conflict (a shard another client wrote meanwhile may still carry the old spec).
pub async fn carry_spec(client: &Client, name: &str) -> Result<(), PoolError> {
    let store = ShardStore::new(client.clone());
    let mut attempts = Attempts::new(RetryPolicy::default());
    let label = format!("PortPool {name}: carrying its spec to its shards");
    loop {
        let pool = get_pool(client, name).await?;
        let shards = store.list(name).await.map_err(kube_error)?;
        let sharded = PoolRecord::load(PoolSnapshot::of_pool(&pool), shards).map_err(|error| {
            PoolError::Invalid {
                pool: name.into(),
                error,
            }
        })?;
        let writes = sharded.writes(true);
        let results: Vec<_> = stream::iter(&writes)
            .map(|write| {
                let (store, copy) = (store.clone(), &sharded.pool);
                async move { store.commit(copy, write).await }
            })
            .buffer_unordered(SHARD_WRITES_AT_ONCE)
            .collect()
            .await;
        let Some((e, target)) = results.into_iter().find_map(Result::err) else {
            return Ok(());
        };
        match attempts.backoff(e, target, &label).await {
            Ok(()) => {}
            Err(Stop::Final(e)) => return Err(e.into()),
            Err(Stop::Exhausted(exhausted)) => {
                return Err(KubeError::new(
                    ApiErrorKind::Conflict,
                    SHARDS.all("update", None),
                    format!(
                        "{label}: gave up after {} attempts ({} conflicts; last: {}); run the command again",
                        exhausted.attempts, exhausted.conflicts, exhausted.last
                    ),
                )
                .into());
            }
        }
    }
}

pub(super) fn kube_error((e, target): (kube::Error, Target)) -> KubeError {
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

/// Delete a pool; refused while any of its shards holds an entry, unless `force`.
///
/// The pool goes first (with its resourceVersion and UID as preconditions), so no new
/// allocation starts; then its shards, each only at the version listed unless `force`. A shard
/// that an allocation already under way wrote between the check and the delete is kept, and
/// counted as held: its PortAllocation's status records the ports, and recreating the pool and
/// `repair` restore them. The shards go by list, not by garbage collection: nothing may be
/// assumed to run one.
pub async fn delete_pool(
    client: &Client,
    name: &str,
    force: bool,
) -> Result<DeletedPool, PoolError> {
    let pool = get_pool(client, name).await?;
    let pool_uid = pool.uid().unwrap_or_default();
    let store = ShardStore::new(client.clone());
    let holders = holders_of(&pool_uid, &store.list(name).await.map_err(kube_error)?);
    if !holders.is_empty() && !force {
        return Err(PoolError::Held {
            pool: name.into(),
            holders,
        });
    }
    let pools: Api<PortPool> = Api::all(client.clone());
    let (mut pool, mut attempts) = (pool, 0);
    loop {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: if force { None } else { pool.resource_version() },
                uid: pool.uid(),
            }),
            ..Default::default()
        };
        attempts += 1;
        match pools.delete(name, &params).await {
            Ok(_) => break,
            // The watcher's usage count changes the version, not the spec (its generation).
            Err(kube::Error::Api(s)) if s.is_conflict() && attempts < 3 => {
                let current = get_pool(client, name).await?;
                if current.uid() != pool.uid()
                    || current.metadata.generation != pool.metadata.generation
                {
                    return Err(PoolError::Changed { pool: name.into() });
                }
                pool = current;
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                return Err(PoolError::Changed { pool: name.into() });
            }
            Err(e) => return Err(KubeError::from_kube(e, POOLS.on("delete", name, None)).into()),
        }
    }
    let shards: Vec<PortPoolShard> = store
        .list(name)
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

/// The pool object, `None` when it does not exist. The raw error otherwise, for the retry loop.
pub(crate) async fn read_pool(
    client: &kube::Client,
    pool: &str,
) -> Result<Option<PortPool>, kube::Error> {
    let pools: Api<PortPool> = Api::all(client.clone());
    match pools.get(pool).await {
        Ok(pool) => Ok(Some(pool)),
        Err(kube::Error::Api(status))
            if status.is_not_found() && !crate::k8s::error::is_unknown_resource(&status) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

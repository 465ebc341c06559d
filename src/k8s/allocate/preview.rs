//! Dry runs of `create`, `sync`, `release` and `delete`, and `diff`: the pool is read fresh
//! (never a kept copy), every item is decided as the real command would decide it
//! ([`crate::ledger::preview`]) against one in-memory copy of each pool, and nothing is stored.
//! A server-side dry run also sends each write the command would make with `dryRun=All`, so the
//! API server's schema, admission policies and RBAC judge them; it still stores nothing.

use std::collections::BTreeMap;

use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};

use crate::api::{PortAllocation, PortPool};
use crate::k8s::error::KubeError;
use crate::k8s::record::{Applied, ShardStore, read_pool};
use crate::k8s::resources::{ALLOCATION_STATUS, ALLOCATIONS, POOLS};
use crate::ledger::{
    BatchItem, ItemOutcome, Operation, Outcome, PoolRecord, PoolSnapshot, PortChanges, Refusal,
    allocation_status, known_shards, owner_of, preview as preview_in,
};

/// Where a dry run stops: before any request that writes (`Client`), or at the API server,
/// which checks each write and stores none (`Server`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DryRun {
    Client,
    Server,
}

/// What a dry run is asked to preview for one PortAllocation.
#[derive(Clone, Debug)]
pub enum Intent {
    /// `create -f`: the manifest's object, created or updated, then allocated.
    Apply,
    /// `sync`: the object as stored.
    Sync,
    /// `release [--role R]`.
    Release { role: Option<String> },
    /// `delete`: the object goes, and its ports with it.
    Delete,
}

/// One PortAllocation's dry run.
#[derive(Clone, Debug)]
pub struct Preview {
    /// The object as it would be stored, with the status the command would write.
    pub allocation: PortAllocation,
    /// Whether it exists now (a manifest's object may not).
    pub exists: bool,
    /// Whether its spec (or labels) would change (`create -f` of an existing object).
    pub updated: bool,
    pub changes: PortChanges,
    /// Why the command would fail for this object; it then changes nothing.
    pub refusal: Option<Refusal>,
}

/// Preview `items` in order; `Apply` items are manifests (looked up by name), the others
/// objects as read. `new_pools`: PortPools of the same manifest, which items of a pool that
/// does not exist yet are previewed against (empty, as they would be created).
pub async fn preview(
    client: &Client,
    items: Vec<(PortAllocation, Intent)>,
    mode: DryRun,
    new_pools: &[PortPool],
) -> Result<Vec<Preview>, KubeError> {
    let mut pools: BTreeMap<String, Result<PoolRecord, Refusal>> = BTreeMap::new();
    let mut rng = rand::rng();
    let mut previews = Vec::new();
    for (object, intent) in items {
        let (mut pa, exists, updated) = match intent {
            Intent::Apply => current_version(client, object).await?,
            _ => (object, true, false),
        };
        let uid = pa
            .uid()
            .unwrap_or_else(|| format!("dry-run:{}", owner_of(&pa)));
        let operation = match &intent {
            Intent::Apply | Intent::Sync => Operation::sync_of(&pa),
            Intent::Release { role } => Ok(Operation::Release { role: role.clone() }),
            Intent::Delete => Ok(Operation::Remove),
        };
        let pool_name = pa.spec.pool.clone();
        if !pools.contains_key(&pool_name) {
            let new_pool = new_pools.iter().find(|p| p.name_any() == pool_name);
            let loaded = load_pool(client, &pool_name, &owner_of(&pa), new_pool).await?;
            pools.insert(pool_name.clone(), loaded);
        }
        let record = match pools.get_mut(&pool_name).expect("loaded above") {
            Ok(record) => record,
            Err(refusal) => {
                let refusal = match refusal {
                    Refusal::PoolNotFound { pool, .. } => Refusal::PoolNotFound {
                        pool: pool.clone(),
                        owner: owner_of(&pa),
                    },
                    other => other.clone(),
                };
                previews.push(refused(pa, exists, updated, refusal));
                continue;
            }
        };
        let item = BatchItem {
            known: known_shards(pa.status.as_ref(), &record.layout, &owner_of(&pa)),
            uid,
            owner: owner_of(&pa),
            operation,
        };
        let previewed = preview_in(record, &item, &mut rng);
        let changes = previewed.changes();
        let refusal = match &previewed.outcome {
            ItemOutcome::Refused { refusal, .. } => Some(refusal.clone()),
            _ => None,
        };
        if refusal.is_none() {
            let holdings = previewed.outcome.holdings();
            let released = changes.port_counts().2 as usize;
            let outcome = match &item.operation {
                Ok(operation) if operation.released_on_purpose(holdings, released) => {
                    Outcome::Released
                }
                _ => Outcome::Converged,
            };
            let mut status = allocation_status(&pa, holdings, Some(&record.pool.uid), outcome);
            status.shards = crate::ledger::status_shards(&record.shards_of(&item.uid));
            crate::ledger::set_slot_copies(&mut status, &record.spread_copies(&item.uid));
            pa.status = Some(status);
            if mode == DryRun::Server {
                let writes = &previewed.writes;
                send_dry_run(
                    client,
                    &pa,
                    (exists, updated),
                    &intent,
                    &record.pool,
                    writes,
                )
                .await?;
            }
        }
        previews.push(Preview {
            allocation: pa,
            exists,
            updated,
            changes,
            refusal,
        });
    }
    Ok(previews)
}

fn refused(pa: PortAllocation, exists: bool, updated: bool, refusal: Refusal) -> Preview {
    Preview {
        allocation: pa,
        exists,
        updated,
        changes: PortChanges::default(),
        refusal: Some(refusal),
    }
}

/// What `create -f` of this PortPool would do, asking the API server too (`dryRun=All`) in a
/// server-side dry run.
pub async fn preview_pool(
    client: &Client,
    pool: &PortPool,
    mode: DryRun,
) -> Result<Applied, KubeError> {
    let name = pool.name_any();
    let api: Api<PortPool> = Api::all(client.clone());
    let stored = read_pool(client, &name)
        .await
        .map_err(|e| KubeError::from_kube(e, POOLS.on("get", &name, None)))?;
    let dry_run = PostParams {
        dry_run: true,
        ..crate::k8s::client::write_params()
    };
    match stored {
        None => {
            if mode == DryRun::Server {
                api.create(&dry_run, pool)
                    .await
                    .map_err(|e| KubeError::from_kube(e, POOLS.on("create", &name, None)))?;
            }
            Ok(Applied::Created)
        }
        Some(stored) if stored.spec == pool.spec => Ok(Applied::Unchanged),
        Some(mut stored) => {
            if mode == DryRun::Server {
                stored.spec = pool.spec.clone();
                api.replace(&name, &dry_run, &stored)
                    .await
                    .map_err(|e| KubeError::from_kube(e, POOLS.on("update", &name, None)))?;
            }
            Ok(Applied::Configured)
        }
    }
}

/// The manifest's object with what the stored one has that a create would keep (UID, status,
/// resourceVersion), whether it exists, and whether its spec or labels would change.
async fn current_version(
    client: &Client,
    mut pa: PortAllocation,
) -> Result<(PortAllocation, bool, bool), KubeError> {
    let namespace = pa.namespace().unwrap_or_default();
    let name = pa.name_any();
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &namespace);
    let stored = api
        .get_opt(&name)
        .await
        .map_err(|e| KubeError::from_kube(e, ALLOCATIONS.on("get", &name, Some(&namespace))))?;
    let Some(stored) = stored else {
        return Ok((pa, false, false));
    };
    let updated = stored.spec != pa.spec
        || pa
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| Some(l) != stored.metadata.labels.as_ref());
    pa.metadata.uid = stored.metadata.uid.clone();
    pa.metadata.resource_version = stored.metadata.resource_version.clone();
    pa.metadata.generation = stored.metadata.generation;
    pa.status = stored.status.clone();
    Ok((pa, true, updated))
}

/// The pool and every shard, read now; a missing pool is the refusal every item of it gets.
async fn load_pool(
    client: &Client,
    pool: &str,
    owner: &str,
    new_pool: Option<&PortPool>,
) -> Result<Result<PoolRecord, Refusal>, KubeError> {
    let read = read_pool(client, pool)
        .await
        .map_err(|e| KubeError::from_kube(e, POOLS.on("get", pool, None)))?;
    if let (None, Some(new_pool)) = (&read, new_pool) {
        let loaded = PoolRecord::load(PoolSnapshot::of_pool(new_pool), Vec::new());
        return Ok(loaded.map_err(|error| Refusal::PoolSpec {
            pool: pool.into(),
            error,
        }));
    }
    let Some(read) = read else {
        return Ok(Err(Refusal::PoolNotFound {
            pool: pool.into(),
            owner: owner.into(),
        }));
    };
    let shards = ShardStore::new(client.clone())
        .list(pool)
        .await
        .map_err(|(e, target)| KubeError::from_kube(e, target))?;
    let mut copy = PoolSnapshot::of_pool(&read);
    crate::k8s::nodes::count_if_unknown(client, &mut copy).await;
    Ok(
        PoolRecord::load(copy, shards).map_err(|error| Refusal::PoolSpec {
            pool: pool.into(),
            error,
        }),
    )
}

/// The writes the real command would make, each with `dryRun=All`, in its order.
async fn send_dry_run(
    client: &Client,
    pa: &PortAllocation,
    (exists, updated): (bool, bool),
    intent: &Intent,
    pool: &PoolSnapshot,
    writes: &[crate::ledger::ShardWrite],
) -> Result<(), KubeError> {
    let namespace = pa.namespace().unwrap_or_default();
    let name = pa.name_any();
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..crate::k8s::client::write_params()
    };
    let at = |verb| ALLOCATIONS.on(verb, &name, Some(&namespace));
    if matches!(intent, Intent::Apply) && !exists {
        let mut new = pa.clone();
        new.status = None;
        new.metadata.uid = None;
        api.create(&dry_run, &new)
            .await
            .map_err(|e| KubeError::from_kube(e, at("create")))?;
    } else if updated {
        api.replace(&name, &dry_run, pa)
            .await
            .map_err(|e| KubeError::from_kube(e, at("update")))?;
    }
    // A pool that does not exist yet (created by the same manifest) has no UID for its shards
    // to name: its shard writes cannot be checked before it is stored.
    let store = ShardStore::new(client.clone());
    for write in writes.iter().filter(|_| !pool.uid.is_empty()) {
        store.commit_dry_run(pool, write).await?;
    }
    match intent {
        Intent::Delete => {
            let params = DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            };
            api.delete(&name, &params)
                .await
                .map_err(|e| KubeError::from_kube(e, at("delete")))?;
        }
        // An object not stored yet has no status to write.
        _ if exists => {
            api.replace_status(&name, &dry_run, pa).await.map_err(|e| {
                KubeError::from_kube(e, ALLOCATION_STATUS.on("update", &name, Some(&namespace)))
            })?;
        }
        _ => {}
    }
    Ok(())
}

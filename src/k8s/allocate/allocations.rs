//! PortAllocations: reading, applying from a manifest (create or update, then allocate), and
//! deleting (the object first, then its pool entry).

use crate::k8s::error::error_chain;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};

use super::allocator::{AllocateError, Allocator};
use super::sync::SyncReport;
use crate::api::PortAllocation;
use crate::k8s::error::{ApiErrorKind, KubeError};
use crate::k8s::resources::ALLOCATIONS;
use crate::k8s::retry::{Attempts, Stop};
use crate::ledger::{Refusal, owner_of};

/// Why applying a PortAllocation from a manifest did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(
        "PortAllocation {owner}: spec.pool is immutable ({from:?} -> {to:?}): delete it with \
         `kubectl portalloc delete {name} -n {namespace}` and create it again"
    )]
    PoolChanged {
        owner: String,
        name: String,
        namespace: String,
        from: String,
        to: String,
    },

    #[error(transparent)]
    Allocate(#[from] AllocateError),
}

impl From<KubeError> for ApplyError {
    fn from(e: KubeError) -> Self {
        ApplyError::Allocate(AllocateError::Kube(e))
    }
}

impl From<Refusal> for ApplyError {
    fn from(r: Refusal) -> Self {
        ApplyError::Allocate(AllocateError::Refused(r))
    }
}

pub async fn get_allocation(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<PortAllocation, KubeError> {
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), namespace);
    api.get(name).await.map_err(|e| {
        KubeError::from_kube(e, ALLOCATIONS.on("get", name, Some(namespace)))
            .with_hint(": list them with `kubectl portalloc get -A`")
    })
}

/// All PortAllocations in `namespace`, or in every namespace; sorted by namespace and name.
pub async fn list_allocations(
    client: &Client,
    namespace: Option<&str>,
) -> Result<Vec<PortAllocation>, KubeError> {
    list_allocations_matching(client, namespace, None).await
}

/// [`list_allocations`] of those whose labels match `selector` (a label selector, as
/// `kubectl -l` takes it; the API server applies it).
pub async fn list_allocations_matching(
    client: &Client,
    namespace: Option<&str>,
    selector: Option<&str>,
) -> Result<Vec<PortAllocation>, KubeError> {
    let api: Api<PortAllocation> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut params = ListParams::default();
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    let mut items = list_in_pages(&api, &params)
        .await
        .map_err(|e| KubeError::from_kube(e, ALLOCATIONS.all("list", namespace)))?;
    items.sort_by_key(|pa| (pa.namespace(), pa.name_any()));
    Ok(items)
}

/// Every PortAllocation `params` selects, in pages, without `managedFields`
/// ([`crate::k8s::pages`]).
pub(crate) async fn list_in_pages(
    api: &Api<PortAllocation>,
    params: &ListParams,
) -> Result<Vec<PortAllocation>, kube::Error> {
    crate::k8s::pages::list_all(api, params).await
}

/// Create the PortAllocation (or update an existing one's spec) and allocate its ports.
///
/// Four requests when nothing contends and the pool's spec is known: read the home shard (the
/// check), create the PortAllocation, write the shard, write the PortAllocation's status. A new
/// object whose ports cannot be allocated is never created (or, if the pool changed between the
/// check and the write, removed again); an existing one keeps its ports when re-applied.
pub async fn apply_allocation(
    allocator: &Allocator,
    client: &Client,
    pa: PortAllocation,
) -> Result<SyncReport, ApplyError> {
    let namespace = pa.namespace().unwrap_or_default();
    let name = pa.name_any();
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &namespace);
    let get_target = || ALLOCATIONS.on("get", &name, Some(&namespace));
    if let Err(refused) = allocator.precheck(&pa, false).await {
        if refused.refusal().is_none() {
            return Err(refused.into());
        }
        // Refused as a new object: only an existing one (whose own ports count as free for it)
        // can still go ahead. Either way nothing has been written yet.
        let existing = api
            .get_opt(&name)
            .await
            .map_err(|e| KubeError::from_kube(e, get_target()))?;
        return match existing {
            Some(existing) => update_existing(allocator, &api, existing, pa).await,
            None => Err(refused.into()),
        };
    }
    let mut to_create = pa.clone();
    to_create.status = None;
    match api
        .create(&crate::k8s::client::write_params(), &to_create)
        .await
    {
        Ok(created) => match allocator.sync(created.clone()).await {
            Ok(report) => Ok(report),
            Err(e) => {
                // The pool changed under us and no longer fits: undo, so a refused create
                // leaves nothing behind.
                remove_created(&api, &created).await;
                Err(e.into())
            }
        },
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            let existing = api
                .get(&name)
                .await
                .map_err(|e| KubeError::from_kube(e, get_target()))?;
            update_existing(allocator, &api, existing, pa).await
        }
        Err(e) => {
            Err(KubeError::from_kube(e, ALLOCATIONS.on("create", &name, Some(&namespace))).into())
        }
    }
}

/// Re-applying: check a changed spec against the whole pool (the object's own ports count as
/// free for it), update the spec, and sync. Unchanged specs keep every port.
async fn update_existing(
    allocator: &Allocator,
    api: &Api<PortAllocation>,
    mut existing: PortAllocation,
    pa: PortAllocation,
) -> Result<SyncReport, ApplyError> {
    if existing.spec.pool != pa.spec.pool {
        return Err(ApplyError::PoolChanged {
            owner: owner_of(&existing),
            name: existing.name_any(),
            namespace: existing.namespace().unwrap_or_default(),
            from: existing.spec.pool.clone(),
            to: pa.spec.pool.clone(),
        });
    }
    if existing.spec != pa.spec {
        let mut desired = existing.clone();
        desired.spec = pa.spec.clone();
        allocator.precheck(&desired, true).await?;
        existing = replace_spec(allocator, api, existing, &pa).await?;
    }
    Ok(allocator.sync_or_record(existing).await?)
}

/// Write the new spec. A 409 means another client wrote the object since it was read (often
/// only its status, by a concurrent `sync`): read it again and retry, within the allocator's
/// budget, rather than fail a re-apply that nobody contradicted.
async fn replace_spec(
    allocator: &Allocator,
    api: &Api<PortAllocation>,
    mut existing: PortAllocation,
    desired: &PortAllocation,
) -> Result<PortAllocation, KubeError> {
    let name = existing.name_any();
    let namespace = existing.namespace().unwrap_or_default();
    let label = owner_of(&existing);
    let mut attempts = Attempts::new(allocator.policy);
    loop {
        existing.spec = desired.spec.clone();
        let err = match api
            .replace(&name, &crate::k8s::client::write_params(), &existing)
            .await
        {
            Ok(updated) => return Ok(updated),
            Err(e) => e,
        };
        let target = ALLOCATIONS.on("update", &name, Some(&namespace));
        match attempts.backoff(err, target.clone(), &label).await {
            Ok(()) => {}
            Err(Stop::Final(e)) => return Err(e),
            // Out of budget: report the conflict itself, which says a rerun is safe.
            Err(Stop::Exhausted(_)) => {
                return Err(KubeError::new(
                    ApiErrorKind::Conflict,
                    target,
                    "the object has been modified; please apply your changes to the latest version",
                ));
            }
        }
        existing = api
            .get(&name)
            .await
            .map_err(|e| KubeError::from_kube(e, ALLOCATIONS.on("get", &name, Some(&namespace))))?;
        if existing.spec == desired.spec {
            return Ok(existing);
        }
    }
}

/// Delete an object this command created, only if it is still that object.
async fn remove_created(api: &Api<PortAllocation>, created: &PortAllocation) {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(&created.name_any(), &params).await {
        tracing::warn!(
            "could not remove PortAllocation {} after the failed allocation ({}); delete it with \
             `kubectl portalloc delete {} -n {}`",
            owner_of(created),
            error_chain(&e),
            created.name_any(),
            created.namespace().unwrap_or_default()
        );
    }
}

/// What deleting a PortAllocation did.
#[derive(Debug)]
pub struct Deleted {
    pub pool: String,
    /// Ports freed in the pool.
    pub freed: usize,
}

/// Why a delete did not complete.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error(transparent)]
    Kube(#[from] KubeError),

    /// The object is gone but its pool entry is not: `repair` frees it.
    #[error(
        "PortAllocation {owner} was deleted but its ports are still held in pool {pool:?}; \
         `kubectl portalloc repair --apply` frees them: {error}"
    )]
    EntryLeft {
        owner: String,
        pool: String,
        error: AllocateError,
    },
}

/// Delete the object first, then free its pool entry. If this is interrupted in between, the
/// entry belongs to a UID that no longer exists, which `repair` frees; the reverse order could
/// free ports of an object that is still in use.
pub async fn delete_allocation(
    allocator: &Allocator,
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Deleted, DeleteError> {
    let pa = get_allocation(client, namespace, name).await?;
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pa.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    api.delete(name, &params)
        .await
        .map_err(|e| KubeError::from_kube(e, ALLOCATIONS.on("delete", name, Some(namespace))))?;
    let uid = pa.uid().unwrap_or_default();
    let owner = owner_of(&pa);
    let freed = match allocator
        .release_holder(&pa.spec.pool, &uid, &owner, pa.status.as_ref())
        .await
    {
        Ok(freed) => freed,
        Err(AllocateError::Refused(Refusal::PoolNotFound { .. })) => 0,
        Err(error) => {
            return Err(DeleteError::EntryLeft {
                owner,
                pool: pa.spec.pool.clone(),
                error,
            });
        }
    };
    tracing::info!(
        "deleted PortAllocation {owner}; {freed} ports freed in pool {}",
        pa.spec.pool
    );
    Ok(Deleted {
        pool: pa.spec.pool,
        freed,
    })
}

//! `sync --watch`: the same client-side allocation as `sync`, driven by watches.
//!
//! Three things run side by side:
//! - a kube-runtime controller over PortAllocations: on create, on a spec change and every
//!   `resync`, it syncs the object exactly as `kubectl portalloc sync` does (lasting refusals are
//!   recorded on the object and tried again at the next resync); an object whose ports need
//!   nothing still has its ConfigMap (`spec.configMap`) checked, so one deleted or edited by hand
//!   is written again at the next resync at the latest;
//! - a watch of deletions: a deleted PortAllocation's pool entry is freed at once;
//! - with every namespace in view, a repair pass at start, after each relist of the deletion watch
//!   and every `resync`: it frees entries whose owner UID no longer exists (deletions missed
//!   while no watcher ran), by the same one-pass argument as `kubectl portalloc repair`.
//!
//! Beside them, every [`metrics::REFRESH`]: the gauges of `/metrics` and, with every namespace
//! in view and where this identity may write pools' status, each PortPool's usage summary
//! ([`pool_usage`]).
//!
//! No leader election is needed for safety: every write is a compare-and-swap on the pool's
//! resourceVersion, so two watchers (or a watcher and any number of CLI clients) at once never
//! hand out a port twice. They only cost each other conflicts.

pub mod metrics;
pub mod pool_usage;

pub use metrics::{Metrics, SyncResult};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{
    Action, Config as ControllerConfig, Controller, Error as ControllerError,
};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};

use super::allocate::{AllocateError, Allocator, Combiner};
use super::allocate::{Change, ConfigMapError, EnvConfigMap};
use crate::api::PortAllocation;
use crate::k8s::error::{ApiErrorKind, KubeError, Target};
use crate::k8s::repair::Repairer;
use crate::ledger::{CONDITION_READY, owner_of};

/// How the watcher runs.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Only this namespace; `None` watches every namespace (and repairs leaks).
    pub namespace: Option<String>,
    /// How often every object is synced again, and leaks repaired.
    pub resync: Duration,
    /// How many PortAllocations are synced at once.
    pub concurrency: u16,
    /// Whether to read every pool's shards each [`metrics::REFRESH`] for the pool gauges
    /// (when `/metrics` is served). A watcher of every namespace reads them anyway where its
    /// identity may keep the pools' usage summary ([`pool_usage`]).
    pub pool_metrics: bool,
}

/// Whether the watcher has read every PortAllocation once, and is not shutting down: a
/// replica that got SIGTERM reports not ready at once, so the Service in front of its webhook
/// drops it while it still answers.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<ReadinessState>);

#[derive(Debug, Default)]
struct ReadinessState {
    listed: AtomicBool,
    stopping: AtomicBool,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.0.listed.load(Ordering::Relaxed) && !self.is_stopping()
    }

    pub fn is_stopping(&self) -> bool {
        self.0.stopping.load(Ordering::Relaxed)
    }

    /// Ready from now on (until [`stop`](Self::stop)): for processes whose readiness is not the
    /// watcher's, such as the node agent once it has read the pools and its pods.
    pub fn mark_ready(&self) {
        self.set();
    }

    /// Not ready from now on (shutting down).
    pub fn stop(&self) {
        self.0.stopping.store(true, Ordering::Relaxed);
    }

    fn set(&self) {
        self.0.listed.store(true, Ordering::Relaxed);
    }
}

struct Context {
    allocator: Allocator,
    /// Syncs go through it: reconciles of one pool in flight together share one pool write.
    combiner: Combiner,
    resync: Duration,
    metrics: Metrics,
}

/// Why one reconciliation failed in a way worth retrying soon (transport trouble, conflicts
/// beyond the budget); lasting refusals are not errors here, they wait for the next resync.
#[derive(Debug, thiserror::Error)]
enum Retriable {
    #[error(transparent)]
    Allocate(AllocateError),
    #[error(transparent)]
    ConfigMap(Box<ConfigMapError>),
}

const PORTALLOC: &str = crate::api::GROUP;

/// What the watcher needs to be allowed: (verb, API group, resource, subresource).
const NEEDED: [(&str, &str, &str, &str); 14] = [
    ("list", PORTALLOC, "portallocations", ""),
    ("watch", PORTALLOC, "portallocations", ""),
    ("update", PORTALLOC, "portallocations", "status"),
    ("get", PORTALLOC, "portpools", ""),
    ("list", PORTALLOC, "portpools", ""),
    // Pools' shards are read, created when missing and written; the repair pass deletes the
    // shards of an earlier pool of the same name.
    ("get", PORTALLOC, "portpoolshards", ""),
    ("list", PORTALLOC, "portpoolshards", ""),
    ("create", PORTALLOC, "portpoolshards", ""),
    ("delete", PORTALLOC, "portpoolshards", ""),
    ("update", PORTALLOC, "portpoolshards", "status"),
    // The tenancy policy lets a holder entry change only for those who may update
    // PortAllocations in its namespace.
    ("update", PORTALLOC, "portallocations", ""),
    // The ConfigMaps named by spec.configMap: read to compare, then server-side applied (an
    // apply that creates the object needs create as well as patch).
    ("get", "", "configmaps", ""),
    ("create", "", "configmaps", ""),
    ("patch", "", "configmaps", ""),
];

/// Ask the API server (SelfSubjectAccessReview) whether this identity may do everything the
/// watcher does, so a missing binding is one clear error at start, not retries forever.
pub async fn check_access(client: &Client, namespace: Option<&str>) -> Result<(), KubeError> {
    for (verb, group, resource, subresource) in NEEDED {
        if !allowed(client, verb, group, resource, subresource, namespace).await? {
            let qualified = match group {
                "" => resource.to_string(),
                group => format!("{resource}.{group}"),
            };
            let plural = match subresource {
                "" => qualified,
                sub => format!("{qualified}/{sub}"),
            };
            let kind = match resource {
                "configmaps" => "ConfigMap",
                "portpools" => "PortPool",
                _ => "PortAllocation",
            };
            return Err(KubeError::new(
                ApiErrorKind::Forbidden,
                Target {
                    verb,
                    resource: plural,
                    kind,
                    name: None,
                    namespace: namespace.map(str::to_string),
                },
                "the watcher needs it (see deploy/watcher.yaml for its ClusterRole)",
            ));
        }
    }
    Ok(())
}

/// Whether this identity may do `verb` on `resource/subresource` (in `namespace`, or everywhere),
/// by the API server's answer to a SelfSubjectAccessReview.
async fn allowed(
    client: &Client,
    verb: &str,
    group: &str,
    resource: &str,
    subresource: &str,
    namespace: Option<&str>,
) -> Result<bool, KubeError> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                subresource: (!subresource.is_empty()).then(|| subresource.to_string()),
                verb: Some(verb.to_string()),
                namespace: namespace.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let target = crate::k8s::resources::Resource {
        plural: "selfsubjectaccessreviews.authorization.k8s.io",
        kind: "SelfSubjectAccessReview",
    }
    .all("create", None);
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&crate::k8s::write_params(), &review)
        .await
        .map_err(|e| KubeError::from_kube(e, target))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Run until `shutdown` completes; in-flight syncs finish first.
pub async fn watch(
    client: Client,
    allocator: Allocator,
    options: WatchOptions,
    readiness: Readiness,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<PortAllocation> = match &options.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let repairer = options
        .namespace
        .is_none()
        .then(|| Repairer::new(client.clone(), allocator.clone()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let deletions = tokio::spawn(free_deleted(
        api.clone(),
        allocator.clone(),
        repairer,
        options.resync,
        metrics.clone(),
        stop_rx.clone(),
    ));

    // The controller's cache holds every PortAllocation; without their managedFields (nothing
    // here reads them, and a status write that omits them leaves the stored ones alone) it
    // takes about half the memory.
    let (reader, writer) = reflector::store();
    let objects = reflector(
        writer,
        watcher(api).modify(|pa| pa.metadata.managed_fields = None),
    )
    .applied_objects();
    let controller = Controller::for_stream(objects, reader)
        .with_config(ControllerConfig::default().concurrency(options.concurrency));
    let store = controller.store();
    // Pools are cluster-wide: their usage is kept by the watcher of every namespace, as the
    // repair pass is, not by one confined to a namespace (a tenant's, or a webhook's).
    let cluster_wide = options.namespace.is_none();
    tokio::spawn(refresh_gauges(
        client.clone(),
        store.clone(),
        metrics.clone(),
        (options.pool_metrics, cluster_wide),
        stop_rx,
    ));
    tokio::spawn(async move {
        // Polled rather than awaited: the controller waits on the same store, and only one of
        // two concurrent waiters was ever woken.
        loop {
            match store.wait_until_ready().now_or_never() {
                Some(Ok(())) => break,
                Some(Err(_)) => return,
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        readiness.set();
        tracing::info!("watching PortAllocations: initial list complete");
    });
    let context = Arc::new(Context {
        combiner: Combiner::new(allocator.clone(), usize::from(options.concurrency)),
        allocator,
        resync: options.resync,
        metrics: metrics.clone(),
    });
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|outcome| {
            if let Err(ControllerError::QueueError(_)) = &outcome {
                metrics.record_watch_restart("allocations");
            }
            async move {
                if let Err(e) = outcome {
                    tracing::debug!("watch: {e}");
                }
            }
        })
        .await;
    let _ = stop_tx.send(true);
    let _ = deletions.await;
    tracing::info!("watcher stopped");
}

async fn reconcile(pa: Arc<PortAllocation>, ctx: Arc<Context>) -> Result<Action, Retriable> {
    let requeue = Action::requeue(ctx.resync);
    if pa.metadata.deletion_timestamp.is_some() {
        return Ok(requeue);
    }
    let owner = owner_of(&pa);
    if is_current(&pa) {
        // The ports need nothing, the ConfigMap may (deleted or edited by hand, or an earlier
        // write failed): one read, and a write only if it differs.
        let outcome = ctx.allocator.keep_configmap(&pa).await;
        return configmap_outcome(&owner, outcome, requeue);
    }
    let started = Instant::now();
    let synced = ctx.combiner.sync_or_record((*pa).clone()).await;
    let (result, conflicts, attempts) = match &synced {
        Ok(report) if report.allocated + report.released > 0 => {
            (SyncResult::Changed, report.conflicts, report.attempts)
        }
        Ok(report) => (SyncResult::Unchanged, report.conflicts, report.attempts),
        Err(AllocateError::Refused(_)) => (SyncResult::Refused, 0, 1),
        Err(AllocateError::Exhausted {
            conflicts,
            attempts,
            ..
        }) => (SyncResult::Error, *conflicts, *attempts),
        Err(_) => (SyncResult::Error, 0, 1),
    };
    ctx.metrics
        .record_sync(result, started.elapsed(), conflicts, attempts);
    match synced {
        Ok(mut report) => {
            tracing::info!(
                allocation = %owner,
                pool = %report.pool,
                held = report.holdings.port_count(),
                allocated = report.allocated,
                released = report.released,
                conflicts = report.conflicts,
                "synced"
            );
            configmap_outcome(&owner, report.configmap.take(), requeue)
        }
        Err(AllocateError::Refused(refusal)) => {
            tracing::warn!(allocation = %owner, reason = %refusal.reason(), "{refusal}");
            Ok(requeue)
        }
        Err(e) => Err(Retriable::Allocate(e)),
    }
}

/// Log what keeping the ConfigMap did. Transport trouble is retried soon; a lasting failure
/// (an env that does not resolve, Forbidden, a name another object controls) waits for the
/// next resync, as refusals do.
fn configmap_outcome(
    owner: &str,
    outcome: Option<Result<EnvConfigMap, ConfigMapError>>,
    requeue: Action,
) -> Result<Action, Retriable> {
    match outcome {
        None => Ok(requeue),
        Some(Ok(configmap)) => {
            if configmap.change != Change::Unchanged {
                tracing::info!(allocation = %owner, "{configmap}");
            }
            Ok(requeue)
        }
        Some(Err(e)) if e.is_transient() => Err(Retriable::ConfigMap(Box::new(e))),
        Some(Err(e)) => {
            tracing::warn!(allocation = %owner, "{e}");
            Ok(requeue)
        }
    }
}

fn error_policy(pa: Arc<PortAllocation>, error: &Retriable, _: Arc<Context>) -> Action {
    tracing::warn!(allocation = %owner_of(&pa), "sync failed, retrying in 5s: {error}");
    Action::requeue(Duration::from_secs(5))
}

/// Ready for the generation it describes: nothing for a sync to do. (A pool recreated under it
/// is repair's business, as for the CLI.)
pub(crate) fn is_current(pa: &PortAllocation) -> bool {
    pa.status.as_ref().is_some_and(|status| {
        status.observed_generation == pa.metadata.generation
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == CONDITION_READY && c.status == "True")
    })
}

/// Free the entries of deleted PortAllocations; with a repairer, also repair after every
/// (re)list, since deletions during a gap in the watch are not reported, and every `resync`.
async fn free_deleted(
    api: Api<PortAllocation>,
    allocator: Allocator,
    repairer: Option<Repairer>,
    resync: Duration,
    metrics: Metrics,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut events = watcher(api).boxed();
    let mut ticker = tokio::time::interval(resync);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticker.tick() => repair(repairer.as_ref()).await,
            event = events.try_next() => match event {
                Ok(Some(Event::Delete(pa))) => free(&allocator, &pa).await,
                Ok(Some(Event::InitDone)) => repair(repairer.as_ref()).await,
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(e) => {
                    metrics.record_watch_restart("deletions");
                    tracing::warn!("watching deletions: {e}");
                }
            },
        }
    }
}

/// Keep the gauges current: PortAllocations by phase from the controller's cache and, with
/// `pool_metrics` or for a `cluster_wide` watcher that may write pools' status, every pool
/// counted from its shards, for its gauges and its status' usage summary.
async fn refresh_gauges(
    client: Client,
    store: Store<PortAllocation>,
    metrics: Metrics,
    (pool_metrics, cluster_wide): (bool, bool),
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let keep_usage = cluster_wide && may_keep_usage(&client).await;
    let mut ticker = tokio::time::interval(metrics::REFRESH);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticker.tick() => {
                metrics.set_allocations(store.state().iter().map(|pa| pa.as_ref()));
                if !pool_metrics && !keep_usage {
                    continue;
                }
                match pool_usage::count_pools(&client).await {
                    Ok(count) => {
                        metrics.set_pools(&count);
                        if keep_usage {
                            pool_usage::keep_usage(&client, &count).await;
                        }
                    }
                    Err(e) => {
                        tracing::debug!("counting pools: listing them: {e}");
                        metrics.record_pool_list_error();
                    }
                }
            }
        }
    }
}

/// Whether this identity may write pools' status, for their usage summary. Not required (the
/// watcher allocates without it, as an allocating user may run it): said once when missing.
async fn may_keep_usage(client: &Client) -> bool {
    let (verb, resource, subresource) = ("update", "portpools", "status");
    match allowed(client, verb, PORTALLOC, resource, subresource, None).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::info!(
                "not keeping the PortPools' usage summary (status.usage): this identity may not \
                 update portpools/status (deploy/watcher.yaml's ClusterRole may)"
            );
            false
        }
        Err(e) => {
            tracing::warn!("not keeping the PortPools' usage summary: {e}");
            false
        }
    }
}

fn watcher(
    api: Api<PortAllocation>,
) -> impl futures::Stream<Item = Result<Event<PortAllocation>, watcher::Error>> + Send {
    watcher::watcher(api, watcher::Config::default()).default_backoff()
}

async fn free(allocator: &Allocator, pa: &PortAllocation) {
    let owner = owner_of(pa);
    let uid = pa.uid().unwrap_or_default();
    match allocator
        .release_holder(&pa.spec.pool, &uid, &owner, pa.status.as_ref())
        .await
    {
        Ok(freed) => {
            tracing::info!(allocation = %owner, pool = %pa.spec.pool, freed, "deleted: ports freed")
        }
        Err(e) => tracing::warn!(
            allocation = %owner,
            "deleted, but its ports could not be freed yet (the next repair pass frees them): {e}"
        ),
    }
}

async fn repair(repairer: Option<&Repairer>) {
    let Some(repairer) = repairer else {
        return;
    };
    let outcome = repairer
        .repair(None, true, |repair| {
            if repair.applied {
                tracing::info!(
                    pool = %repair.plan.pool,
                    changes = repair.plan.changes.len(),
                    "repaired: {}",
                    repair
                        .plan
                        .changes
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                );
            }
        })
        .await;
    if let Err(e) = outcome {
        tracing::warn!("repair pass failed (tried again at the next resync): {e}");
    }
}

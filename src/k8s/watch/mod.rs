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
//! Beside them, every [`REFRESH`](crate::k8s::process::metrics::REFRESH): the gauges of
//! `/metrics` and, with every namespace in view and where this identity may write pools'
//! status, each PortPool's usage summary ([`pool_usage`]); with every namespace in view, a
//! watch of the Nodes that keeps the node count of each pool that follows them
//! ([`node_count`]).
//!
//! Each sync, release and repair is said on its object as a Kubernetes Event
//! ([`Events`]).
//!
//! No leader election is needed for safety: every write is a compare-and-swap on the
//! resourceVersion of the pool shard it changes, so two watchers (or a watcher and any number of CLI clients) at once never
//! hand out a port twice. They only cost each other conflicts and the API server twice the
//! reads. So with a [`Replica`]'s Lease (`--leader-elect`) all of the above runs only while this
//! replica holds it ([`watch_as`]); the pod webhook (served beside, `k8s/webhook/serve.rs`)
//! never depends on it. [`WatcherProcess`] assembles the whole process: the watcher, its
//! probes, the webhook beside it, and the signals that stop them.

mod access;
mod deletions;
mod gauges;
pub mod node_count;
pub mod pool_usage;
mod run;
mod synced_lately;

use crate::k8s::error::error_chain;
pub use access::{check_access, check_leader_access};
pub use run::{WatcherProcess, WatcherSettings, WatcherStartError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use synced_lately::{SYNCED_LATELY, SyncedLately};

use futures::{FutureExt, StreamExt};
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{
    Action, Config as ControllerConfig, Controller, Error as ControllerError,
};
use kube::runtime::reflector::{self, reflector};
use kube::runtime::watcher::{self, Event};
use tokio::task::JoinHandle;

use super::allocate::{AllocateError, Allocator, GroupCommit};
use super::allocate::{ConfigMapChange, ConfigMapError, EnvConfigMap};
use crate::api::PortAllocation;
use crate::k8s::events::{Events, SyncNotices};
use crate::k8s::leader::{LeaderElection, LeaseRef, default_identity};
use crate::k8s::process::Readiness;
use crate::k8s::process::{Metrics, SyncResult};
use crate::k8s::repair::Repairer;
use crate::ledger::leader_lease::LeaseTiming;
use crate::ledger::{is_current, owner_of};

/// How the watcher runs.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Only this namespace; `None` watches every namespace (and repairs leaks).
    pub namespace: Option<String>,
    /// How often every object is synced again, and leaks repaired.
    pub resync: Duration,
    /// How many PortAllocations are synced at once.
    pub concurrency: u16,
    /// Whether to read every pool's shards each
    /// [`REFRESH`](crate::k8s::process::metrics::REFRESH) for the pool gauges (when `/metrics`
    /// is served). A watcher of every namespace reads them anyway where its identity may keep
    /// the pools' usage summary ([`pool_usage`]).
    pub pool_metrics: bool,
}

/// Who this watcher is among its replicas.
#[derive(Clone, Debug)]
pub struct Replica {
    /// Its name in the Lease (`holderIdentity`) and on its Events (`reportingInstance`): the
    /// pod's name in a pod, else `hostname_pid`.
    pub identity: String,
    /// `--leader-elect`: sync, repair and count only while holding this Lease (the webhook is
    /// served either way). `None`: do them at once, as one of any number of watchers that all
    /// do.
    pub lease: Option<LeaseRef>,
}

impl Replica {
    /// A watcher without election, named after this process.
    pub fn alone() -> Replica {
        Replica {
            identity: default_identity(),
            lease: None,
        }
    }
}

/// Reconciles in flight at once, whatever `--concurrency` says (unless it says more). An object
/// whose ports need a sync waits in its pool's group commit, so this bounds what one round of
/// the pool can take, and each round reads the pool's whole record: with 4 in flight (the
/// default `--concurrency`), 15,000 new PortAllocations in a 27,000-port pool with 28 copies went
/// in rounds of 1 to 3, each reading the pool's shards (up to ~3,000), 379 allocated in the first
/// 92 s. With 1,024 in flight the envelope (cell 2s) took 15 rounds of ~1,023 and 111-115 s;
/// with 4,096, 4 rounds and 97.9 s, for 18 MiB more at the peak (342 MiB): each round names
/// the owners it moves in every home shard, ~105 writes, whatever its size. What stays at
/// `--concurrency`: the pools synced at once ([`GroupCommit`]; a batch writes its statuses as
/// `sync --all` does), and what each reconcile sends on its own (ConfigMap reads;
/// [`Context::requests`]). Events go one at a time ([`publish_aside`]).
const RECONCILES_IN_FLIGHT: u16 = 4096;

struct Context {
    allocator: Allocator,
    /// Requests a reconcile sends on its own, beside its pool's batch: `--concurrency` at once.
    requests: tokio::sync::Semaphore,
    /// Events waiting to be sent, at most [`EVENTS_WAITING`].
    events_waiting: Arc<tokio::sync::Semaphore>,
    /// The one Event being sent.
    event_lane: tokio::sync::Semaphore,
    synced_lately: SyncedLately,
    /// Syncs go through it: reconciles of one pool in flight together share one write per shard
    /// they change.
    group_commit: GroupCommit,
    resync: Duration,
    metrics: Metrics,
    events: Events,
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

/// Run until `shutdown` completes, with no election; in-flight syncs finish first.
pub async fn watch(
    client: Client,
    allocator: Allocator,
    options: WatchOptions,
    readiness: Readiness,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let replica = Replica::alone();
    watch_as(
        replica, client, allocator, options, readiness, metrics, shutdown,
    )
    .await;
}

/// Run as `replica` until `shutdown` completes. Without a Lease: the work at once, ready once
/// the first list is in. With one: ready at once (every replica serves the webhook), and the
/// work only while this replica holds the Lease; a replica that loses it stops the work at
/// once (syncs in flight are dropped: each write is a compare-and-swap, so a dropped sync is
/// one a restart would redo), and one that stops leading by `shutdown` lets syncs in flight
/// finish, then releases the Lease so another replica takes over within a retry period.
pub async fn watch_as(
    replica: Replica,
    client: Client,
    allocator: Allocator,
    options: WatchOptions,
    readiness: Readiness,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let events = Events::new(
        client.clone(),
        &replica.identity,
        options.namespace.is_none(),
    );
    let Some(lease) = replica.lease else {
        metrics.set_leader(true);
        let readiness = Some(readiness);
        work(
            client, allocator, &options, events, readiness, metrics, shutdown,
        )
        .await;
        tracing::info!("watcher stopped");
        return;
    };
    readiness.mark_ready();
    metrics.set_leader(false);
    let shutdown = shutdown.shared();
    let timing = LeaseTiming::default();
    let mut election = LeaderElection::new(client.clone(), lease, &replica.identity, timing);
    loop {
        tokio::select! {
            () = shutdown.clone() => break,
            () = election.acquire() => {}
        }
        tracing::info!(
            lease = %election.lease(),
            identity = %replica.identity,
            "leading: syncing, repairing and counting pools"
        );
        metrics.set_leader(true);
        let term = work(
            client.clone(),
            allocator.clone(),
            &options,
            events.clone(),
            None,
            metrics.clone(),
            shutdown.clone(),
        );
        let lost = tokio::select! {
            lost = election.hold() => Some(lost),
            () = term => None,
        };
        metrics.set_leader(false);
        match lost {
            Some(lost) => tracing::warn!(
                lease = %election.lease(),
                "no longer leading ({lost}): stopped syncing, repairing and counting; still \
                 serving the webhook, and trying to lead again"
            ),
            None => break,
        }
    }
    // Held only if it stopped by `shutdown` while leading (or as it took the Lease).
    election.release().await;
    tracing::info!("watcher stopped");
}

/// Tasks of one term of work, aborted when the work is dropped (leadership lost) rather than
/// finished.
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The watcher's work until `shutdown`: the controller, the deletion watch with the repair
/// pass, the gauges and the pools' usage. `readiness`: set once the first list is in.
async fn work(
    client: Client,
    allocator: Allocator,
    options: &WatchOptions,
    events: Events,
    readiness: Option<Readiness>,
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
    let mut tasks = Tasks(Vec::new());
    tasks.0.push(tokio::spawn(deletions::free_deleted(
        api.clone(),
        allocator.clone(),
        (repairer, events.clone()),
        options.resync,
        metrics.clone(),
        stop_rx.clone(),
    )));

    // The controller's cache holds every PortAllocation; without their managedFields (nothing
    // here reads them, and a status write that omits them leaves the stored ones alone) it
    // takes about half the memory.
    let (reader, writer) = reflector::store();
    let objects = reflector(
        writer,
        watcher(api).modify(|pa| pa.metadata.managed_fields = None),
    )
    .applied_objects();
    let controller = Controller::for_stream(objects, reader).with_config(
        ControllerConfig::default().concurrency(options.concurrency.max(RECONCILES_IN_FLIGHT)),
    );
    let store = controller.store();
    // The webhook of this process reads PortAllocations from here while the work runs.
    let _lent = allocator.watched().lend(store.clone());
    // Pools are cluster-wide: their usage is kept by the watcher of every namespace, as the
    // repair pass is, not by one confined to a namespace (a tenant's, or a webhook's).
    let cluster_wide = options.namespace.is_none();
    if cluster_wide {
        tasks.0.push(tokio::spawn(node_count::keep_node_counts(
            client.clone(),
            stop_rx.clone(),
        )));
    }
    tasks.0.push(tokio::spawn(gauges::refresh_gauges(
        client.clone(),
        store.clone(),
        metrics.clone(),
        (options.pool_metrics, cluster_wide),
        stop_rx,
    )));
    tasks.0.push(tokio::spawn(async move {
        // Polled rather than awaited: the controller waits on the same store, and only one of
        // two concurrent waiters was ever woken.
        loop {
            match store.wait_until_ready().now_or_never() {
                Some(Ok(())) => break,
                Some(Err(_)) => return,
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        if let Some(readiness) = readiness {
            readiness.mark_ready();
        }
        tracing::info!("watching PortAllocations: initial list complete");
    }));
    let context = Arc::new(Context {
        group_commit: GroupCommit::new(allocator.clone(), usize::from(options.concurrency)),
        requests: tokio::sync::Semaphore::new(usize::from(options.concurrency.max(1))),
        events_waiting: Arc::new(tokio::sync::Semaphore::new(EVENTS_WAITING)),
        event_lane: tokio::sync::Semaphore::new(1),
        synced_lately: SyncedLately::default(),
        allocator,
        resync: options.resync,
        metrics: metrics.clone(),
        events,
    });
    let shutdown = shutdown.shared();
    let finished = async {
        controller
            .graceful_shutdown_on(shutdown.clone())
            .run(reconcile, error_policy, context)
            .for_each(|outcome| {
                if let Err(ControllerError::QueueError(_)) = &outcome {
                    metrics.record_watch_restart("allocations");
                }
                async move {
                    if let Err(e) = outcome {
                        tracing::debug!("watch: {}", error_chain(&e));
                    }
                }
            })
            .await;
        let _ = stop_tx.send(true);
        let deletions = tasks.0.remove(0);
        let _ = deletions.await;
    };
    finish_or_stop_overdue(finished, shutdown.clone()).await;
}

/// Run `finished` to its end, or give up [`STOP_WITHIN`] after `shutdown`. kube-runtime's
/// graceful shutdown waits for the first list of PortAllocations, which it no longer reads once
/// signalled: a stop before that list completes would wait for ever. Nothing in flight needs
/// more (a client stopped at any instant is repairable).
async fn finish_or_stop_overdue(
    finished: impl Future<Output = ()>,
    shutdown: impl Future<Output = ()>,
) {
    let overdue = async {
        shutdown.await;
        tokio::time::sleep(STOP_WITHIN).await;
    };
    tokio::select! {
        () = finished => {}
        () = overdue => tracing::warn!(
            "stopping without waiting further: the work had not finished {}s after the signal",
            STOP_WITHIN.as_secs()
        ),
    }
}

/// How long the watcher's work may take to finish after the signal to stop.
const STOP_WITHIN: Duration = Duration::from_secs(15);

async fn reconcile(pa: Arc<PortAllocation>, ctx: Arc<Context>) -> Result<Action, Retriable> {
    let requeue = Action::requeue(ctx.resync);
    if pa.metadata.deletion_timestamp.is_some() {
        return Ok(requeue);
    }
    let owner = owner_of(&pa);
    if is_current(&pa) {
        if pa.spec.config_map.is_none() {
            // Nothing to keep. Taking a request permit would queue this reconcile behind the
            // Events waiting for one (up to 1,000, 4 at a time): after a round of ~4,000 syncs
            // their own status writes brought them back, and they held the reconcile slots for
            // seconds while the next round gathered a few hundred callers (cell 2s).
            return Ok(requeue);
        }
        // The ports need nothing, the ConfigMap may (deleted or edited by hand, or an earlier
        // write failed): one read, and a write only if it differs.
        let _permit = ctx.requests.acquire().await;
        // Boxed: a reconcile's future is as large as its largest step, and up to 4,096 of them
        // wait in their pools' group commits.
        let outcome = Box::pin(ctx.allocator.keep_configmap(&pa)).await;
        return configmap_outcome(&owner, outcome, requeue);
    }
    if ctx.synced_lately.holds(&pa) {
        // Its Ready status is written; the cache has not caught up (its watch event will
        // reconcile it again, current).
        return Ok(Action::requeue(SYNCED_LATELY));
    }
    let started = Instant::now();
    let synced = ctx.group_commit.sync_or_record(pa.clone()).await;
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
            if is_current(&report.allocation) {
                ctx.synced_lately.remember(&report.allocation);
            }
            tracing::info!(
                allocation = %owner,
                pool = %report.pool,
                held = report.holdings.port_count(),
                allocated = report.allocated,
                released = report.released,
                conflicts = report.conflicts,
                "synced"
            );
            let configmap = report.configmap.take();
            if let Some(said) = SyncNotices::of(&pa, &report) {
                publish_aside(&ctx, move |events| async move { events.synced(said).await });
            }
            configmap_outcome(&owner, configmap, requeue)
        }
        Err(AllocateError::Refused(refusal)) => {
            tracing::warn!(allocation = %owner, reason = %refusal.reason(), "{refusal}");
            publish_aside(&ctx, move |events| async move {
                events.refused(&pa, &refusal).await
            });
            Ok(requeue)
        }
        Err(e) => Err(Retriable::Allocate(e)),
    }
}

/// Send a reconcile's Events beside the next reconciles, one at a time, as client-go's
/// recorder sends them (one sink, in order). A reconcile that waited for them kept its place
/// among those in flight: after a round of ~1,000 syncs of one pool, the next round started
/// with almost nothing while their Events went out (cell 2s). Nor do they share the
/// reconciles' request permits: 4 at a time beside a pool's shard and status writes, they
/// kept ConfigMap reads waiting behind up to 1,000 of them.
///
/// Events are best effort, as client-go's recorder makes them: with [`EVENTS_WAITING`] already
/// waiting, this one is dropped and counted (`portalloc_events_dropped_total`). A watcher
/// syncing 15,000 new PortAllocations would otherwise post 15,000 Events, as many writes as
/// the statuses, behind and then between its rounds of syncs; the status says the same.
fn publish_aside<F>(ctx: &Arc<Context>, publish: impl FnOnce(Events) -> F + Send + 'static)
where
    F: Future<Output = ()> + Send + 'static,
{
    let Ok(waiting) = ctx.events_waiting.clone().try_acquire_owned() else {
        ctx.metrics.record_event_dropped();
        tracing::debug!("an Event dropped: {EVENTS_WAITING} are waiting to be sent");
        return;
    };
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let _waiting = waiting;
        let _lane = ctx.event_lane.acquire().await;
        publish(ctx.events.clone()).await;
    });
}

/// Events kept waiting to be sent at most; client-go's broadcaster keeps as many
/// (`maxQueuedEvents`) and drops the rest too.
const EVENTS_WAITING: usize = 1000;

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
            if configmap.change != ConfigMapChange::Unchanged {
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
    tracing::warn!(allocation = %owner_of(&pa), "sync failed, retrying in 5s: {}", error_chain(error));
    Action::requeue(Duration::from_secs(5))
}

fn watcher(
    api: Api<PortAllocation>,
) -> impl futures::Stream<Item = Result<Event<PortAllocation>, watcher::Error>> + Send {
    watcher::watcher(api, watcher::Config::default()).default_backoff()
}

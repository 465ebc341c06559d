//! 2s: the Kubernetes scalability envelope's pods (issue 34, goal 3): 15,000 PortAllocations ×
//! one role of 10 replicas × 5 PodScoped ports (750,000 holdings, 150,000 pods' ports) in one
//! pool of 27,000 ports with `nodeReuse: 32` (about 28 copies are needed).
//!
//! - set A, in its own pool: created by 16 clients (setup, its time said), then allocated by
//!   one `kubectl portalloc sync --all -A -v 2` (the release binary under `cargo bench`): wall
//!   time, peak memory, and where the time goes from the request log, each line stamped as it
//!   arrives (list, read of the record, decision, shard writes, status writes), beside the API
//!   server's own time per request;
//! - the shards stored for it (count, bytes of their JSON as read), `pool describe` and `get -A`;
//! - set B, in a second pool of the same shape: created, then `sync --watch` started from
//!   nothing (the pod webhook served beside, as the chart runs it) until every PortAllocation
//!   is Ready; the watcher's peak memory (VmHWM);
//! - with that record in place, a burst of labelled hostNetwork pods (10 per PortAllocation)
//!   created by 16 clients through the watcher's webhook: create latency as the client sees it,
//!   and the webhook's own `portalloc_admission_duration_seconds` histogram.
//!
//! Runs right after 2h, on a cluster holding no other PortAllocation (so `-A` sees only set A),
//! and deletes its PortAllocations and pods afterwards (their shards stay: later cells use
//! other pools).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use portalloc::api::{PortAllocation, PortPool, PortPoolShard, PortPoolSpec, StaticBandSetting};
use portalloc::ledger::recorded_holdings;

use crate::controlplane::ControlPlane;
use crate::envelope_readings::{memory_kib, metric};
use crate::envelope_shape::{
    CREATORS, NODE_REUSE, PORTS_PER_POD, REPLICAS, SET_A, SET_B, SYSTEM, is_ready, watcher_log,
};
use crate::envelope_sync_log::{Phases, sync_all};
use crate::webhook::{Log, WebhookCommand};
use crate::{Row, cli, dash, envelope_burst, metrics, scale, workload, yes_no};

struct Size {
    owners: usize,
    /// The two pools' ranges: set A's (sync --all) and set B's (the watcher).
    ranges: [&'static str; 2],
    ports: u32,
    burst: usize,
    cli_runs: usize,
    /// How long the watcher may take before the cell reports how far it got.
    watcher_deadline: Duration,
    /// How often the watcher's `/metrics` is read while it syncs (a local, cheap request).
    probe: Duration,
    /// How often the PortAllocations are listed, once the watcher's count of syncs says all
    /// may be Ready, until they are (each LIST of 15,000 costs the server about a second).
    poll: Duration,
}

impl Size {
    fn new(quick: bool) -> Size {
        if quick {
            Size {
                owners: 40,
                ranges: ["10000-10099", "37000-37099"],
                ports: 100,
                burst: 20,
                cli_runs: 1,
                watcher_deadline: Duration::from_secs(120),
                probe: Duration::from_millis(50),
                poll: Duration::from_millis(200),
            }
        } else {
            Size {
                owners: 15_000,
                ranges: ["10000-36999", "37000-63999"],
                ports: 27_000,
                burst: 1_000,
                cli_runs: 3,
                watcher_deadline: Duration::from_secs(15 * 60),
                probe: Duration::from_millis(250),
                poll: Duration::from_secs(15),
            }
        }
    }
}

pub async fn measure(
    plane: &ControlPlane,
    admin: &Client,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let size = Size::new(quick);
    let clients = plane.clients(CREATORS).await?;
    let mut rows = sync_all_rows(plane, admin, &size, &clients).await?;
    rows.push(cli_row(plane, &size));
    let (row, watcher) = watcher_row(plane, &size, &clients).await?;
    rows.push(row);
    // Fresh connections: the admin's sat idle through the watcher's run.
    let admin = &plane.client().await?;
    rows.push(envelope_burst::burst_row(admin, size.burst, &clients, &watcher).await?);
    drop(watcher);
    clean_up(plane).await;
    Ok(rows)
}

impl Size {
    fn holdings(&self) -> u64 {
        self.owners as u64 * u64::from(REPLICAS * PORTS_PER_POD)
    }

    fn shape(&self) -> String {
        format!(
            "{} PortAllocations × {REPLICAS} pods × {PORTS_PER_POD} PodScoped ports ({} \
             holdings) into one {}-port pool, `nodeReuse: {NODE_REUSE}`",
            self.owners,
            self.holdings(),
            self.ports
        )
    }
}

/// Set A: created, then one `sync --all -A`; where its time goes, and what it stored.
async fn sync_all_rows(
    plane: &ControlPlane,
    admin: &Client,
    size: &Size,
    clients: &[Client],
) -> anyhow::Result<Vec<Row>> {
    let (holdings, shape) = (size.holdings(), size.shape());
    let mut rows = Vec::new();
    let (ns_a, pool_a) = (SET_A, SET_A);
    workload::create_namespace(admin, ns_a).await?;
    create_reuse_pool(admin, pool_a, size.ranges[0]).await?;
    let created_a = apply(clients, ns_a, pool_a, size.owners).await?;
    eprintln!(
        "  2s: {} PortAllocations created in {:.1} s; sync --all -A",
        size.owners,
        created_a.as_secs_f64()
    );
    let durations_before = metrics::scrape_durations(admin).await?;
    let sync = sync_all(&plane.kubeconfig)?;
    // Fresh connections: the admin's sat idle through the sync.
    let admin = &plane.client().await?;
    let durations_after = metrics::scrape_durations(admin).await?;
    ensure!(
        sync.success,
        "sync --all -A: {}",
        sync.lines
            .iter()
            .rev()
            .take(5)
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let log_path = std::env::temp_dir().join("2s-sync-all.log");
    std::fs::write(
        &log_path,
        sync.lines
            .iter()
            .map(|(t, l)| format!("{:.3} {l}\n", t.as_secs_f64()))
            .collect::<String>(),
    )?;
    let ready_a = count_ready(admin, ns_a).await?;
    let phases = Phases::of(&sync);
    let server = |verb, resource, subresource| {
        let (ms, count) = metrics::mean_duration_ms(
            &durations_before,
            &durations_after,
            verb,
            "portalloc.dev",
            resource,
            subresource,
        );
        format!(
            "{verb} {resource}{}{subresource} {ms:.1} ms ×{count}",
            if subresource.is_empty() { "" } else { "/" }
        )
    };
    let wall = sync.wall.as_secs_f64();
    rows.push(Row {
        id: "2s",
        what: format!(
            "`kubectl portalloc sync --all -A` of {shape} (created beforehand by {CREATORS} \
             clients in {:.0} s): wall time, Ready afterwards, peak memory of the CLI",
            created_a.as_secs_f64()
        ),
        ours: format!(
            "**{wall:.1} s**; {ready_a} of {} Ready; {} shard writes, {} status writes (widening \
             ones included), {} 409s; \
             CLI peak RSS {:.0} MiB",
            size.owners,
            phases.shard_writes.len(),
            phases.status_write_count(),
            phases.conflicts,
            sync.max_rss_kib as f64 / 1024.0
        ),
        anchor: dash(),
        ratio: dash(),
        target: "≤ 300 s".into(),
        met: yes_no(ready_a == size.owners && wall <= 300.0),
    });
    rows.push(Row {
        id: "2s",
        what: "… where its time goes (request log lines stamped as they arrive; \
               API server's mean time per request from `apiserver_request_duration_seconds`)"
            .into(),
        ours: format!(
            "{}; server: {}",
            phases.describe(sync.wall),
            [
                server("LIST", "portallocations", ""),
                server("LIST", "portpoolshards", ""),
                server("POST", "portpoolshards", ""),
                server("PUT", "portpoolshards", "status"),
                server("PUT", "portallocations", "status"),
            ]
            .join(", ")
        ),
        anchor: dash(),
        ratio: dash(),
        target: dash(),
        met: dash(),
    });

    rows.push(
        floor_row(
            clients,
            admin,
            ns_a,
            phases.status_write_count(),
            size.owners,
        )
        .await?,
    );

    let (shards, bytes, held) = stored(admin, pool_a, ns_a).await?;
    rows.push(Row {
        id: "2s",
        what: "… shards stored for it (PortPoolShard objects of the pool; bytes of their JSON \
               as read, metadata included)"
            .into(),
        ours: format!(
            "{shards} shards, {:.1} MB ({:.1} bytes per holding; largest {:.1} kB); {held} \
             ports on the PortAllocations' statuses",
            bytes.0 as f64 / 1e6,
            bytes.0 as f64 / holdings as f64,
            bytes.1 as f64 / 1e3
        ),
        anchor: dash(),
        ratio: dash(),
        target: dash(),
        met: yes_no(held == holdings),
    });

    Ok(rows)
}

/// The floor beside the sync: the same number of status writes as it made, bare (each object
/// as synced, `observedGeneration` changed so each is a real write) by as many at once as the
/// sync writes statuses (16): every object once, then as many again as there were widening
/// writes.
async fn floor_row(
    clients: &[Client],
    admin: &Client,
    ns: &str,
    writes: usize,
    owners: usize,
) -> anyhow::Result<Row> {
    let mut took = Duration::ZERO;
    let mut left = writes;
    while left > 0 {
        let now = left.min(owners);
        took += scale::status_floor(clients, admin, ns, 16, Some(now)).await?;
        left -= now;
    }
    Ok(Row {
        id: "2s",
        what: format!(
            "… the floor beside it: {writes} bare status writes (as many as the sync made), \
             16 at once"
        ),
        ours: format!(
            "{:.1} s ({:.0} writes/s)",
            took.as_secs_f64(),
            writes as f64 / took.as_secs_f64().max(1e-9)
        ),
        anchor: dash(),
        ratio: dash(),
        target: dash(),
        met: dash(),
    })
}

/// `pool describe` and `get -A` with set A's record in place.
fn cli_row(plane: &ControlPlane, size: &Size) -> Row {
    let pool_a = SET_A;
    let describe = median_of(size.cli_runs, || {
        cli::command(&plane.kubeconfig, &["pool", "describe", pool_a])
    });
    let get = median_of(size.cli_runs, || {
        cli::command(&plane.kubeconfig, &["get", "-A"])
    });
    Row {
        id: "2s",
        what: format!(
            "`kubectl portalloc pool describe {pool_a}` and `kubectl portalloc get -A` with that \
             record in place ({} PortAllocations), median of {} runs each",
            size.owners, size.cli_runs
        ),
        ours: format!(
            "describe {:.2} s, get -A {:.2} s",
            describe.as_secs_f64(),
            get.as_secs_f64()
        ),
        anchor: dash(),
        ratio: dash(),
        target: dash(),
        met: dash(),
    }
}

/// Set B: created, then `sync --watch` from empty until every one is Ready; the watcher stays
/// up for the burst.
async fn watcher_row(
    plane: &ControlPlane,
    size: &Size,
    clients: &[Client],
) -> anyhow::Result<(Row, crate::webhook::Webhook)> {
    let admin = &plane.client().await?;
    let shape = size.shape();
    let (ns_b, pool_b, system) = (SET_B, SET_B, SYSTEM);
    for ns in [ns_b, system] {
        workload::create_namespace(admin, ns).await?;
    }
    create_reuse_pool(admin, pool_b, size.ranges[1]).await?;
    let created_b = apply(clients, ns_b, pool_b, size.owners).await?;
    eprintln!(
        "  2s: {} PortAllocations created in {:.1} s; sync --watch from empty",
        size.owners,
        created_b.as_secs_f64()
    );
    let watcher_log = watcher_log();
    let requests_before = metrics::scrape(admin).await?;
    let started = Instant::now();
    let mut watcher = WebhookCommand::new(&plane.kubeconfig)
        .watch_namespace(ns_b)
        .webhook_namespace(system)
        .probes()
        .args(&["-v", "1"])
        .env("NO_COLOR", "1")
        .log(Log::File(watcher_log.clone()))
        .register_timeout(Duration::from_secs(120))
        .spawn()?;
    watcher.wait_registered(admin).await?;
    let registered = started.elapsed();
    let pid = watcher.pid();
    // The PortAllocations are listed only once the watcher's count of syncs says all may be
    // Ready (then every `poll` until they are, or at the deadline); the trace is that count,
    // as it stood after each whole minute. Listing 15,000 of them every 15 s for the trace cost
    // the server ~1 s of a core each, and this process 5.7-5.9 CPU-s in the watcher's ~100 s,
    // on the 2 cores the watcher and its server share.
    let mut marks = Vec::new();
    let mut listed: Option<Instant> = None;
    let ready_b = loop {
        tokio::time::sleep(size.probe).await;
        let synced = metric(
            &watcher.get("/metrics").unwrap_or_default(),
            "portalloc_syncs_total",
        );
        let at = started.elapsed();
        if at.as_secs() / 60 > marks.len() as u64 {
            marks.push(format!("{synced:.0} at {:.0} s", at.as_secs_f64()));
        }
        let late = started.elapsed() >= size.watcher_deadline;
        let may_be_ready =
            synced >= size.owners as f64 && listed.is_none_or(|at| at.elapsed() >= size.poll);
        if !may_be_ready && !late {
            continue;
        }
        let ready = count_ready(admin, ns_b).await?;
        listed = Some(Instant::now());
        if ready == size.owners || late {
            break ready;
        }
    };
    // Taken when the LIST that found them all Ready had ended.
    let all_ready = started.elapsed();
    let requests_after = metrics::scrape(admin).await?;
    let (before, after) = (&requests_before, &requests_after);
    // Events created meanwhile (core and events.k8s.io): writes as the statuses are.
    let events = metrics::grew(before, after, ("POST", "", "events", ""))
        + metrics::grew(before, after, ("POST", "events.k8s.io", "events", ""));
    let status_writes = metrics::grew(
        before,
        after,
        ("PUT", "portalloc.dev", "portallocations", "status"),
    );
    let memory_after_sync = memory_kib(pid);
    let trace = marks.join(", ");
    let metrics_text = watcher.get("/metrics").unwrap_or_default();
    let family = |name: &str| metric(&metrics_text, name);
    let row = Row {
        id: "2s",
        what: format!(
            "`sync --watch -n {ns_b}` (pod webhook served beside, default concurrency 4) started on \
             {shape}, none synced (created by {CREATORS} clients in {:.0} s): until every one is \
             Ready; its peak memory (VmHWM)",
            created_b.as_secs_f64()
        ),
        ours: format!(
            "{} in **{:.1} s** (webhook registered after {:.1} s){}; syncs {:.0}, 409s {:.0}; \
             meanwhile {status_writes:.0} status writes and {events:.0} Events created; \
             **VmHWM {:.0} MiB**, VmRSS {:.0} MiB",
            if ready_b == size.owners {
                format!("all {ready_b} Ready")
            } else {
                format!("**only {ready_b} of {} Ready**", size.owners)
            },
            all_ready.as_secs_f64(),
            registered.as_secs_f64(),
            if trace.is_empty() {
                String::new()
            } else {
                format!(" (synced by minute, the watcher's count: {trace})")
            },
            family("portalloc_syncs_total"),
            family("portalloc_cas_conflicts_total"),
            memory_after_sync.0 as f64 / 1024.0,
            memory_after_sync.1 as f64 / 1024.0,
        ),
        anchor: dash(),
        ratio: dash(),
        target: "≤ 300 s, < 1 GiB".into(),
        met: yes_no(
            ready_b == size.owners
                && all_ready.as_secs_f64() <= 300.0
                && memory_after_sync.0 < 1024 * 1024,
        ),
    };
    Ok((row, watcher))
}

/// Leave the cluster as the later cells expect it: no PortAllocation, no pod.
async fn clean_up(plane: &ControlPlane) {
    let Ok(admin) = plane.client().await else {
        eprintln!("  2s: no client to delete its PortAllocations and pods with");
        return;
    };
    let (ns_a, ns_b) = (SET_A, SET_B);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns_b);
    let _ = pods
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    for ns in [ns_a, ns_b] {
        let api: Api<PortAllocation> = Api::namespaced(admin.clone(), ns);
        if let Err(e) = api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
        {
            eprintln!("  2s: deleting the PortAllocations of {ns}: {e}");
        }
    }
}

/// A pool as `pool create --node-reuse 32` makes it.
async fn create_reuse_pool(client: &Client, name: &str, range: &str) -> anyhow::Result<()> {
    let pool = PortPool::new(
        name,
        PortPoolSpec {
            ranges: vec![range.into()],
            exclude: vec![],
            protocol: Default::default(),
            static_band: StaticBandSetting::Auto,
            node_reuse: Some(NODE_REUSE),
            guard: None,
            allow_overlap: false,
            follow_nodes: None,
        },
    );
    portalloc::k8s::create_pool(client, pool, true)
        .await
        .with_context(|| format!("create PortPool {name}"))?;
    Ok(())
}

/// `count` new PortAllocations of one 10-replica, 5-port role, as `kubectl apply` leaves them;
/// how long the creates took.
async fn apply(clients: &[Client], ns: &str, pool: &str, count: usize) -> anyhow::Result<Duration> {
    let apis: Arc<Vec<Api<PortAllocation>>> = Arc::new(
        clients
            .iter()
            .map(|c| Api::namespaced(c.clone(), ns))
            .collect(),
    );
    let (ns, pool) = (ns.to_string(), pool.to_string());
    let cell = workload::drive(clients.len(), count, move |worker, item| {
        let apis = apis.clone();
        let pa = workload::allocation(
            &format!("app-{item:05}"),
            &ns,
            &pool,
            REPLICAS,
            PORTS_PER_POD,
        );
        async move {
            apis[worker].create(&PostParams::default(), &pa).await?;
            Ok(workload::Sample::untimed())
        }
    })
    .await;
    ensure!(cell.failures.is_empty(), "apply: {:?}", cell.failures);
    Ok(cell.wall)
}

/// The pool's shards: how many, (total, largest) bytes of their JSON; and the ports the
/// statuses of `namespace`'s PortAllocations record.
async fn stored(
    admin: &Client,
    pool: &str,
    namespace: &str,
) -> anyhow::Result<(usize, (usize, usize), u64)> {
    let api: Api<PortPoolShard> = Api::all(admin.clone());
    let mut params = ListParams::default()
        .fields(&format!("spec.pool={pool}"))
        .limit(200);
    let (mut count, mut total, mut largest, mut held) = (0, 0, 0, 0u64);
    loop {
        let page = api.list(&params).await?;
        for shard in &page.items {
            let bytes = serde_json::to_vec(shard)?.len();
            count += 1;
            total += bytes;
            largest = largest.max(bytes);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let allocations: Api<PortAllocation> = Api::namespaced(admin.clone(), namespace);
    for pa in workload::list_all(&allocations).await? {
        if let Some(status) = &pa.status {
            held += recorded_holdings(status).ports().count() as u64;
        }
    }
    Ok((count, (total, largest), held))
}

async fn count_ready(admin: &Client, ns: &str) -> anyhow::Result<usize> {
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), ns);
    Ok(workload::list_all(&api)
        .await?
        .iter()
        .filter(|pa| is_ready(pa))
        .count())
}

/// The median wall time of `runs` runs of a command.
fn median_of(runs: usize, make: impl FnMut() -> Command) -> Duration {
    let mut times = cli::time_runs(runs.max(1), make);
    times.sort();
    times[times.len() / 2]
}

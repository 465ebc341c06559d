//! kubectl-portalloc against a real API server, side by side with Kubernetes' own NodePort
//! allocator: one command, one table.
//!
//!   cargo bench --bench cluster                              full run (release binary)
//!   PORTALLOC_BENCH_QUICK=1 cargo test --locked --bench cluster   quick mode: tiny counts, same code
//!
//! It starts its own control plane through `scripts/local-cluster.sh` (owner PID = this process,
//! so the servers stop by themselves even if it dies), installs the CRDs with the binary's
//! `install`, measures, stops the control plane, and prints one Markdown table:
//!
//! - 2a: API requests per `create -f` (CLI), per `sync` of an allocated object and of a freshly
//!   applied one, with 1, 64 and 512 ports, from the server's `apiserver_request_total`;
//! - 2b/2c: ports/s and p50/p99 latency with 1, 4 and 16 concurrent clients (one kube Client
//!   each, in this process, through `portalloc::k8s::Allocator`), 1- and 8-port allocations,
//!   and NodePort Services with the same ports and concurrency as the anchor;
//! - 2d: duplicate ports handed out by a RoleBasedGroup-style random allocator (simulated) and by
//!   us (measured) on the same workload;
//! - 2e: `kubectl portalloc get -A` versus `kubectl get portallocations -A` on 1,000 objects, and
//!   the start-up time of `kubectl-portalloc --help`;
//!
//! - 2h: `sync --all -A` of 1,000 fresh PortAllocations into one pool (group commit), beside
//!   the same synced one compare-and-swap at a time and beside creating 1,000 NodePort Services.
//!
//! - 2i: bytes per holder of the pool record, today's encoding and compact ones, against etcd's
//!   request limit (pure arithmetic on real encodings, no server).
//!
//! - 2k: a pool holding every port of 1-65535 by one-port holders: bytes per held port,
//!   and the cost of one more allocation (refused when full; placed when a port is free).
//!
//! - 2l: 16 concurrent `kubectl portalloc create -f` processes (process start included), p50/p99.
//! - 2m: `sync --all` of 25,000 and 65,535 fresh PortAllocations into one 1-65535 pool.
//! - 2n: pools that fill, through the CLI: copies of the vLLM-Ray example in its pool, and a
//!   random mix into a 4,096-port pool, until the first refusal (and again after deletions).
//!
//! - 2r: a fleet of 32 GPU servers filled to 95 % by hostNetwork StatefulSets through the pod
//!   webhook, placed by the real kube-scheduler, with a pool of a third of the ports the pods
//!   hold and `nodeReuse: 4`: pods Pending for their ports while a node has their GPUs, per seed,
//!   and the same fleet with `nodeReuse: 1` (fleet.rs; a control plane of its own per run).
//!
//! - 2s: the scalability envelope's pods (issue 34): 15,000 PortAllocations x 10 pods x 5 ports
//!   (750,000 holdings) in one 27,000-port pool with `nodeReuse: 32`: one `sync --all -A` (where
//!   its time goes), shards and bytes stored, `pool describe` and `get -A`, `sync --watch` from
//!   empty (time, peak memory), and webhook admission during a burst of 1,000 labelled pods.
//!
//! - 2j: the fine-grained compare-and-swap lever (JSON Patch `test` of one block) against a
//!   whole-object compare-and-swap, on a ConfigMap stand-in of a pool record's size.
//!
//! `PORTALLOC_BENCH_BIN=PATH` runs 2l, 2m and 2n with another build of the plugin (its CRDs installed
//! by it), for a before/after on one machine. `PORTALLOC_BENCH_CELLS=2a,2h` runs only the cells named (ids as in the table; `2b` runs the
//! 2b/2c cells); `PORTALLOC_BENCH_ROUNDS=1` shortens the throughput cells; `PORTALLOC_BENCH_SEEDS=N` (at most
//! 8) runs 2n's random mix and 2r's fleet with N seeds (default 3; 1 in quick mode);
//! `PORTALLOC_BENCH_SHARDS=1` runs the shard experiment even when its condition does not hold;
//! Quick mode is chosen by `PORTALLOC_BENCH_QUICK=1`, by `--quick`, or by running without the
//! `--bench` flag that `cargo bench` passes (so `cargo test --benches` never runs the full size).

mod baseline;
mod burst;
mod cli;
// The control plane of the end-to-end tests, started the same way (shared test code).
#[path = "../../tests/common/control_plane.rs"]
mod controlplane;
// kube-scheduler, kube-controller-manager, Node objects and the webhook process of the
// scheduling tests (2r).
#[path = "../../tests/common/controllers.rs"]
mod controllers;
mod encodings;
mod envelope;
mod envelope_burst;
mod envelope_readings;
mod envelope_shape;
mod envelope_sync_log;
mod filling;
mod fleet;
mod fleet_count;
mod fleet_workload;
mod full_pool;
mod group_commit;
mod levers;
// The machine and the source measured (shared with benches/node).
mod machine;
mod metrics;
#[path = "../../tests/common/nodes.rs"]
mod nodes;
// Quick mode, the cells asked for, the table's header and lines (shared with benches/node).
mod report;
mod scale;
#[path = "../../tests/common/webhook.rs"]
mod webhook;
mod workload;

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use rand::SeedableRng;
use rand::rngs::StdRng;

use controlplane::ControlPlane;
use portalloc::api::{PortAllocation, PortPool};
use portalloc::k8s::Allocator;
use portalloc::ledger::recorded_holdings;
use report::{dash, yes_no};
use workload::Cell;

/// How much of everything to do.
struct Scale {
    quick: bool,
    /// PortAllocations (and Services) per round of a throughput cell. NodePort Services need a
    /// ClusterIP and the local apiserver's service CIDR is a /24 (253 free addresses), so a round
    /// stays below that and every Service is deleted before the next round.
    per_round: usize,
    rounds: usize,
    concurrency: [usize; 3],
    sizes: [u32; 2],
    /// Shard counts tried if 16 clients get less than half the 1-client throughput.
    shards: [u32; 2],
    request_ports: [u32; 3],
    get_objects: usize,
    cli_runs: usize,
    help_runs: usize,
    random_trials: u32,
    duplicate_pods: u32,
    /// PortAllocations applied at once for the watcher to allocate.
    burst: usize,
    /// PortAllocations synced by one `sync --all -A` (group commit).
    group: usize,
    /// The cells to run (`PORTALLOC_BENCH_CELLS`); `None`: all of them.
    cells: Option<Vec<String>>,
}

impl Scale {
    fn new(quick: bool) -> Scale {
        Scale {
            quick,
            per_round: if quick { 16 } else { 240 },
            rounds: std::env::var("PORTALLOC_BENCH_ROUNDS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(if quick { 1 } else { 3 }),
            concurrency: [1, 4, 16],
            sizes: [1, 8],
            shards: [4, 8],
            request_ports: [1, 64, 512],
            get_objects: if quick { 40 } else { 1000 },
            cli_runs: if quick { 2 } else { 9 },
            help_runs: if quick { 3 } else { 21 },
            random_trials: if quick { 2_000 } else { 100_000 },
            duplicate_pods: if quick { 30 } else { 100 },
            burst: if quick { 20 } else { 1000 },
            group: if quick { 40 } else { 1000 },
            cells: report::cells_asked(),
        }
    }

    /// Whether cell `id` (`2a`, `2b`, ...) is to run.
    fn wants(&self, id: &str) -> bool {
        report::wants(&self.cells, id)
    }
}

/// One line of the table.
struct Row {
    id: &'static str,
    what: String,
    ours: String,
    anchor: String,
    ratio: String,
    target: String,
    met: String,
}

/// A long cell that fails becomes a row saying so (the other cells' figures are kept); in quick
/// mode (CI) it fails the run.
fn or_failed(id: &'static str, result: anyhow::Result<Vec<Row>>) -> anyhow::Result<Vec<Row>> {
    match result {
        Ok(rows) => Ok(rows),
        Err(e) if std::env::var("PORTALLOC_BENCH_QUICK").is_ok_and(|v| v == "1") => Err(e),
        Err(e) => Ok(vec![Row {
            id,
            what: "the cell failed".into(),
            ours: format!("{e:#}"),
            anchor: dash(),
            ratio: dash(),
            target: dash(),
            met: yes_no(false),
        }]),
    }
}

fn main() -> anyhow::Result<()> {
    let quick = report::quick_mode();
    let scale = Scale::new(quick);
    let started = Instant::now();
    let load_before = machine::load_average();
    eprintln!(
        "cluster bench ({} mode): starting a local control plane",
        if quick { "quick" } else { "full" }
    );
    let mut plane = ControlPlane::up("bench-cluster")?;
    if std::env::var_os("PORTALLOC_BENCH_BIN").is_some() {
        // An older build under test (2l, 2m): its own CRDs.
        let status = Command::new(scale::binary())
            .args(["install", "--timeout", "60s"])
            .env("KUBECONFIG", &plane.kubeconfig)
            .status()?;
        ensure!(status.success(), "install with {}", scale::binary());
    } else {
        controlplane::install_crds(&plane.kubeconfig)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let measured = runtime.block_on(measure(&plane, &scale));
    drop(runtime);
    let stopped = plane.down();
    let (mut rows, version) = measured?;
    stopped?;
    rows.sort_by_key(|r| r.id);
    let load_after = machine::load_average();
    print!(
        "{}",
        table(
            &scale,
            &rows,
            &version,
            &load_before,
            &load_after,
            started.elapsed()
        )
    );
    Ok(())
}

async fn measure(plane: &ControlPlane, scale: &Scale) -> anyhow::Result<(Vec<Row>, String)> {
    let admin = plane.client().await?;
    let version = admin.apiserver_version().await?.git_version;
    let mut rows = Vec::new();
    // First, while the cluster holds no other PortAllocation: `sync --all -A` and `get -A` see
    // only their own (2h deletes its objects when done).
    if scale.wants("2h") {
        eprintln!(
            "2h: sync --all -A of {} fresh PortAllocations (group commit)",
            scale.group
        );
        rows.extend(group_commit::group_commit(plane, &admin, scale.group).await?);
    }
    // Also while the cluster holds no other PortAllocation (`sync --all -A`); it deletes its
    // PortAllocations and pods when done.
    if scale.wants("2s") {
        eprintln!("2s: the envelope, 15,000 PortAllocations x 10 pods x 5 ports");
        rows.extend(or_failed(
            "2s",
            envelope::measure(plane, &admin, scale.quick).await,
        )?);
    }
    if scale.wants("2i") {
        rows.extend(encodings::record_sizes()?);
    }
    if scale.wants("2e") {
        eprintln!("2e: CLI latency on {} PortAllocations", scale.get_objects);
        rows.extend(cli_latency(plane, &admin, scale).await?);
    }
    if scale.wants("2a") {
        eprintln!("2a: API requests per operation");
        rows.extend(request_counts(plane, &admin, scale).await?);
    }
    if scale.wants("2b") {
        eprintln!("2b/2c: throughput and latency, ours and NodePort Services");
        rows.extend(throughput(plane, &admin, scale).await?);
    }
    if scale.wants("2d") {
        eprintln!("2d: duplicates, random baseline and ours");
        rows.extend(duplicates(plane, &admin, scale).await?);
    }
    if scale.wants("2j") {
        eprintln!("2j: the JSON Patch `test` lever against whole-object compare-and-swap");
        let clients = plane.clients(16).await?;
        rows.extend(levers::measure(&clients, "levers", scale.per_round).await?);
    }
    if scale.wants("2l") {
        eprintln!("2l: 16 concurrent CLI processes creating");
        rows.extend(or_failed(
            "2l",
            scale::cli_race(plane, &admin, scale.quick).await,
        )?);
    }
    if scale.wants("2m") {
        eprintln!("2m: sync --all of 25,000 and 65,535 PortAllocations");
        rows.extend(or_failed(
            "2m",
            scale::sync_all_at_scale(plane, &admin, scale.quick).await,
        )?);
    }
    if scale.wants("2n") {
        eprintln!("2n: pools that fill, through the CLI");
        rows.extend(or_failed(
            "2n",
            filling::measure(plane, &admin, scale.quick).await,
        )?);
    }
    if scale.wants("2k") {
        eprintln!("2k: a sharded pool holding every port of 1-65535");
        rows.extend(full_pool::measure(&admin, scale.quick).await?);
    }
    if scale.wants("2r") {
        eprintln!("2r: a GPU fleet placed by kube-scheduler, ports reused across nodes");
        rows.extend(or_failed("2r", fleet::measure(scale.quick).await)?);
    }
    if !scale.wants("2g") {
        return Ok((rows, version));
    }
    eprintln!(
        "2g: a burst of {} PortAllocations for the watcher",
        scale.burst
    );
    let (all_ready, created) = burst::watcher_burst(&admin, scale.burst).await?;
    rows.push(Row {
        id: "2g",
        what: format!(
            "sync --watch: {} PortAllocations applied back to back (creates took {:.1} s) until all Ready",
            scale.burst,
            created.as_secs_f64()
        ),
        ours: format!(
            "{:.1} s ({:.0}/s)",
            all_ready.as_secs_f64(),
            scale.burst as f64 / all_ready.as_secs_f64()
        ),
        anchor: dash(),
        ratio: dash(),
        target: dash(),
        met: dash(),
    });
    Ok((rows, version))
}

// ---- 2a ---------------------------------------------------------------------------------------

async fn request_counts(
    plane: &ControlPlane,
    admin: &Client,
    scale: &Scale,
) -> anyhow::Result<Vec<Row>> {
    let (ns, pool) = ("requests", "requests");
    workload::create_namespace(admin, ns).await?;
    workload::create_pool(admin, pool, "20000-29999").await?;
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), ns);
    let dir = tempfile::tempdir()?;
    let kubeconfig = &plane.kubeconfig;
    let mut measured: [Vec<(u32, u64, String)>; 3] = Default::default();
    // The first command of a machine (an empty cache): it reads the pool's spec and the shard.
    let cold_cache = tempfile::tempdir()?;
    let cold_file = dir.path().join("cold.yaml");
    std::fs::write(
        &cold_file,
        serde_yaml::to_string(&workload::allocation("cold", ns, pool, 1, 1))?,
    )?;
    let cold_file = cold_file.to_string_lossy().into_owned();
    let cold_dir = cold_cache.path().to_string_lossy().into_owned();
    let cold = count_requests(admin, || {
        cli::run(
            kubeconfig,
            &["create", "-f", &cold_file, "--cache-dir", &cold_dir],
        )
    })
    .await?;
    // The rest share one cache directory, as one user's commands do.
    let warm_cache = tempfile::tempdir()?;
    let warm_dir = warm_cache.path().to_string_lossy().into_owned();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--cache-dir", warm_dir.as_str()]);
        cli::run(kubeconfig, &all)
    };
    run(&["sync", "cold", "-n", ns]);
    for &ports in &scale.request_ports {
        // `create -f` of a new object: the path users run.
        let name = format!("create-{ports}");
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            serde_yaml::to_string(&workload::allocation(&name, ns, pool, ports, 1))?,
        )?;
        let file = file.to_string_lossy().into_owned();
        let (count, breakdown) = count_requests(admin, || run(&["create", "-f", &file])).await?;
        measured[0].push((ports, count, breakdown));

        // `sync` of that object, already allocated: nothing to write.
        let (count, breakdown) = count_requests(admin, || run(&["sync", &name, "-n", ns])).await?;
        measured[1].push((ports, count, breakdown));

        // `sync` of an object applied by someone else (kubectl apply, Argo CD): allocate it.
        let fresh = format!("fresh-{ports}");
        api.create(
            &PostParams::default(),
            &workload::allocation(&fresh, ns, pool, ports, 1),
        )
        .await?;
        let (count, breakdown) = count_requests(admin, || run(&["sync", &fresh, "-n", ns])).await?;
        measured[2].push((ports, count, breakdown));
        let held = api
            .get(&fresh)
            .await?
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default()
            .len();
        ensure!(held == ports as usize, "{fresh} holds {held} ports");
    }
    // A long-lived Allocator (the watcher's, a throughput client's): create then sync, one after
    // another, deciding against the pool its last write returned, and (before) reading it first.
    let mut in_process = Vec::new();
    for remember in [false, true] {
        let allocator = Allocator::new(admin.clone()).remember_shards(remember);
        // Long-lived: it has met every shard of the pool (40 here) before the counted ones.
        for i in 0..80 {
            let pa = workload::allocation(&format!("lib-{remember}-warm-{i}"), ns, pool, 1, 1);
            workload::allocate(&allocator, &api, pa).await?;
        }
        let n = 20u64;
        let before = metrics::scrape(admin).await?;
        for i in 0..n {
            let pa = workload::allocation(&format!("lib-{remember}-{i}"), ns, pool, 1, 1);
            workload::allocate(&allocator, &api, pa).await?;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (count, breakdown) = metrics::delta(&before, &metrics::scrape(admin).await?);
        in_process.push((remember, count as f64 / n as f64, breakdown, n));
    }
    let labels = [
        "`kubectl portalloc create -f` (new object)",
        "`kubectl portalloc sync NAME`, already allocated",
        "`kubectl portalloc sync NAME`, freshly applied",
    ];
    let mut rows: Vec<Row> = in_process
        .iter()
        .map(|(remember, per, breakdown, n)| Row {
            id: "2a",
            what: format!(
                "API requests per allocation (create + sync, 1 port) by one long-lived Allocator, {n} in a row, {}",
                if *remember {
                    "after 80 others, deciding against the shard its last write returned"
                } else {
                    "reading the pool first (before)"
                }
            ),
            ours: format!("{per:.2} ({breakdown})"),
            anchor: dash(),
            ratio: dash(),
            target: "≤ 3".into(),
            met: yes_no(*per <= 3.0),
        })
        .collect();
    rows.push(Row {
        id: "2a",
        what: "API requests per `kubectl portalloc create -f` (new object, 1 port), empty cache directory".into(),
        ours: format!("{} ({})", cold.0, cold.1),
        anchor: dash(),
        ratio: dash(),
        target: "—".into(),
        met: dash(),
    });
    let targets = [4, 2, 3];
    rows.extend(labels.iter().zip(measured).zip(targets).map(|((label, results), target)| {
        let sizes: Vec<String> = results.iter().map(|(p, _, _)| p.to_string()).collect();
        let counts: Vec<String> = results.iter().map(|(_, c, _)| c.to_string()).collect();
        let mut breakdowns: Vec<&str> = results.iter().map(|(_, _, b)| b.as_str()).collect();
        breakdowns.dedup();
        Row {
            id: "2a",
            what: format!(
                "API requests per {label}, {} ports, the cache directory kept from the command before",
                sizes.join(" / ")
            ),
            ours: format!("{} ({})", counts.join(" / "), breakdowns.join("; ")),
            anchor: dash(),
            ratio: dash(),
            target: format!("≤ {target} (1 port)"),
            met: yes_no(results.first().is_some_and(|(_, c, _)| *c <= target)),
        }
    }));
    Ok(rows)
}

/// Runs one CLI command and counts the requests it made from the server's own counters.
async fn count_requests(
    admin: &Client,
    run: impl FnOnce() -> std::process::Output,
) -> anyhow::Result<(u64, String)> {
    let before = metrics::scrape(admin).await?;
    let output = run();
    ensure!(
        output.status.success(),
        "kubectl-portalloc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The counter is bumped as the handler returns, possibly just after the response is sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = metrics::scrape(admin).await?;
    Ok(metrics::delta(&before, &after))
}

// ---- 2b / 2c ----------------------------------------------------------------------------------

async fn throughput(
    plane: &ControlPlane,
    admin: &Client,
    scale: &Scale,
) -> anyhow::Result<Vec<Row>> {
    let (ns, svc_ns) = ("throughput", "services");
    workload::create_namespace(admin, ns).await?;
    workload::create_namespace(admin, svc_ns).await?;
    let max_clients = *scale.concurrency.iter().max().unwrap();
    let clients = plane.clients(max_clients).await?;

    // Warm-up, not measured: connections, caches, the first objects of each kind.
    workload::create_pool(admin, "warm-up", "40000-42767").await?;
    let warm = workload::run_ours(&clients[..4], ns, "warm-up", "warm", 16, 1).await;
    ensure!(warm.failures.is_empty(), "warm-up: {:?}", warm.failures);
    let warm = workload::run_services(&clients[..4], svc_ns, "warm", 16, 1).await;
    ensure!(warm.failures.is_empty(), "warm-up: {:?}", warm.failures);
    workload::delete_services(&clients, svc_ns).await?;

    let mut rows = Vec::new();
    let mut scaling = Vec::new();
    let server_before = metrics::scrape_durations(admin).await?;
    for &ports in &scale.sizes {
        let mut per_concurrency = Vec::new();
        for &concurrency in &scale.concurrency {
            let mut ours = Cell::default();
            let mut theirs = Cell::default();
            for round in 0..scale.rounds {
                let tag = format!("p{ports}-c{concurrency}-r{round}");
                // A fresh pool the size of the NodePort range, so both start each round empty.
                workload::create_pool(admin, &tag, "40000-42767").await?;
                let clients = &clients[..concurrency];
                ours.absorb(
                    workload::run_ours(clients, ns, &tag, &tag, scale.per_round, ports).await,
                );
                theirs.absorb(
                    workload::run_services(clients, svc_ns, &tag, scale.per_round, ports).await,
                );
                workload::delete_services(clients, svc_ns).await?;
            }
            eprintln!(
                "  {ports}-port, {concurrency} clients: ours {:.0} ports/s, NodePort {:.0} ports/s",
                ours.ports_per_second(),
                theirs.ports_per_second()
            );
            let ratio = ours.ports_per_second() / theirs.ports_per_second();
            let targeted = ports == 8 && concurrency == 16;
            rows.push(Row {
                id: "2b/2c",
                what: format!(
                    "{ports}-port allocations, {concurrency} concurrent client{}: ports/s (p50 / p99 per allocation)",
                    if concurrency == 1 { "" } else { "s" }
                ),
                ours: format!(
                    "{:.0} ports/s ({:.1} / {:.1} ms); {} conflicts, {} retries in {} allocations{}",
                    ours.ports_per_second(),
                    ours.percentile_ms(50.0),
                    ours.percentile_ms(99.0),
                    ours.conflicts,
                    ours.retries(),
                    ours.ops,
                    failures(&ours)
                ),
                anchor: format!(
                    "{:.0} ports/s ({:.1} / {:.1} ms) in {} Services{}",
                    theirs.ports_per_second(),
                    theirs.percentile_ms(50.0),
                    theirs.percentile_ms(99.0),
                    theirs.ops,
                    failures(&theirs)
                ),
                ratio: format!("{ratio:.2}"),
                target: if targeted { "≥ 1.0".into() } else { dash() },
                met: if targeted { yes_no(ratio >= 1.0) } else { dash() },
            });
            per_concurrency.push((concurrency, ours, theirs));
        }
        scaling.push((ports, per_concurrency));
    }

    // Where the time goes: the API server's own time per request over all the cells above.
    let server_after = metrics::scrape_durations(admin).await?;
    let mean = |verb, group, resource, subresource| {
        let (ms, count) = metrics::mean_duration_ms(
            &server_before,
            &server_after,
            verb,
            group,
            resource,
            subresource,
        );
        format!(
            "{verb} {resource}{}{subresource} {ms:.1} ms (×{count})",
            if subresource.is_empty() { "" } else { "/" }
        )
    };
    let group = "portalloc.dev";
    rows.push(Row {
        id: "2b/2c",
        what: "API server time per request during the cells above (mean of its \
               `apiserver_request_duration_seconds`; 409s included)"
            .into(),
        ours: [
            mean("POST", group, "portallocations", ""),
            mean("GET", group, "portpoolshards", ""),
            mean("PUT", group, "portpoolshards", "status"),
            mean("LIST", group, "portpoolshards", ""),
            mean("PUT", group, "portallocations", "status"),
        ]
        .join(", "),
        anchor: mean("POST", "", "services", ""),
        ratio: dash(),
        target: dash(),
        met: dash(),
    });

    // Does contention on one pool object cost more than half the single-client throughput?
    let mut ours_text = Vec::new();
    let mut theirs_text = Vec::new();
    let mut holds = false;
    for (ports, cells) in &scaling {
        let one = cells.first().map(|c| c.1.ports_per_second()).unwrap_or(0.0);
        let most = cells.last().map(|c| c.1.ports_per_second()).unwrap_or(0.0);
        let one_k = cells.first().map(|c| c.2.ports_per_second()).unwrap_or(0.0);
        let most_k = cells.last().map(|c| c.2.ports_per_second()).unwrap_or(0.0);
        holds |= most < one / 2.0;
        ours_text.push(format!("{ports}-port {:.2}", most / one));
        theirs_text.push(format!("{ports}-port {:.2}", most_k / one_k));
    }
    // PORTALLOC_BENCH_SHARDS=1 measures the shard lever whatever the condition says.
    if holds || std::env::var("PORTALLOC_BENCH_SHARDS").is_ok_and(|v| v == "1") {
        let most = *scale.concurrency.iter().max().unwrap();
        for (ports, cells) in &scaling {
            let single = &cells.first().expect("cells").1;
            let anchor_most = &cells.last().expect("cells").2;
            for &shards in &scale.shards {
                let mut sharded = Cell::default();
                for round in 0..scale.rounds {
                    let tag = format!("p{ports}-s{shards}-r{round}");
                    let pools = shard_pools(admin, &tag, 40000, 42767, shards).await?;
                    sharded.absorb(
                        workload::run_sharded(
                            &clients[..most],
                            ns,
                            &pools,
                            &tag,
                            scale.per_round,
                            *ports,
                        )
                        .await,
                    );
                }
                eprintln!(
                    "  {ports}-port, {most} clients, {shards} shards: ours {:.0} ports/s",
                    sharded.ports_per_second()
                );
                let ratio = sharded.ports_per_second() / anchor_most.ports_per_second();
                let targeted = *ports == 8;
                rows.push(Row {
                    id: "2b/2c",
                    what: format!(
                        "{ports}-port allocations, {most} clients, pool split in {shards} shards \
                         (sub-ranges; shard by name hash, next shard when full)"
                    ),
                    ours: format!(
                        "{:.0} ports/s ({:.1} / {:.1} ms); {} conflicts, {} retries in {} allocations{}; \
                         {:.2}× the unsharded 1-client figure",
                        sharded.ports_per_second(),
                        sharded.percentile_ms(50.0),
                        sharded.percentile_ms(99.0),
                        sharded.conflicts,
                        sharded.retries(),
                        sharded.ops,
                        failures(&sharded),
                        sharded.ports_per_second() / single.ports_per_second()
                    ),
                    anchor: format!(
                        "{:.0} ports/s (NodePort, {most} clients, above)",
                        anchor_most.ports_per_second()
                    ),
                    ratio: format!("{ratio:.2}"),
                    target: if targeted { "≥ 1.0".into() } else { dash() },
                    met: if targeted { yes_no(ratio >= 1.0) } else { dash() },
                });
            }
        }
    }
    rows.push(Row {
        id: "2b/2c",
        what: format!(
            "throughput at {} clients ÷ at 1 client (shard the pool only if < 0.5)",
            scale.concurrency[2]
        ),
        ours: ours_text.join(", "),
        anchor: theirs_text.join(", "),
        ratio: dash(),
        target: "≥ 0.5".into(),
        met: if holds {
            "**no**: shard condition holds".into()
        } else {
            "yes: condition does not hold, no shards".into()
        },
    });
    Ok(rows)
}

/// `shards` PortPools over consecutive, disjoint sub-ranges of `first..=last`.
async fn shard_pools(
    admin: &Client,
    tag: &str,
    first: u32,
    last: u32,
    shards: u32,
) -> anyhow::Result<Vec<String>> {
    let size = last - first + 1;
    let mut pools = Vec::new();
    for k in 0..shards {
        let from = first + size * k / shards;
        let to = first + size * (k + 1) / shards - 1;
        let name = format!("{tag}-shard{k}");
        workload::create_pool(admin, &name, &format!("{from}-{to}")).await?;
        pools.push(name);
    }
    Ok(pools)
}

fn failures(cell: &Cell) -> String {
    match cell.failures.first() {
        None => String::new(),
        Some(first) => format!("; **{} failed** (first: {first})", cell.failures.len()),
    }
}

// ---- 2d ---------------------------------------------------------------------------------------

async fn duplicates(
    plane: &ControlPlane,
    admin: &Client,
    scale: &Scale,
) -> anyhow::Result<Vec<Row>> {
    let ns = "duplicates";
    workload::create_namespace(admin, ns).await?;
    let clients = plane.clients(16).await?;
    let (first, last) = (45000u16, 49999u16);
    let mut rng = StdRng::seed_from_u64(6);
    let mut rows = Vec::new();
    for ports in [1u32, 4] {
        let pool = format!("duplicates-{ports}");
        workload::create_pool(admin, &pool, &format!("{first}-{last}")).await?;
        let cell = workload::run_ours(
            &clients,
            ns,
            &pool,
            &pool,
            scale.duplicate_pods as usize,
            ports,
        )
        .await;
        ensure!(
            cell.failures.is_empty(),
            "duplicates workload: {:?}",
            cell.failures
        );
        let (handed_out, distinct) = handed_out_ports(admin, &pool).await?;
        let ours_duplicates = handed_out - distinct;
        let random = baseline::simulate(
            scale.duplicate_pods,
            ports,
            first,
            last,
            scale.random_trials,
            &mut rng,
        );
        rows.push(Row {
            id: "2d",
            what: format!(
                "ports handed out twice: {} pods × {ports} port{} in a 5,000-port range, one call per pod",
                scale.duplicate_pods,
                if ports == 1 { "" } else { "s" }
            ),
            ours: format!(
                "{ours_duplicates} of {handed_out} ports (measured: 16 concurrent clients, {} conflicts retried)",
                cell.conflicts
            ),
            anchor: format!(
                "RoleBasedGroup random (simulated): {:.2} per workload; ≥ 1 in {:.0}% of {} workloads",
                random.mean_duplicates,
                random.share_with_duplicate * 100.0,
                random.trials
            ),
            ratio: dash(),
            target: "ours 0".into(),
            met: yes_no(ours_duplicates == 0),
        });
    }
    Ok(rows)
}

/// Every port the pool's PortAllocations record in their status and the pool records for its
/// holders, counted with repeats and without: the difference is the number of duplicates.
async fn handed_out_ports(admin: &Client, pool: &str) -> anyhow::Result<(usize, usize)> {
    let pools: Api<PortPool> = Api::all(admin.clone());
    let record = workload::window_record(admin, &pools.get(pool).await?).await?;
    ensure!(
        record.anomalies.is_empty(),
        "pool {pool}: {:?}",
        record.anomalies
    );
    let api: Api<PortAllocation> = Api::all(admin.clone());
    let mut ports = Vec::new();
    for pa in api.list(&Default::default()).await?.items {
        if pa.spec.pool != pool {
            continue;
        }
        let recorded = pa
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default();
        let uid = pa.uid().unwrap_or_default();
        if recorded != record.holdings_of(&uid) {
            bail!("{}: status and pool entry differ", pa.name_any());
        }
        ports.extend(recorded.ports());
    }
    let handed_out = ports.len();
    ports.sort_unstable();
    ports.dedup();
    Ok((handed_out, ports.len()))
}

// ---- 2e ---------------------------------------------------------------------------------------

async fn cli_latency(
    plane: &ControlPlane,
    admin: &Client,
    scale: &Scale,
) -> anyhow::Result<Vec<Row>> {
    let (ns, pool) = ("listing", "listing");
    workload::create_namespace(admin, ns).await?;
    workload::create_pool(admin, pool, "50000-59999").await?;
    let clients = plane.clients(4).await?;
    let cell = workload::run_ours(&clients, ns, pool, "job", scale.get_objects, 4).await;
    ensure!(
        cell.failures.is_empty(),
        "listing setup: {:?}",
        cell.failures
    );

    let kubeconfig = plane.kubeconfig.clone();
    let cache = tempfile::tempdir()?;
    let ours = || cli::command(&kubeconfig, &["get", "-A"]);
    let theirs = || {
        let mut command = Command::new(cli::KUBECTL);
        command
            .args(["get", "portallocations", "-A", "--cache-dir"])
            .arg(cache.path())
            .env("KUBECONFIG", &kubeconfig);
        command
    };
    let kubectl = cli::kubectl_available();
    // One warm-up each (kubectl fills its discovery cache), then alternate so drift hits both.
    cli::time_runs(1, ours);
    if kubectl {
        cli::time_runs(1, theirs);
    }
    let mut ours_times = Vec::new();
    let mut theirs_times = Vec::new();
    for _ in 0..scale.cli_runs {
        ours_times.extend(cli::time_runs(1, ours));
        if kubectl {
            theirs_times.extend(cli::time_runs(1, theirs));
        }
    }
    let help = cli::time_runs(scale.help_runs, || cli::command(&kubeconfig, &["--help"]));
    let binary = if cli::is_release_binary() {
        "release binary"
    } else {
        "debug binary: not representative"
    };
    let ours_ms = median_ms(&ours_times);
    let (anchor, ratio, met) = if kubectl {
        let theirs_ms = median_ms(&theirs_times);
        let ratio = ours_ms / theirs_ms;
        (
            format!("`kubectl get portallocations -A`: {theirs_ms:.0} ms"),
            format!("{ratio:.2}"),
            yes_no(ratio <= 0.5),
        )
    } else {
        ("n/a (no /usr/bin/kubectl)".into(), dash(), dash())
    };
    Ok(vec![
        Row {
            id: "2e",
            what: format!(
                "`kubectl portalloc get -A` on {} PortAllocations, median of {} runs ({binary})",
                scale.get_objects, scale.cli_runs
            ),
            ours: format!("{ours_ms:.0} ms"),
            anchor,
            ratio,
            target: "≤ 0.5".into(),
            met,
        },
        Row {
            id: "2e",
            what: format!(
                "`kubectl-portalloc --help` start-up, median of {} runs ({binary})",
                scale.help_runs
            ),
            ours: format!(
                "{:.1} ms (first run {:.1} ms)",
                median_ms(&help),
                help[0].as_secs_f64() * 1e3
            ),
            anchor: dash(),
            ratio: dash(),
            target: dash(),
            met: dash(),
        },
    ])
}

fn median_ms(times: &[Duration]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted
        .get(sorted.len() / 2)
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

// ---- the table --------------------------------------------------------------------------------

fn etcd_version() -> String {
    let go_mod = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/controlplane/etcd/go.mod"
    );
    std::fs::read_to_string(go_mod)
        .ok()
        .and_then(|s| {
            s.lines().map(str::split_whitespace).find_map(|mut words| {
                match (words.next(), words.next()) {
                    (Some("go.etcd.io/etcd/server/v3"), Some(v)) => Some(v.to_string()),
                    _ => None,
                }
            })
        })
        .unwrap_or_else(|| "?".into())
}

fn table(
    scale: &Scale,
    rows: &[Row],
    version: &str,
    load_before: &str,
    load_after: &str,
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    report::Header {
        bench: "cluster",
        quick: scale.quick,
        elapsed,
        machine_extra: None,
        setup: &["pool record: PortPoolShards of 256 ports"],
        cells: &scale.cells,
        load: (load_before, load_after),
    }
    .write(&mut out);
    let _ = writeln!(
        out,
        "control plane: kube-apiserver {version} + etcd {} on loopback (scripts/local-cluster.sh), \
         --service-node-port-range 30000-32767; our clients: one kube Client each, tokio tasks \
         in one process; a throughput cell is {} round(s) of {} allocations, each round on a fresh \
         2,768-port pool and (anchor) after deleting the previous round's Services\n",
        etcd_version(),
        scale.rounds,
        scale.per_round
    );
    report::write_head(
        &mut out,
        &[
            "measurement",
            "kubectl-portalloc",
            "Kubernetes / baseline",
            "ours ÷ theirs",
            "target",
            "met",
        ],
    );
    for row in rows {
        report::write_row(
            &mut out,
            &[
                row.id,
                &row.what,
                &row.ours,
                &row.anchor,
                &row.ratio,
                &row.target,
                &row.met,
            ],
        );
    }
    out
}

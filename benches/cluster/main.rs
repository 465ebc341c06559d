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
mod cli_latency;
// The control plane of the end-to-end tests, started the same way, and the kube-scheduler,
// kube-controller-manager, Node objects and webhook process of the scheduling tests (2r).
#[path = "../../tests/common/mod.rs"]
mod common;
mod duplicates;
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
// Quick mode, the cells asked for, the table's header and lines (shared with benches/node).
mod report;
mod requests;
mod scale;
mod throughput;
mod workload;

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::ensure;
use common::control_plane as controlplane;
use common::{controllers, nodes, webhook};

use controlplane::ControlPlane;
use report::{dash, yes_no};

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
        rows.extend(cli_latency::cli_latency(plane, &admin, scale).await?);
    }
    if scale.wants("2a") {
        eprintln!("2a: API requests per operation");
        rows.extend(requests::request_counts(plane, &admin, scale).await?);
    }
    if scale.wants("2b") {
        eprintln!("2b/2c: throughput and latency, ours and NodePort Services");
        rows.extend(throughput::throughput(plane, &admin, scale).await?);
    }
    if scale.wants("2d") {
        eprintln!("2d: duplicates, random baseline and ours");
        rows.extend(duplicates::duplicates(plane, &admin, scale).await?);
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

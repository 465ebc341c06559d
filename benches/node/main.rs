//! The node agent (`kubectl portalloc node-agent`) measured on this machine, as root: one
//! command, one table.
//!
//!   cargo bench --bench node                                  full run (release binary)
//!   PORTALLOC_BENCH_QUICK=1 cargo test --locked --bench node  quick mode: tiny counts, same code
//!
//! - bind: what the bind guard costs a bind. A process in a pod's cgroup (this binary
//!   re-executed, child.rs) times socket + bind + close pairs on TCP/IPv4, of a port of a
//!   guarded pool that pod holds and of a port outside every pool, with the guard attached to
//!   `kubepods` and without, in alternating rounds (bind_cost.rs). Needs no API server.
//! - ready: the time from a pod's creation to its port being guarded, with the agent binary
//!   running in a network namespace of its own against a local kube-apiserver (agent.rs).
//! - rss: the agent's memory (VmRSS, VmHWM) with 1,000 pods on its node, and that of a fresh
//!   agent started on such a node.
//!
//! A bench target of its own rather than a cell of benches/cluster: it needs root (cgroup BPF
//! programs, network namespaces) where the cluster benchmark does not, it runs its own binary
//! as a child in a pod's cgroup, and its figures (ns, ms, MiB of one process) are not
//! comparisons with an anchor, which the cluster table's columns are.
//!
//! `PORTALLOC_BENCH_CELLS=bind,ready,rss` runs only the cells named. Quick mode is chosen by
//! `PORTALLOC_BENCH_QUICK=1`, by `--quick`, or by running without the `--bench` flag that
//! `cargo bench` passes (so `cargo test --benches` never runs the full size).

// The node (its network namespace, cgroup tree and agent) and the control plane of the
// end-to-end tests, started the same way (shared test code).
#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../cluster/machine.rs"]
mod machine;
// Quick mode, the cells asked for, the table's header and lines.
#[path = "../cluster/report.rs"]
mod report;

mod agent;
mod bind_cost;
mod child;
mod toggle;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::bail;
use common::agent_node;
use common::control_plane as controlplane;
use report::{dash, yes_no};

/// How much of everything to do.
pub struct Scale {
    quick: bool,
    /// Pairs per block and blocks each way (bind).
    bind_pairs: u32,
    bind_rounds: usize,
    /// Pods measured one after another (ready).
    ready_pods: usize,
    /// Pods on the node in the end (rss); the PortAllocation's replicas.
    pods: usize,
    /// The cells to run (`PORTALLOC_BENCH_CELLS`); `None`: all of them.
    cells: Option<Vec<String>>,
}

impl Scale {
    fn new(quick: bool) -> Scale {
        Scale {
            quick,
            bind_pairs: if quick { 5_000 } else { 10_000 },
            bind_rounds: if quick { 4 } else { 40 },
            ready_pods: if quick { 5 } else { 100 },
            pods: if quick { 50 } else { 1_000 },
            cells: report::cells_asked(),
        }
    }

    /// Whether cell `id` (`bind`, `ready`, `rss`) is to run.
    fn wants(&self, id: &str) -> bool {
        report::wants(&self.cells, id)
    }
}

/// One line of the table.
pub struct Row {
    id: &'static str,
    what: String,
    figure: String,
    target: String,
    met: String,
}

fn main() -> anyhow::Result<()> {
    // A child first: the bind loop or the probe (child.rs).
    if let Ok(mode) = std::env::var(child::MODE) {
        return child::run(&mode);
    }
    let quick = report::quick_mode();
    let scale = Scale::new(quick);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "the node benchmark attaches cgroup BPF programs, makes network namespaces and moves \
             processes between cgroups: run it as root"
        );
    }
    let started = Instant::now();
    let load_before = machine::load_average();
    eprintln!("node bench ({} mode)", if quick { "quick" } else { "full" });
    let mut rows = Vec::new();
    if scale.wants("bind") {
        eprintln!(
            "bind: {} rounds each way of {} socket + bind + close pairs",
            scale.bind_rounds, scale.bind_pairs
        );
        // In a network namespace of its own, on a thread of its own (unshare moves only the
        // calling thread; the agent cells below must still reach the API server): in the
        // machine's namespace, a fixed port can be held by another process's connection, as
        // a CI run showed (EADDRINUSE on the pool's port).
        rows.extend(std::thread::scope(|threads| {
            threads
                .spawn(|| {
                    common::node_cgroups::own_network_namespace();
                    bind_cost::measure(&scale)
                })
                .join()
                .expect("the bind cell's thread panicked")
        })?);
    }
    let mut version = None;
    if scale.wants("ready") || scale.wants("rss") {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let (measured, v) = agent::measure(&runtime, &scale)?;
        rows.extend(measured);
        version = Some(v);
    }
    let load_after = machine::load_average();
    print!(
        "{}",
        table(
            &scale,
            &rows,
            version.as_deref(),
            (&load_before, &load_after),
            started.elapsed()
        )
    );
    Ok(())
}

fn kernel() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let jit = match std::fs::read_to_string("/proc/sys/net/core/bpf_jit_enable")
        .map(|s| s.trim().to_string())
        .as_deref()
    {
        Ok("0") => "off",
        Ok(_) => "on",
        Err(_) => "?",
    };
    format!("Linux {release}, BPF JIT {jit}")
}

fn table(
    scale: &Scale,
    rows: &[Row],
    version: Option<&str>,
    (load_before, load_after): (&str, &str),
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    report::Header {
        bench: "node",
        quick: scale.quick,
        elapsed,
        machine_extra: Some(kernel()),
        setup: &[],
        cells: &scale.cells,
        load: (load_before, load_after),
    }
    .write(&mut out);
    let binary = if env!("CARGO_BIN_EXE_kubectl-portalloc").contains("/release/") {
        "release binary"
    } else {
        "debug binary: not representative"
    };
    if let Some(version) = version {
        let _ = writeln!(
            out,
            "agent: `kubectl-portalloc node-agent` ({binary}) in a network namespace of its own, \
             reaching kube-apiserver {version} on loopback (scripts/local-cluster.sh) through a \
             relay over a UNIX socket; a cgroup v2 tree laid out as kubelet's (cgroupfs driver)  "
        );
    }
    let _ = writeln!(out);
    report::write_head(&mut out, &["measurement", "figure", "target", "met"]);
    for row in rows {
        report::write_row(
            &mut out,
            &[row.id, &row.what, &row.figure, &row.target, &row.met],
        );
    }
    out
}

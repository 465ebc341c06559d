//! What the bind guard costs a bind: a process in a pod's cgroup (the bench binary re-executed,
//! see child.rs) times socket + bind + close pairs with the guard attached to `kubepods` and
//! without, in short blocks that alternate (the guard's programs detached and attached again
//! between them, toggle.rs), so the load of a shared machine, which moves over seconds, hits
//! both alike; the figure is the median of the ratios of neighbouring blocks. No agent and no API server:
//! the guard is attached and its maps filled here, as tests/node/guard.rs does, and like it in a
//! network namespace of its own (main.rs), where no other process holds the fixed ports.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, bail, ensure};
use portalloc::node::bind_guard::BindGuard;
use portalloc::node::bind_program::{MODE_ENFORCE, POD_SEEN, QOS_DIR, slot};
use portalloc::node::cgroups::{self, CgroupDriver};
use portalloc::node::netns_cookie;

use crate::common::node_cgroups::{NodeCgroups, bind_in};
use crate::toggle::Programs;
use crate::{Row, Scale, child, dash, yes_no};

const HOLDER: &str = "11111111-2222-3333-4444-555555555555";
const OTHER: &str = "66666666-7777-8888-9999-aaaaaaaaaaaa";
/// The guarded pool, every port held by the binding pod (so its maps hold 2,000 owners).
const POOL: (u16, u16) = (41_000, 42_999);
/// The port bound in the pool, and one outside every pool.
const POOL_PORT: u16 = 41_234;
const OUTSIDE_PORT: u16 = 43_567;

/// The guard as the agent leaves it on a node: the pool's ports under Enforce, the pods seen,
/// the holder owning them.
fn attach(node: &NodeCgroups, holder: &Path) -> anyhow::Result<BindGuard> {
    let level = cgroups::level(&node.kubepods())? + 1;
    let guard = BindGuard::attach(&node.kubepods(), &node.pins(), level, netns_cookie()?)?;
    let found = cgroups::scan(&node.kubepods(), node.driver)?;
    let mut pods: BTreeMap<u64, u32> = found.qos_dirs.iter().map(|&id| (id, QOS_DIR)).collect();
    pods.extend(found.pods.values().map(|&id| (id, POD_SEEN)));
    guard.set_pods(&pods)?;
    let holder_id = cgroups::cgroup_id(holder.parent().expect("a pod above the container"))?;
    let mut modes = BTreeMap::new();
    let mut owners = BTreeMap::new();
    for port in POOL.0..=POOL.1 {
        for protocol in [0, 1] {
            modes.insert(slot(protocol, port), MODE_ENFORCE);
            owners.insert(slot(protocol, port), holder_id);
        }
    }
    guard.set_modes(&modes)?;
    guard.set_owners(&owners)?;
    // As a running agent's heartbeat leaves it: the holder entries count.
    guard.heartbeat(std::time::Duration::from_secs(3600))?;
    Ok(guard)
}

/// The binding process (child.rs's `bind-loop`), in a pod's cgroup for its whole life.
struct BindLoop {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl BindLoop {
    fn start(cgroup: &Path) -> anyhow::Result<BindLoop> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(child::MODE, "bind-loop")
            .arg(cgroup)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the bind loop")?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(BindLoop {
            child,
            stdin,
            stdout,
        })
    }

    /// ns per pair over `pairs` pairs on `port`.
    fn time(&mut self, pairs: u32, port: u16) -> anyhow::Result<f64> {
        writeln!(self.stdin, "{pairs} {port}")?;
        self.stdin.flush()?;
        let mut answer = String::new();
        self.stdout.read_line(&mut answer)?;
        if answer.is_empty() {
            bail!("the bind loop exited ({:?})", self.child.wait()?);
        }
        Ok(answer.trim().parse()?)
    }
}

impl Drop for BindLoop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// With the guard attached (`guarded`) or not, time a block of pairs on each of `ports`.
fn block(
    programs: &mut Programs,
    process: &mut BindLoop,
    guarded: bool,
    pairs: u32,
    ports: &[u16],
) -> anyhow::Result<Vec<f64>> {
    programs.set(guarded)?;
    ports
        .iter()
        .map(|&port| process.time(pairs, port))
        .collect()
}

#[derive(Default)]
struct Figures {
    without: Vec<f64>,
    with: Vec<f64>,
}

impl Figures {
    /// Median per-pair ns without and with, their ratio, and the median and range of the
    /// per-round ratios.
    fn summary(&self) -> (f64, f64, f64, f64, f64, f64) {
        let (without, with) = (median(&self.without), median(&self.with));
        let ratios: Vec<f64> = self
            .with
            .iter()
            .zip(&self.without)
            .map(|(w, wo)| w / wo)
            .collect();
        let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let high = ratios.iter().copied().fold(0.0, f64::max);
        (without, with, with / without, median(&ratios), low, high)
    }
}

pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

pub fn measure(scale: &Scale) -> anyhow::Result<Vec<Row>> {
    let node = NodeCgroups::new("bench-bind", CgroupDriver::Cgroupfs);
    // The binding pod (Burstable: the program finds it below its QoS directory, the longer
    // path) and another pod, both seen.
    let holder = node.pod(Some("burstable"), HOLDER);
    let other = node.pod(None, OTHER);
    let guard = attach(&node, &holder)?;
    let mut programs = Programs::of(&node.kubepods(), &node.pins())?;
    ensure!(
        programs.len() == 2,
        "the guard attached {} programs",
        programs.len()
    );
    // The toggle works: the other pod is refused the holder's port only while attached.
    for (on, expected) in [(false, "ok"), (true, "EPERM")] {
        programs.set(on)?;
        let got = bind_in(Some(&other), POOL_PORT, "tcp", "4");
        ensure!(
            got == expected,
            "guard {on}: the other pod's bind got {got}"
        );
    }
    let mut process = BindLoop::start(&holder)?;
    // Warm-up, not counted: the socket slabs, the program's JIT image, the maps' cache lines.
    for guarded in [false, true] {
        block(
            &mut programs,
            &mut process,
            guarded,
            scale.bind_pairs,
            &[POOL_PORT, OUTSIDE_PORT],
        )?;
    }
    let mut pool = Figures::default();
    let mut outside = Figures::default();
    for round in 0..scale.bind_rounds {
        // Without then with, then with then without (and the two ports likewise): a drift
        // over the run hits both alike.
        let (order, ports) = if round % 2 == 0 {
            ([false, true], [POOL_PORT, OUTSIDE_PORT])
        } else {
            ([true, false], [OUTSIDE_PORT, POOL_PORT])
        };
        let mut line = format!("  round {round}:");
        for guarded in order {
            let measured = block(
                &mut programs,
                &mut process,
                guarded,
                scale.bind_pairs,
                &ports,
            )?;
            let by_port: BTreeMap<u16, f64> = ports.iter().copied().zip(measured).collect();
            let (in_pool, out_of_pools) = (by_port[&POOL_PORT], by_port[&OUTSIDE_PORT]);
            let (p, o) = if guarded {
                (&mut pool.with, &mut outside.with)
            } else {
                (&mut pool.without, &mut outside.without)
            };
            p.push(in_pool);
            o.push(out_of_pools);
            line += &format!(
                " guard {} {in_pool:.0} / {out_of_pools:.0} ns;",
                if guarded { "on" } else { "off" }
            );
        }
        eprintln!("{line}");
    }
    drop(process);
    drop(programs);
    drop(guard);
    let what = |port: &str| {
        format!(
            "socket + bind + close on TCP/IPv4 (SO_REUSEADDR, 127.0.0.1), {port}, by one process \
             in a pod's cgroup: ns per pair without the guard / with it, medians of {} blocks of \
             {} pairs each way, the guard's programs detached and attached again between blocks",
            scale.bind_rounds, scale.bind_pairs
        )
    };
    let row = |port: &str, figures: &Figures| {
        let (without, with, ratio, paired, low, high) = figures.summary();
        Row {
            id: "bind",
            what: what(port),
            figure: format!(
                "{without:.0} / {with:.0} ns: **{ratio:.3}×** ({:+.0} ns); with ÷ without block \
                 by block: {paired:.3}× (median; {low:.2}-{high:.2}×)",
                with - without
            ),
            target: "< 1.05×".into(),
            met: match (scale.quick, ratio < 1.05, paired < 1.05) {
                (true, _, _) => dash(),
                (false, a, b) if a == b => yes_no(a),
                // The two estimates fall on either side of the target.
                _ => "borderline".into(),
            },
        }
    };
    Ok(vec![
        row(
            "a port of a guarded pool (2,000 ports, Enforce) held by the binding pod",
            &pool,
        ),
        row("a port outside every pool", &outside),
    ])
}

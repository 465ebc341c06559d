//! The node agent against a real API server: how soon after a pod is created its port is
//! guarded, and how much memory the agent takes with 1,000 pods on its node.
//!
//! The node is tests/common/agent_node.rs (a network namespace of its own, the agent binary
//! inside it reaching the API server through a relay, a cgroup v2 tree laid out as kubelet's).
//! Pods are created with their `nodeName` and the labels the pod webhook would keep (a
//! PortAllocation `srv` of one `web` role, one port per pod, in a pool under `Enforce`), and
//! each gets its cgroup (Burstable) as soon as the API server has answered; the agent reads
//! their ports from the record, as it does for any pod.
//!
//! "Guarded" is read from the kernel: a process in the node's network namespace, in the cgroup
//! of a pod the agent has not seen (a fresh one, a pod the API does not show), binds the pod's
//! port every millisecond. While no seen pod holds the port, the program lets that unseen pod
//! claim it; the first EPERM is the moment the agent wrote the pod as the port's holder. (A pod
//! the agent has seen is refused every guarded port nobody holds, so it would be refused from
//! the start and could not tell.)

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, PostParams};
use portalloc::api::{POD_ALLOCATION_LABEL, POD_ROLE_LABEL, PortAllocation};
use tokio::runtime::Runtime;

use crate::agent_node::AgentNode;
use crate::controlplane::{self, ControlPlane};
use crate::{Row, Scale, child, dash, yes_no};

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");
const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench";
const POOL_RANGE: &str = "46000-47999";
/// Pods created at once while filling the node.
const CREATE_CONCURRENCY: usize = 16;
/// The agent's round (its default `--round`, which the bench keeps).
const AGENT_ROUND_MS: u64 = 200;
/// How long one pod may take to be guarded (an unseen pod stays unseen for 10 s).
const READY_TIMEOUT_MS: u64 = 9_000;

/// `kubectl-portalloc ARGS` against the cluster.
fn cli(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(BIN)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl-portalloc {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn pod_name(index: usize) -> String {
    format!("srv-web-{index}")
}

/// Pod `index` of the PortAllocation, bound to the node, as the webhook would leave it.
fn pod(index: usize) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": pod_name(index),
            "namespace": NAMESPACE,
            "labels": {POD_ALLOCATION_LABEL: "srv", POD_ROLE_LABEL: "web"},
        },
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        }
    }))?)
}

/// A UID no pod in the API has.
fn stranger_uid() -> String {
    let hex = format!("{:032x}", rand::random::<u128>());
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The probing process (child.rs's `probe`), in the node's network namespace, in the cgroup of
/// a pod the agent has not seen.
struct Probe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The unseen pod's cgroup it sits in (the container's).
    cgroup: Option<PathBuf>,
}

impl Probe {
    fn start(node: &AgentNode) -> anyhow::Result<Probe> {
        let mut child = node
            .nsenter()
            .arg(std::env::current_exe()?)
            .env(child::MODE, "probe")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the probe")?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Probe {
            child,
            stdin,
            stdout,
            cgroup: None,
        })
    }

    fn ask(&mut self, line: &str) -> anyhow::Result<String> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        let mut answer = String::new();
        self.stdout.read_line(&mut answer)?;
        ensure!(!answer.is_empty(), "the probe exited on {line:?}");
        Ok(answer.trim().to_string())
    }

    /// Move into the cgroup of a new pod the API does not show (the agent treats it as a pod
    /// not seen yet for 10 s), and remove the one before.
    fn become_unseen(&mut self, node: &AgentNode) -> anyhow::Result<()> {
        let cgroup = node.cgroups.pod(Some("besteffort"), &stranger_uid());
        let answer = self.ask(&format!("enter {}", cgroup.display()))?;
        ensure!(
            answer == "ok",
            "the probe could not enter {}",
            cgroup.display()
        );
        if let Some(before) = self.cgroup.replace(cgroup) {
            std::fs::remove_dir(&before)?;
            std::fs::remove_dir(before.parent().expect("the pod's"))?;
        }
        Ok(())
    }

    /// Bind `port` every millisecond until refused: what the first bind got, and when (the
    /// monotonic clock) the refusal came.
    fn wait_refused(&mut self, port: u16) -> anyhow::Result<(String, u64)> {
        let answer = self.ask(&format!("wait {port} {READY_TIMEOUT_MS}"))?;
        match answer.split_whitespace().collect::<Vec<_>>()[..] {
            ["refused", first, ns] => Ok((first.to_string(), ns.parse()?)),
            _ => bail!("port {port} not guarded within {READY_TIMEOUT_MS} ms: {answer}"),
        }
    }

    /// How many of `ports` a fresh unseen pod is refused.
    fn refused(&mut self, node: &AgentNode, ports: &[u16]) -> anyhow::Result<usize> {
        self.become_unseen(node)?;
        let list: Vec<String> = ports.iter().map(u16::to_string).collect();
        Ok(self.ask(&format!("count {}", list.join(" ")))?.parse()?)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VmRSS and VmHWM of the node's agent, in bytes.
fn agent_memory(node: &AgentNode) -> anyhow::Result<(u64, u64)> {
    let pid = node.agent_pid().context("no agent runs")?;
    // nsenter execs the agent: by now the pid is the agent's.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
    ensure!(
        exe.ends_with("kubectl-portalloc"),
        "pid {pid} is {} rather than the agent",
        exe.display()
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .context("a figure")?
            .parse()?;
        Ok(kib * 1024)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The nearest-rank percentile `p` of `values` (sorted here).
fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank - 1).copied().unwrap_or(f64::NAN)
}

/// Poll `check` every 50 ms until it is true; false after `within`.
fn eventually(
    within: Duration,
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<bool> {
    let start = Instant::now();
    while start.elapsed() < within {
        if check()? {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(false)
}

/// The control plane, the pool, the PortAllocation and the node with its agent running.
struct Setup {
    // Dropped in this order: the probe leaves its cgroup before the node removes the tree,
    // the node (agent, relay) goes before the control plane.
    probe: Probe,
    node: AgentNode,
    plane: ControlPlane,
    client: Client,
    /// Each pod's port, by index.
    ports: Vec<u16>,
    version: String,
    /// The agent's VmRSS and VmHWM with no pod on its node.
    idle: (u64, u64),
}

fn set_up(runtime: &Runtime, scale: &Scale) -> anyhow::Result<Setup> {
    let plane = ControlPlane::up("bench-node")?;
    controlplane::install_crds(&plane.kubeconfig)?;
    let client = runtime.block_on(plane.client())?;
    let version = runtime.block_on(client.apiserver_version())?.git_version;
    // The pods' namespace, and the agent's own, where it keeps its Lease.
    for name in [NAMESPACE, "portalloc-system"] {
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        runtime.block_on(
            Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace),
        )?;
    }
    cli(
        &plane.kubeconfig,
        &[
            "pool", "create", "guarded", "--range", POOL_RANGE, "--guard", "Enforce",
        ],
    )?;
    let manifest = format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: srv\nspec:\n  \
         pool: guarded\n  roles:\n  - name: web\n    replicas: {}\n    ports: [{{name: http, scope: \
         PodScoped, env: HTTP_PORT}}]\n",
        scale.pods
    );
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), manifest)?;
    cli(
        &plane.kubeconfig,
        &[
            "create",
            "-n",
            NAMESPACE,
            "-f",
            &file.path().to_string_lossy(),
        ],
    )?;
    let pa = runtime
        .block_on(Api::<PortAllocation>::namespaced(client.clone(), NAMESPACE).get("srv"))?;
    let ports = (0..scale.pods)
        .map(|index| {
            let injection = pa
                .pod_injection(&pod(index)?)
                .map_err(|e| anyhow::anyhow!("pod {index}: {e}"))?;
            Ok(injection.ports[0].first)
        })
        .collect::<anyhow::Result<Vec<u16>>>()?;

    let mut node = AgentNode::start(&plane.kubeconfig, "bench-agent");
    // The DaemonSet's settings: the default round (200 ms), -v 1.
    node.start_agent(&["--node-name", NODE, "-v", "1"]);
    let attached = eventually(Duration::from_secs(30), || {
        Ok(node.log().contains("bind guard attached"))
    })?;
    ensure!(
        attached,
        "the agent never attached the guard; its log:\n{}",
        node.log()
    );
    std::thread::sleep(Duration::from_secs(1));
    let idle = agent_memory(&node)?;
    let probe = Probe::start(&node)?;
    Ok(Setup {
        probe,
        node,
        plane,
        client,
        ports,
        version,
        idle,
    })
}

/// Create pod `index` and its cgroup: the monotonic time the API server's answer came.
async fn create_pod(setup_node: &AgentNode, pods: &Api<Pod>, index: usize) -> anyhow::Result<u64> {
    let created = pods.create(&PostParams::default(), &pod(index)?).await?;
    let at = child::monotonic_ns();
    let uid = created.metadata.uid.context("a created pod has a uid")?;
    setup_node.cgroups.pod(Some("burstable"), &uid);
    Ok(at)
}

/// Pods one after another, each measured from its creation to its port refused to another pod.
fn ready(runtime: &Runtime, setup: &mut Setup, scale: &Scale) -> anyhow::Result<Vec<Row>> {
    let pods: Api<Pod> = Api::namespaced(setup.client.clone(), NAMESPACE);
    let mut latencies = Vec::new();
    // Pod 0 warms the agent up (its first holding read, the connections) and is not counted.
    for index in 0..=scale.ready_pods {
        setup.probe.become_unseen(&setup.node)?;
        // The last pod was guarded just after one of the agent's rounds: without a pause of
        // its own, every pod would come the same few ms into a round and wait one round.
        std::thread::sleep(Duration::from_millis(rand::random_range(0..AGENT_ROUND_MS)));
        let created = runtime.block_on(create_pod(&setup.node, &pods, index))?;
        let (first, refused) = setup.probe.wait_refused(setup.ports[index])?;
        ensure!(
            first == "ok",
            "pod {index}: its port was refused to an unseen pod before the agent saw it ({first})"
        );
        let ms = refused.saturating_sub(created) as f64 / 1e6;
        if index > 0 {
            latencies.push(ms);
        }
    }
    eprintln!("  pod → guarded, ms: {latencies:.0?}");
    let (p50, p99) = (percentile(&latencies, 50.0), percentile(&latencies, 99.0));
    let (min, max) = (percentile(&latencies, 0.0), percentile(&latencies, 100.0));
    Ok(vec![Row {
        id: "ready",
        what: format!(
            "a pod created (the API server answered; its cgroup made at once) until its port is \
             refused to another pod: {} pods one after another, each at a random point of the \
             agent's {AGENT_ROUND_MS} ms round; polled every 1 ms",
            scale.ready_pods
        ),
        figure: format!("p50 **{p50:.0} ms**, p99 **{p99:.0} ms** (min {min:.0}, max {max:.0})"),
        target: dash(),
        met: dash(),
    }])
}

/// Fill the node to `scale.pods` pods, then the agent's memory; then a fresh agent started on
/// the full node, with the guard detached first (as on a node it was never on).
fn memory(runtime: &Runtime, setup: &mut Setup, scale: &Scale) -> anyhow::Result<Vec<Row>> {
    let pods: Api<Pod> = Api::namespaced(setup.client.clone(), NAMESPACE);
    let existing = runtime
        .block_on(pods.list(&Default::default()))?
        .items
        .len();
    let node = &setup.node;
    let started = Instant::now();
    runtime.block_on(
        futures::stream::iter(existing..scale.pods)
            .map(|index| create_pod(node, &pods, index))
            .buffer_unordered(CREATE_CONCURRENCY)
            .try_collect::<Vec<u64>>(),
    )?;
    let created = started.elapsed();
    let running = catch_up(setup, started)?;
    eprintln!(
        "  {} pods created in {:.1} s; {running}",
        scale.pods - existing,
        created.as_secs_f64(),
    );

    // A fresh agent on the full node, as after a first install: no guard there yet.
    setup.node.kill_agent();
    portalloc::node::bind_guard::BindGuard::detach(
        &setup.node.cgroups.kubepods(),
        &setup.node.cgroups.pins(),
    )?;
    let restarted = Instant::now();
    setup.node.start_agent(&["--node-name", NODE, "-v", "1"]);
    let fresh = catch_up(setup, restarted)?;
    eprintln!("  fresh agent: {fresh}");
    let met = |hwm: u64| {
        if scale.quick {
            dash()
        } else {
            yes_no(hwm < 50_000_000)
        }
    };
    let (idle_rss, idle_hwm) = setup.idle;
    Ok(vec![
        Row {
            id: "rss",
            what: format!(
                "agent memory, {} pods on its node (each holding a port of a guarded pool, each \
                 with its cgroup), created while it ran ({} at a time, in {:.1} s; all guarded \
                 {:.1} s after the first create): VmRSS / VmHWM; with no pod: {:.1} / {:.1} MiB",
                scale.pods,
                CREATE_CONCURRENCY,
                created.as_secs_f64(),
                running.ready.as_secs_f64(),
                mib(idle_rss),
                mib(idle_hwm)
            ),
            figure: format!(
                "**{:.1} MiB** / {:.1} MiB; {} sockets open",
                mib(running.rss),
                mib(running.hwm),
                running.sockets
            ),
            target: "< 50 MB".into(),
            met: met(running.hwm),
        },
        Row {
            id: "rss",
            what: format!(
                "a fresh agent started on that node ({} pods, guard detached first): VmRSS / \
                 VmHWM; every pod guarded {:.1} s after its start",
                scale.pods,
                fresh.ready.as_secs_f64()
            ),
            figure: format!(
                "**{:.1} MiB** / {:.1} MiB; {} sockets open",
                mib(fresh.rss),
                mib(fresh.hwm),
                fresh.sockets
            ),
            target: "< 50 MB".into(),
            met: met(fresh.hwm),
        },
    ])
}

/// The agent once it guards every pod of the node.
struct CaughtUp {
    /// Since `since`.
    ready: Duration,
    rss: u64,
    hwm: u64,
    /// Its sockets, most seen while it caught up and a second after (the API connections it
    /// opened stay in its pool while idle).
    sockets: usize,
}

impl std::fmt::Display for CaughtUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "all guarded after {:.1} s; VmRSS {:.1} MiB, VmHWM {:.1} MiB, up to {} sockets",
            self.ready.as_secs_f64(),
            mib(self.rss),
            mib(self.hwm),
            self.sockets
        )
    }
}

/// Wait until the agent guards every pod's port (each refused to an unseen pod), then a
/// second (five rounds) more, and read its memory.
fn catch_up(setup: &mut Setup, since: Instant) -> anyhow::Result<CaughtUp> {
    let all = setup.ports.clone();
    let mut sockets = 0;
    let caught_up = eventually(Duration::from_secs(120), || {
        sockets = sockets.max(agent_sockets(&setup.node));
        Ok(setup.probe.refused(&setup.node, &all)? == all.len())
    })?;
    ensure!(
        caught_up,
        "the agent did not guard all {} pods within 120 s; its log:\n{}",
        all.len(),
        setup.node.log()
    );
    let ready = since.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    sockets = sockets.max(agent_sockets(&setup.node));
    let (rss, hwm) = agent_memory(&setup.node)?;
    Ok(CaughtUp {
        ready,
        rss,
        hwm,
        sockets,
    })
}

/// How many sockets the agent has open (0 if it cannot be read).
fn agent_sockets(node: &AgentNode) -> usize {
    let Some(pid) = node.agent_pid() else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

/// The `ready` and `rss` cells (whichever `scale` wants), on one control plane and node.
pub fn measure(runtime: &Runtime, scale: &Scale) -> anyhow::Result<(Vec<Row>, String)> {
    let mut setup = set_up(runtime, scale)?;
    let mut rows = Vec::new();
    if scale.wants("ready") {
        eprintln!(
            "ready: pod created → port guarded, {} pods",
            scale.ready_pods
        );
        rows.extend(ready(runtime, &mut setup, scale)?);
    }
    if scale.wants("rss") {
        eprintln!(
            "rss: the agent's memory with {} pods on its node",
            scale.pods
        );
        rows.extend(memory(runtime, &mut setup, scale)?);
    }
    let Setup {
        probe,
        node,
        mut plane,
        version,
        ..
    } = setup;
    drop(probe);
    drop(node);
    plane.down()?;
    Ok((rows, version))
}

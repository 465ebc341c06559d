//! `kubectl portalloc node-agent`: run on every node (a DaemonSet), keeping every pool's ports
//! reserved in the node's kernel and guarding binds of pools with `spec.guard`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{CliError, Exit, GlobalArgs, Session};
use crate::k8s::node_agent::{NodeAgentOptions, run_node_agent};
use crate::k8s::process::{Readiness, listen_for_signals, signalled};
use crate::k8s::{self, Metrics};
use crate::node::bind_guard::BindGuard;
use crate::node::cgroups::{self, CgroupDriver};
use crate::node::reserved_ports::ReservedPorts;

/// Keep pools' ports reserved on this node and let only their holders bind them.
///
/// Run in the node's network namespace (hostNetwork), as root with CAP_BPF, CAP_NET_ADMIN and
/// CAP_SYS_ADMIN, with the node's cgroup v2 hierarchy mounted: docs/node-agent.md. Stops on
/// SIGTERM; the bind guard stays attached, so a restart opens no gap.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # On a node, as the DaemonSet of the Helm chart runs it (nodeAgent.enabled=true)
  kubectl portalloc node-agent --node-name \"$NODE_NAME\"

  # A node whose kubelet uses the systemd cgroup driver, with the hierarchy mounted elsewhere
  kubectl portalloc node-agent --node-name gpu-7 --cgroup-root /host/cgroup --cgroup-driver systemd

  # On a node whose agent was removed: take the guard and the agent's reserved ports away
  kubectl portalloc node-agent --detach")]
pub struct NodeAgentArgs {
    /// The node this agent runs on (the downward API's spec.nodeName).
    #[arg(
        long,
        env = "NODE_NAME",
        value_name = "NAME",
        required_unless_present = "detach"
    )]
    pub node_name: Option<String>,
    /// Remove what the agent put on this node, then exit: detach the bind guard's programs
    /// from kubelet's kubepods cgroup (found by name, as a restarted agent finds them) and take
    /// the agent's entries out of net.ipv4.ip_local_reserved_ports, leaving everyone else's.
    /// Stop the agent first (remove its DaemonSet), or it puts both back. Reads no API.
    #[arg(long)]
    pub detach: bool,
    /// Where the node's cgroup v2 hierarchy is mounted.
    #[arg(long, default_value = "/sys/fs/cgroup", value_name = "DIR")]
    pub cgroup_root: PathBuf,
    /// kubelet's cgroup driver; auto: whichever the tree shows (kubepods.slice: systemd).
    #[arg(long, value_enum, default_value = "auto", value_name = "DRIVER")]
    pub cgroup_driver: DriverFlag,
    /// Where the agent records which reserved ports it added (cleared by a reboot, as the
    /// setting is).
    #[arg(long, default_value = "/run/kubectl-portalloc", value_name = "DIR")]
    pub state_dir: PathBuf,
    /// The node's net.ipv4.ip_local_reserved_ports (a container's /proc/sys is read-only, so
    /// the chart mounts the host's file elsewhere).
    #[arg(
        long,
        default_value = crate::node::reserved_ports::SYSCTL,
        value_name = "FILE"
    )]
    pub reserved_ports_file: PathBuf,
    /// Serve /healthz, /readyz (once the pools and the node's pods are read) and /metrics here.
    #[arg(long, value_name = "ADDRESS")]
    pub metrics_address: Option<SocketAddr>,
    /// The namespace of the agent's Lease (its heartbeat and report, which pool describe reads);
    /// the downward API's metadata.namespace.
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "portalloc-system",
        value_name = "NS"
    )]
    pub lease_namespace: String,
    /// How often the Lease is renewed; pool describe calls an agent stopped after three times
    /// that.
    #[arg(long, default_value = "30s", value_parser = super::duration::parse_duration, value_name = "DURATION")]
    pub report_every: Duration,
    /// How often the kernel's state is brought up to date.
    #[arg(long, default_value = "200ms", value_parser = super::duration::parse_duration, value_name = "DURATION")]
    pub round: Duration,
    /// While the agent is away (stopped, crashing, rolled out), how long its last round's holder
    /// entries still refuse a pod new to the node a pool port; after that such a pod may claim
    /// the port (a StatefulSet's replacement binds), and the agent reports a claim that was not
    /// the pod's when it is back. Pods the agent has seen stay refused. At least twice --round.
    #[arg(long, default_value = "5s", value_parser = super::duration::parse_duration, value_name = "DURATION")]
    pub guard_lease: Duration,
}

pub async fn run(global: &GlobalArgs, args: NodeAgentArgs) -> anyhow::Result<()> {
    if args.detach {
        return detach(&args);
    }
    let node_name = args.node_name.clone().unwrap_or_default();
    if node_name.trim().is_empty() {
        return Err(CliError::new(
            Exit::Usage,
            "--node-name is empty: pass the node's name, or set NODE_NAME from the downward API (spec.nodeName)",
        )
        .into());
    }
    if args.guard_lease < args.round * 2 {
        return Err(CliError::new(
            Exit::Usage,
            format!(
                "--guard-lease {:?} is shorter than twice --round {:?}: the holder entries would lapse between two rounds of a running agent; pass a longer --guard-lease",
                args.guard_lease, args.round
            ),
        )
        .into());
    }
    let session = Session::connect(global).await?;
    let signals = listen_for_signals()?;
    let (readiness, metrics) = (Readiness::default(), Metrics::default());
    if let Some(address) = args.metrics_address {
        let bound = k8s::process::serve_probes(address, readiness.clone(), metrics.clone())
            .await
            .map_err(|e| CliError::new(Exit::Usage, format!("--metrics-address {address}: {e}")))?;
        tracing::info!("serving /healthz, /readyz and /metrics on {bound}");
    }
    let options = NodeAgentOptions {
        node_name,
        cgroup_root: args.cgroup_root,
        cgroup_driver: driver(args.cgroup_driver),
        state_dir: args.state_dir,
        reserved_ports_file: args.reserved_ports_file,
        round: args.round,
        guard_lease: args.guard_lease,
        lease_namespace: Some(args.lease_namespace),
        report_every: args.report_every,
    };
    let stop = signalled(signals, 1);
    run_node_agent(session.client, options, (readiness, metrics), stop).await
}

/// `--detach`: the guard off `kubepods`, the agent's reserved ports out, others' kept.
fn detach(args: &NodeAgentArgs) -> anyhow::Result<()> {
    let root = &args.cgroup_root;
    let driver = driver(args.cgroup_driver).unwrap_or_else(|| CgroupDriver::detect(root));
    let kubepods = root.join(driver.kubepods());
    let guard = if !cgroups::is_cgroup2(root) || !kubepods.is_dir() {
        format!(
            "no guard to detach: {} is not a cgroup v2 kubepods directory",
            kubepods.display()
        )
    } else {
        let detached = BindGuard::detach(&kubepods).map_err(|e| {
            CliError::new(
                Exit::Failure,
                format!(
                    "detaching the bind guard from {}: {e} (detaching needs root with \
                     CAP_NET_ADMIN and CAP_SYS_ADMIN, in the node's network namespace)",
                    kubepods.display()
                ),
            )
        })?;
        format!(
            "detached {detached} bind guard program{} from {}",
            if detached == 1 { "" } else { "s" },
            kubepods.display()
        )
    };
    let reserved = ReservedPorts::at(&args.reserved_ports_file, &args.state_dir);
    let released = reserved
        .release()
        .map_err(|e| CliError::new(Exit::Failure, e.to_string()))?;
    println!("{guard}");
    println!(
        "took {} port{} the agent had reserved out of {}; entries others put there stay",
        released.len(),
        if released.len() == 1 { "" } else { "s" },
        args.reserved_ports_file.display()
    );
    Ok(())
}

fn driver(flag: DriverFlag) -> Option<CgroupDriver> {
    match flag {
        DriverFlag::Auto => None,
        DriverFlag::Cgroupfs => Some(CgroupDriver::Cgroupfs),
        DriverFlag::Systemd => Some(CgroupDriver::Systemd),
    }
}

/// `--cgroup-driver`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DriverFlag {
    Auto,
    Cgroupfs,
    Systemd,
}

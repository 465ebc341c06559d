//! `kubectl portalloc node-agent`: run on every node (a DaemonSet), keeping every pool's ports
//! reserved in the node's kernel and guarding binds of pools with `spec.guard`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{CliError, Exit, GlobalArgs, Session};
use crate::k8s::node_agent::{NodeAgentOptions, NodeFootprint, remove_from_node, run_node_agent};
use crate::k8s::process::{Readiness, listen_for_signals, signalled};
use crate::k8s::{self, Metrics};
use crate::ledger::node_report::NODE_AGENT_NAMESPACE;
use crate::node::cgroups::CgroupDriver;

/// Keep pools' ports reserved on this node and let only their holders bind them.
///
/// Run in the node's network namespace (hostNetwork), as root with CAP_BPF and CAP_NET_ADMIN,
/// with the node's cgroup v2 hierarchy and a bpffs mounted: docs/node-agent.md. Stops on
/// SIGTERM; the bind guard stays attached (pinned in bpffs), so a restart opens no gap, unless
/// its DaemonSet is gone or being deleted (--pod-name): then it removes what it put on the node.
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
    /// Remove what the agent put on this node, then exit: detach the bind guard's links from
    /// kubelet's kubepods cgroup and remove their pins in --bpf-dir (as a restarted agent
    /// finds them) and take
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
    /// A directory on a bpffs where the bind guard pins its links and maps (a subdirectory per
    /// cgroup root), so they outlive the agent and a restarted or upgraded agent takes them
    /// over with file access alone. Not on a bpffs: binds are not guarded (ports are still
    /// reserved).
    #[arg(
        long,
        default_value = "/sys/fs/bpf/kubectl-portalloc",
        value_name = "DIR"
    )]
    pub bpf_dir: PathBuf,
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
        default_value = NODE_AGENT_NAMESPACE,
        value_name = "NS"
    )]
    pub lease_namespace: String,
    /// The agent's own pod (the downward API's metadata.name), in the --lease-namespace: on
    /// SIGTERM, if the DaemonSet that runs it is gone or being deleted (the chart uninstalled),
    /// the agent removes what it put on the node as --detach does; for a rollout or a pod
    /// deletion everything stays. Unset: everything always stays.
    #[arg(long, env = "POD_NAME", value_name = "NAME")]
    pub pod_name: Option<String>,
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
        bpf_dir: args.bpf_dir,
        reserved_ports_file: args.reserved_ports_file,
        round: args.round,
        guard_lease: args.guard_lease,
        lease_namespace: Some(args.lease_namespace),
        report_every: args.report_every,
        pod_name: args.pod_name.filter(|p| !p.trim().is_empty()),
    };
    let stop = signalled(signals, 1);
    run_node_agent(session.client, options, (readiness, metrics), stop).await?;
    Ok(())
}

/// `--detach`: the guard off `kubepods`, the agent's reserved ports out, others' kept.
fn detach(args: &NodeAgentArgs) -> anyhow::Result<()> {
    let lines = remove_from_node(&NodeFootprint {
        cgroup_root: &args.cgroup_root,
        cgroup_driver: driver(args.cgroup_driver),
        bpf_dir: &args.bpf_dir,
        reserved_ports_file: &args.reserved_ports_file,
        state_dir: &args.state_dir,
    })
    .map_err(|e| CliError::new(Exit::Failure, e))?;
    for line in lines {
        println!("{line}");
    }
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

//! `kubectl portalloc pool create|get|describe|delete`.

mod describe;
mod describe_copies;
mod describe_guard;
mod flags;
mod get;

use clap::{Args, Subcommand};
use kube::Client;

use super::output::{OutputFormat, print_names, print_objects};
use super::{CliError, Exit, GlobalArgs, Session};
use describe::describe;
use flags::{ProtocolFlag, StaticBandParser};
use get::{GetArgs, get};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::{
    FollowNodes, GuardMode, PortPool, PortPoolSpec, PortRangeText, StaticBandSetting,
};
use crate::core::{PoolState, hazards};
use crate::k8s;
use crate::ledger::PoolSnapshot;
use crate::ledger::node_report::NODE_AGENT_NAMESPACE;

#[derive(Args, Debug)]
pub struct PoolArgs {
    #[command(subcommand)]
    pub command: PoolCommand,
}

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    Create(CreateArgs),
    Get(GetArgs),
    Describe(DescribeArgs),
    Delete(DeleteArgs),
}

/// Create a PortPool.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # A TCP pool for hostNetwork servers, kept clear of the NodePort and ephemeral ranges, a few
  # ports excluded
  kubectl portalloc pool create llm --range 21000-22999 --exclude 21500,21600-21610

  # Two ranges, a UDP pool
  kubectl portalloc pool create rdma --range 23000-23999,24500-24599 --protocol UDP

  # Each port held by up to 4 pods at once, never two on one node: 4 x 3,998 ports to hand out
  kubectl portalloc pool create ray --range 25000-28999 --exclude 25000,25001 --node-reuse 4

Node reuse: with --node-reuse N a port may be held by up to N pods, each on another node. Only
kube-scheduler can keep them apart, and only through ports a pod declares: pods that get their
ports through the pod webhook (label portalloc.dev/allocation) have every port declared as a
hostPort for them. A pod that reads its ports from the env ConfigMap or `resolve` must declare
them itself (containers[].ports with hostPort); `resolve` warns when it hands out such a port.

Following the nodes: with --follow-nodes (optionally --node-selector pool=gpu) the pool uses as
many copies as its nodes allow: a copy is used only while the largest pod's ports times the other
holders of each port stay fewer than the nodes counted, so no pod can be kept off every node.
  kubectl portalloc pool create fleet --range 29000-29999 --follow-nodes --node-selector pool=gpu")]
pub struct CreateArgs {
    /// Pool name (cluster-scoped).
    pub name: String,
    /// Port ranges, "A-B" or "A", comma-separated or repeated.
    #[arg(
        long = "range",
        required = true,
        value_delimiter = ',',
        value_name = "A-B"
    )]
    pub ranges: Vec<String>,
    /// Ports or ranges inside the pool never to hand out.
    #[arg(long, value_delimiter = ',', value_name = "A-B")]
    pub exclude: Vec<String>,
    /// The protocol of every port in the pool.
    #[arg(long, value_enum, default_value = "TCP")]
    pub protocol: ProtocolFlag,
    /// Ports at the low end kept for requested ports: Auto, None, or a count.
    #[arg(
        long,
        default_value = "Auto",
        value_name = "Auto|None|COUNT",
        value_parser = StaticBandParser
    )]
    pub static_band: StaticBandSetting,
    /// How many pods may hold one port at once, each on another node (1-256). See below.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..=256))]
    pub node_reuse: Option<i32>,
    /// Let the copies follow the nodes able to run the pool's pods instead of a fixed
    /// --node-reuse: a port gets another holder only while its holders' pods cannot be kept
    /// off every node (the watcher keeps the count). See below.
    #[arg(long)]
    pub follow_nodes: bool,
    /// With --follow-nodes: only nodes with these labels count (key=value, comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "KEY=VALUE",
        requires = "follow_nodes"
    )]
    pub node_selector: Vec<String>,
    /// What the node agent does with a bind of a pool port by a pod that does not hold it:
    /// Disabled, Audit (allow and report) or Enforce (refuse with EPERM and report). Default:
    /// Disabled (`off` is read as Disabled).
    #[arg(long, value_name = "MODE")]
    pub guard: Option<GuardMode>,
    /// Let the pool share ports with other pools of its protocol that allow it too (sets
    /// spec.allowOverlap): for pools whose pods never run on one node. The API server refuses
    /// an overlap with a pool that does not allow it (the portalloc-pool-overlap policy).
    #[arg(long)]
    pub allow_overlap: bool,
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
}

/// Show a pool's ranges, bands, usage, holders and warnings.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  kubectl portalloc pool describe default
  # Node agents installed in another namespace than the chart's portalloc-node-agent
  kubectl portalloc pool describe default --node-agent-namespace node-agents")]
pub struct DescribeArgs {
    pub name: String,
    /// The namespace the node agents run in (the chart's nodeAgent.namespace): their Leases
    /// there are the reports shown; a Lease elsewhere is no agent's.
    #[arg(long, default_value = NODE_AGENT_NAMESPACE, value_name = "NS")]
    pub node_agent_namespace: String,
}

/// Delete a PortPool; refused while any PortAllocation holds ports in it.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  kubectl portalloc pool delete old-pool
  # Delete even though ports are held (the holders keep their records; see `repair`)
  kubectl portalloc pool delete old-pool --force")]
pub struct DeleteArgs {
    pub name: String,
    /// Delete even while ports are held.
    #[arg(long)]
    pub force: bool,
}

pub async fn run(global: &GlobalArgs, args: PoolArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    match args.command {
        PoolCommand::Create(args) => create(&session.client, args).await,
        PoolCommand::Get(args) => get(&session.client, args).await,
        PoolCommand::Describe(args) => describe(&session.client, args).await,
        PoolCommand::Delete(args) => delete(&session.client, args).await,
    }
}

/// `spec.followNodes` from `--follow-nodes` and `--node-selector`.
fn follow_nodes(args: &CreateArgs) -> Result<Option<FollowNodes>, CliError> {
    if !args.follow_nodes {
        return Ok(None);
    }
    let mut labels = std::collections::BTreeMap::new();
    for pair in &args.node_selector {
        let Some((key, value)) = pair.split_once('=').filter(|(k, _)| !k.trim().is_empty()) else {
            return Err(CliError::new(
                Exit::Invalid,
                format!("--node-selector {pair:?}: write key=value, e.g. pool=gpu"),
            ));
        };
        labels.insert(key.trim().to_string(), value.trim().to_string());
    }
    Ok(Some(FollowNodes {
        node_selector: (!labels.is_empty()).then_some(LabelSelector {
            match_labels: Some(labels),
            match_expressions: None,
        }),
    }))
}

async fn create(client: &Client, args: CreateArgs) -> anyhow::Result<()> {
    let spec = PortPoolSpec {
        ranges: args
            .ranges
            .iter()
            .map(|r| PortRangeText(r.trim().to_string()))
            .collect(),
        exclude: args
            .exclude
            .iter()
            .map(|r| PortRangeText(r.trim().to_string()))
            .collect(),
        protocol: args.protocol.into(),
        static_band: args.static_band,
        node_reuse: args.node_reuse.filter(|&n| n > 1),
        follow_nodes: follow_nodes(&args)?,
        guard: args.guard,
        allow_overlap: args.allow_overlap,
    };
    spec.check_copies().map_err(|e| {
        CliError::new(
            Exit::Invalid,
            format!(
                "PortPool {:?}: {e} (--follow-nodes or --node-reuse)",
                args.name
            ),
        )
    })?;
    let pool = PortPool::new(&args.name, spec);
    let (written, applied) = k8s::create_or_keep_pool(client, pool, args.allow_overlap).await?;
    if applied == k8s::Applied::Unchanged {
        // As `kubectl apply` says of an object already as asked: nothing to do, not an error.
        return match args.output {
            Some(format @ (OutputFormat::Json | OutputFormat::Yaml)) => {
                print_objects(&[written], format, true)
            }
            Some(OutputFormat::Name) => print_names("portpool.portalloc.dev", [args.name]),
            _ => {
                println!(
                    "portpool.portalloc.dev/{} unchanged (it already exists with this spec)",
                    args.name
                );
                Ok(())
            }
        };
    }
    let ports = k8s::pool_ports(&written)?;
    let state = PoolState::new(ports.clone(), written.spec.core_static_band());
    for hazard in hazards(&ports) {
        eprintln!("warning: PortPool {:?}: {}", args.name, hazard.message);
    }
    match args.output {
        Some(OutputFormat::Json | OutputFormat::Yaml) => {
            print_objects(&[written], args.output.unwrap(), true)
        }
        Some(OutputFormat::Name) => print_names("portpool.portalloc.dev", [args.name]),
        _ => {
            println!(
                "portpool.portalloc.dev/{} created: {} {} ports ({}), static band {}, {}{}",
                args.name,
                state.size(),
                written.spec.protocol,
                ports,
                state.bands().static_len,
                match PoolSnapshot::of_pool(&written).layout()?.shards().len() {
                    1 => "its holders recorded in 1 PortPoolShard".to_string(),
                    n => format!("its holders recorded in {n} PortPoolShards"),
                },
                match written.spec.reuse() {
                    1 if written.spec.follow_nodes.is_some() => {
                        "; its copies follow the nodes (the watcher counts them)".to_string()
                    }
                    1 => String::new(),
                    n => format!(
                        "; each port held by up to {n} pods, never two on one node ({} in all)",
                        state.size() * u32::from(n)
                    ),
                }
            );
            Ok(())
        }
    }
}

async fn delete(client: &Client, args: DeleteArgs) -> anyhow::Result<()> {
    let deleted = k8s::delete_pool(client, &args.name, args.force).await?;
    println!("portpool.portalloc.dev/{} deleted", args.name);
    if deleted.holders > 0 {
        eprintln!(
            "warning: {} PortAllocations still record ports of this pool; recreating the pool and running \
             `kubectl portalloc repair --apply` restores them",
            deleted.holders
        );
    }
    Ok(())
}

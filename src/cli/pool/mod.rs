//! `kubectl portalloc pool create|get|describe|delete`.

mod describe_copies;
mod describe_guard;
mod flags;
mod get;

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use kube::Client;

use super::output::{OutputFormat, bar, print_names, print_objects};
use super::{CliError, Exit, GlobalArgs, Session};
use describe_copies::copies_text;
use describe_guard::guard_text_of;
use flags::{ProtocolFlag, StaticBandParser};
use get::{GetArgs, get};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::{
    FollowNodes, GuardMode, PortPool, PortPoolSpec, PortRangeText, StaticBandSetting,
};
use crate::core::{Band, PoolState, hazards};
use crate::k8s::{self, get_pool};
use crate::ledger::{Anomaly, PoolSnapshot, WindowRecord};

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
  # Node agents installed in a namespace of their own
  kubectl portalloc pool describe default --node-agent-namespace node-agents")]
pub struct DescribeArgs {
    pub name: String,
    /// The namespace the node agents run in (the chart's release namespace): their Leases
    /// there are the reports shown; a Lease elsewhere is no agent's.
    #[arg(long, default_value = "portalloc-system", value_name = "NS")]
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

pub(super) async fn describe(client: &Client, args: DescribeArgs) -> anyhow::Result<()> {
    let pool = get_pool(client, &args.name).await?;
    let view = k8s::pool_view(client, pool)
        .await?
        .map_err(|e| CliError::new(Exit::Invalid, format!("PortPool {:?}: {e}", args.name)))?;
    let mut warnings = view.warnings.clone();
    warnings.extend(k8s::node_ports::node_port_conflicts(client, &view.record).await);
    warnings.extend(k8s::pool_overlaps_of(client, &args.name).await);
    print!(
        "{}",
        describe_text(&view.record, &view.record_kind(), &warnings)
    );
    if view.reuse > 1 || !view.reused.is_empty() || view.nodes.is_some() {
        print!("{}", copies_text(&view));
    }
    let reports = k8s::node_agent::node_reports(client, &args.node_agent_namespace)
        .await
        .map_err(|e| e.to_string());
    print!(
        "{}",
        guard_text_of(
            &args.name,
            &args.node_agent_namespace,
            &view.record.pool.spec,
            reports.as_deref().map_err(Clone::clone)
        )
    );
    Ok(())
}

/// The `pool describe` page. Pure, so it is tested without a cluster. `kind` says how the
/// record is stored; `extra` are warnings found outside the record (node ports, shards).
pub fn describe_text(record: &WindowRecord, kind: &str, extra: &[String]) -> String {
    let mut out = String::new();
    write_spec(&mut out, record, kind);
    write_usage(&mut out, record);
    write_bands(&mut out, &record.state);
    write_holders(&mut out, record);
    write_warnings(&mut out, record, extra);
    out
}

/// What the pool was asked to hand out, and how its record is stored.
fn write_spec(out: &mut String, record: &WindowRecord, kind: &str) {
    let spec = &record.pool.spec;
    let _ = writeln!(out, "Name:         {}", record.name());
    let _ = writeln!(out, "Protocol:     {}", spec.protocol);
    let _ = writeln!(
        out,
        "Ranges:       {}",
        spec.ranges
            .iter()
            .map(|r| r.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let excluded = if spec.exclude.is_empty() {
        "<none>".to_string()
    } else {
        spec.exclude
            .iter()
            .map(|r| r.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "Exclude:      {excluded}");
    let _ = writeln!(out, "Record:       {kind}");
}

/// How much is held and free, and which blocks still fit.
fn write_usage(out: &mut String, record: &WindowRecord) {
    let state = &record.state;
    let _ = writeln!(out, "Size:         {} ports", state.size());
    let _ = writeln!(
        out,
        "Allocated:    {} {}",
        state.held_count(),
        bar(state.held_count(), state.size(), 30)
    );
    let _ = writeln!(out, "Free:         {}", state.free_count());
    let frag = state.fragmentation();
    let fits: Vec<String> = record
        .block_sizes_to_report()
        .into_iter()
        .map(|size| format!("{} of {size}", frag.fits(size)))
        .collect();
    let _ = writeln!(
        out,
        "Free runs:    {} (largest {} ports); blocks that fit: {}",
        frag.runs(),
        frag.largest(),
        fits.join(", ")
    );
    // How full the pool can get before the largest block its holders use is refused: the
    // figure to size a pool by (packed placement keeps it near 100 %).
    let largest_block = record
        .holders
        .values()
        .flat_map(|h| h.holdings.iter().map(|(_, block)| u32::from(block.count)))
        .filter(|&n| n > 1)
        .max();
    if let Some(size) = largest_block {
        let _ = writeln!(
            out,
            "Refuses:      a block of {size} at {:.1} % full, if only such blocks came from now on",
            state.occupancy_at_refusal(size) * 100.0
        );
    }
}

/// The static and dynamic bands (KEP-3668): their bounds and how much of each is used.
fn write_bands(out: &mut String, state: &PoolState) {
    let _ = writeln!(out, "Bands:");
    let bands = state.bands();
    for (band, label) in [(Band::Static, "static "), (Band::Dynamic, "dynamic")] {
        let indices = bands.indices(band);
        let usage = state.usage(band);
        let bounds = match (
            state.ports().nth(indices.start),
            indices
                .end
                .checked_sub(1)
                .and_then(|i| state.ports().nth(i)),
        ) {
            (Some(first), Some(last)) if !indices.is_empty() => format!("{first}-{last}"),
            _ => "<empty>".to_string(),
        };
        let _ = writeln!(
            out,
            "  {label}  {bounds:<13} {:>5}/{:<5} used {}",
            usage.used,
            usage.size,
            bar(usage.used, usage.size, 20)
        );
    }
}

/// Every holder with its ports; unreadable entries count as holders too.
fn write_holders(out: &mut String, record: &WindowRecord) {
    let _ = writeln!(
        out,
        "Holders:      {}",
        record.holders.len() + record.opaque.len()
    );
    for (uid, holder) in &record.holders {
        let _ = writeln!(
            out,
            "  {}  ({} ports, uid {uid})",
            holder.owner,
            holder.holdings.port_count()
        );
        let _ = writeln!(out, "    {}", holder.holdings.encode());
    }
}

/// The pool's range hazards, the warnings found outside the record, then what repair fixes.
fn write_warnings(out: &mut String, record: &WindowRecord, extra: &[String]) {
    let mut warnings: Vec<String> = hazards(&record.ports)
        .into_iter()
        .map(|h| h.message)
        .collect();
    warnings.extend(extra.iter().cloned());
    for anomaly in &record.anomalies {
        warnings.push(match anomaly {
            Anomaly::Undecodable { owner, error, .. } => format!("holder {owner} has an unreadable entry ({error}): run `kubectl portalloc repair`"),
            Anomaly::OutsidePool { owner, slot, port, .. } => format!("{owner} holds port {port} ({slot}), which is outside the pool or excluded: run `kubectl portalloc repair`"),
            Anomaly::Duplicate { port, first, second } => format!("port {port} is held by both {first} and {second}: run `kubectl portalloc repair`"),
        });
    }
    if warnings.is_empty() {
        let _ = writeln!(out, "Warnings:     <none>");
    } else {
        let _ = writeln!(out, "Warnings:");
        for warning in warnings {
            let _ = writeln!(out, "  - {warning}");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PoolHolder, PortPoolSpec, StaticBandSetting};

    #[test]
    fn describe_shows_blocks_and_free_runs() {
        let pool = PortPool::new(
            "gpu",
            PortPoolSpec {
                ranges: vec!["20000-20099".into()],
                exclude: vec!["20050".into()],
                protocol: Default::default(),
                static_band: StaticBandSetting::None,
                node_reuse: None,
                follow_nodes: None,
                guard: None,
                allow_overlap: false,
            },
        );
        let holders = vec![PoolHolder {
            uid: "u1".into(),
            owner: "ml/ray".into(),
            ports: "ray.head=20099 ray.workers=20000-20007,20008-20015".into(),
        }];
        let copy = PoolSnapshot::of_pool(&pool);
        let ports = copy.ports().unwrap();
        let static_band = copy.spec.core_static_band();
        let record = WindowRecord::joined(copy, ports, static_band, holders);
        let text = describe_text(&record, "1 shard", &[]);
        assert!(
            text.contains("  ml/ray  (17 ports, uid u1)\n    ray.head=20099 ray.workers=20000-20007,20008-20015\n"),
            "{text}"
        );
        // Free: 20016-20049 (34) and 20051-20098 (48).
        assert!(
            text.contains(
                "Free runs:    2 (largest 48 ports); blocks that fit: 10 of 8, 5 of 16, 2 of 32\n"
            ),
            "{text}"
        );
        // 17 held; the runs of 34 and 48 take 4 and 6 more blocks of 8: 97 of 99 ports.
        assert!(
            text.contains(
                "Refuses:      a block of 8 at 98.0 % full, if only such blocks came from now on\n"
            ),
            "{text}"
        );
    }
}

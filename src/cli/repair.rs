//! `kubectl portalloc repair [--pool P] [--apply]`: make pools match the live PortAllocations.

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::report::print_report;
use super::{CliError, Exit, GlobalArgs, Session};
use crate::k8s::{FollowUp, PoolRepair, Repairer};
use crate::ledger::RepairPlan;

/// Free ports whose PortAllocation is gone and restore holdings a recreated pool lost.
///
/// For each pool: list its shards (the record of its ports, one per window), then its
/// PortAllocations, and compute what differs, shard by shard with the parts of statuses in each
/// shard's window. Entries whose PortAllocation no longer exists (by UID) are freed. Holdings a
/// live PortAllocation's status records against an earlier pool of the same name (the pool was
/// deleted and created again) are restored where the port is still in the pool, still asked for
/// and free. A shard that is missing where statuses record ports is recreated with those
/// holdings; shards of an earlier pool of the same name are removed. A shard that still names a
/// PortAllocation as placed in other shards (`status.elsewhere`, left by an interrupted `sync
/// --all` or watcher) stops naming it once it is gone or its status names its shards. Ports held
/// twice, ports outside the pool, ports listed in the wrong shard or in two shards and stale
/// statuses are reported, never moved.
///
/// Without --apply nothing is written and the exit code is 10 when there is anything to report.
/// With --apply each changed shard is written with a compare-and-swap on the version listed (a
/// missing one is created), so a concurrent allocation is never lost: if a shard changed
/// meanwhile, repair lists the shards again.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # Show what repair would change in every pool (exit code 10 if anything)
  kubectl portalloc repair

  # Make the changes in one pool
  kubectl portalloc repair --pool default --apply

  # A pool deleted while ports were held, then created again: every holding comes back
  kubectl portalloc pool delete default --force
  kubectl portalloc pool create default --range 20000-20999
  kubectl portalloc repair --pool default --apply")]
pub struct RepairArgs {
    /// Only this pool (default: every pool).
    #[arg(long, value_name = "NAME")]
    pub pool: Option<String>,
    /// Write the changes (default: only show them).
    #[arg(long)]
    pub apply: bool,
    /// Print the diff as json or yaml instead of lines.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<RepairOutput>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RepairOutput {
    Json,
    Yaml,
}

/// One pool in `-o json|yaml`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PoolOutput<'a> {
    #[serde(flatten)]
    plan: &'a RepairPlan,
    applied: bool,
    attempts: u32,
    conflicts: u32,
    synced: Vec<String>,
}

pub async fn run(global: &GlobalArgs, args: RepairArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let repairer = Repairer::new(session.client.clone(), session.allocator.clone());
    let mut results = Vec::new();
    let mut follow_up_failures = 0;
    let pool_count = repairer
        .repair(args.pool.as_deref(), args.apply, |repair| {
            if args.output.is_none() {
                print_pool(&repair, session.verbosity);
            }
            follow_up_failures += repair
                .follow_ups
                .iter()
                .filter(|f| matches!(f, FollowUp::Failed { .. }))
                .count();
            results.push(repair);
        })
        .await?;
    if pool_count == 0 && args.output.is_none() {
        eprintln!("No PortPools found.");
    }
    if let Some(format) = args.output {
        let out: Vec<PoolOutput> = results
            .iter()
            .map(|r| PoolOutput {
                plan: &r.plan,
                applied: r.applied,
                attempts: r.attempts,
                conflicts: r.conflicts,
                synced: r
                    .follow_ups
                    .iter()
                    .filter_map(|f| match f {
                        FollowUp::Synced(report) => {
                            Some(format!("{}/{}", report.namespace, report.name))
                        }
                        _ => None,
                    })
                    .collect(),
            })
            .collect();
        match format {
            RepairOutput::Json => println!("{}", serde_json::to_string_pretty(&out)?),
            RepairOutput::Yaml => print!("{}", serde_yaml::to_string(&out)?),
        }
    }
    if follow_up_failures > 0 {
        return Err(CliError::new(
            Exit::Unavailable,
            format!(
                "the pool was repaired, but {follow_up_failures} restored PortAllocations could not be synced \
                 (see above): run `kubectl portalloc sync --all -A`"
            ),
        )
        .into());
    }
    let pending: Vec<&RepairPlan> = results
        .iter()
        .map(|r| &r.plan)
        .filter(|p| !p.is_clean())
        .collect();
    if !args.apply && !pending.is_empty() {
        let changes: usize = pending.iter().map(|p| p.changes.len()).sum();
        let findings: usize = pending.iter().map(|p| p.findings.len()).sum();
        return Err(CliError::new(
            Exit::Differences,
            format!(
                "differences found in {} of {} pools ({changes} changes, {findings} findings); nothing was \
                 written{}",
                pending.len(),
                pool_count,
                if changes > 0 {
                    ": run again with --apply to make the changes"
                } else {
                    ""
                }
            ),
        )
        .into());
    }
    Ok(())
}

fn print_pool(repair: &PoolRepair, verbosity: u8) {
    let plan = &repair.plan;
    let pool = format!("pool/{}", plan.pool);
    if plan.is_clean() {
        println!(
            "{pool}: consistent ({} holders, {} ports held)",
            plan.holders, plan.held_ports
        );
        return;
    }
    for change in &plan.changes {
        println!("{:<8} {pool}  {change}", change.verb());
    }
    for finding in &plan.findings {
        println!("{:<8} {pool}  {finding}", finding.verb());
    }
    let what = format!(
        "{} changes, {} findings",
        plan.changes.len(),
        plan.findings.len()
    );
    if repair.applied {
        let retries = if repair.attempts > 1 {
            format!(
                " after {} attempts ({} conflicts)",
                repair.attempts, repair.conflicts
            )
        } else {
            String::new()
        };
        println!(
            "{pool}: applied {what}{retries}; now {} holders, {} ports held",
            plan.holders, plan.held_ports
        );
    } else if plan.changes.is_empty() {
        println!("{pool}: {what}; nothing for repair to change");
    } else {
        println!("{pool}: {what} (dry run: nothing written; --apply makes the changes)");
    }
    for follow_up in &repair.follow_ups {
        match follow_up {
            FollowUp::Synced(report) => print_report(report, verbosity),
            FollowUp::Gone { owner, freed } => println!(
                "{owner} was deleted during repair: its {freed} restored ports were freed again"
            ),
            FollowUp::Failed { owner, error } => eprintln!("error: sync of {owner}: {error}"),
        }
    }
}

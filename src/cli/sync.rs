//! `kubectl portalloc sync`: allocate or release so every status matches its spec. This is the
//! GitOps path: Argo CD or Flux applies the CRs, and sync gives them their ports.

use clap::Args;
use kube::ResourceExt;

use super::output::{OutputFormat, print_names, print_objects};
use super::report::print_report;
use super::{CliError, Exit, GlobalArgs, Session, exit_for, render_error};
use crate::k8s::{get_allocation, list_allocations};

/// Allocate or release ports so each PortAllocation's status matches its spec.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # One PortAllocation
  kubectl portalloc sync sglang-pd -n llm

  # Every PortAllocation in every namespace, e.g. after `kubectl apply` or an Argo CD sync
  kubectl portalloc sync --all -A")]
pub struct SyncArgs {
    /// The PortAllocation to sync.
    #[arg(conflicts_with = "all")]
    pub name: Option<String>,
    /// Sync every PortAllocation in the namespace (or in all of them with -A).
    #[arg(long)]
    pub all: bool,
    /// With --all: in every namespace.
    #[arg(short = 'A', long, requires = "all")]
    pub all_namespaces: bool,
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
}

pub async fn run(global: &GlobalArgs, args: SyncArgs) -> anyhow::Result<()> {
    if args.name.is_none() && !args.all {
        return Err(CliError::new(
            Exit::Usage,
            "name a PortAllocation, or pass --all (with -A for every namespace)",
        )
        .into());
    }
    let session = Session::connect(global).await?;
    let targets = match &args.name {
        Some(name) => vec![get_allocation(&session.client, &session.namespace, name).await?],
        None => {
            let namespace = (!args.all_namespaces).then_some(session.namespace.as_str());
            list_allocations(&session.client, namespace).await?
        }
    };
    let total = targets.len();
    let mut failures = Vec::new();
    let mut synced = Vec::new();
    for pa in targets {
        match session.allocator.sync_or_record(pa, None).await {
            Ok(report) => {
                if args.output.is_none() {
                    print_report(&report, session.verbosity);
                }
                synced.push(report.allocation);
            }
            Err(e) => {
                let e = anyhow::Error::from(e);
                if total > 1 {
                    eprintln!("error: {}", render_error(&e));
                }
                failures.push(e);
            }
        }
    }
    match args.output {
        Some(format @ (OutputFormat::Json | OutputFormat::Yaml)) => {
            print_objects(&synced, format, args.name.is_some())?
        }
        Some(OutputFormat::Name) => print_names(
            "portallocation.portalloc.dev",
            synced.iter().map(|pa| pa.name_any()),
        )?,
        _ => {}
    }
    if total == 0 {
        eprintln!("No PortAllocations found.");
    }
    match failures.len() {
        0 => Ok(()),
        1 if total == 1 => Err(failures.remove(0)),
        n => {
            let exit = exit_for(&failures[0]);
            Err(CliError::new(
                exit,
                format!("{n} of {total} PortAllocations could not be synced (see above)"),
            )
            .into())
        }
    }
}

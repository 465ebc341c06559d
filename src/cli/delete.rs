//! `kubectl portalloc delete NAME... | -l SELECTOR | -f FILE`: remove PortAllocations (and
//! the PortPools a manifest names), then free their ports.

use clap::Args;
use kube::ResourceExt;

use super::dry_run::DryRunArg;
use super::manifest::{Manifest, read_manifest_paths};
use super::output::OutputFormat;
use super::{CliError, Exit, GlobalArgs, Session, exit_for, render_error};
use crate::api::PortAllocation;
use crate::k8s::{self, ApiErrorKind, DeleteError, PoolError};

/// Delete PortAllocations and give their ports back (with -f, a file's PortPools too).
///
/// Each object goes first, then its pool entry. If this is interrupted in between, the entry
/// belongs to a UID that no longer exists, which `kubectl portalloc repair` frees; the
/// reverse order could free ports of an object that is still in use. With several objects, each
/// is deleted in turn, the others still when one fails; the command then fails.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  kubectl portalloc delete sglang-pd -n llm

  # Several at once (those already gone skipped), or all with a label
  kubectl portalloc delete sglang-pd vllm-ray -n llm --ignore-not-found
  kubectl portalloc delete -l team=a -n llm

  # What a manifest created: its PortAllocations, then its PortPools (refused while held)
  kubectl portalloc delete -f sglang-pd.yaml -n llm --ignore-not-found

  # Which ports it would free, with nothing deleted
  kubectl portalloc delete sglang-pd -n llm --dry-run=server")]
pub struct DeleteArgs {
    /// PortAllocations to delete, in the namespace of -n.
    #[arg(required_unless_present_any = ["selector", "files"])]
    pub names: Vec<String>,
    /// Delete the PortAllocations whose labels match this selector (e.g. team=a), as kubectl's -l.
    #[arg(short = 'l', long, value_name = "SELECTOR", conflicts_with_all = ["names", "files"])]
    pub selector: Option<String>,
    /// Delete the PortAllocations and PortPools a manifest names (a file, a directory, or -).
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE",
        conflicts_with = "names"
    )]
    pub files: Vec<String>,
    /// Also read the subdirectories of the directories given with -f.
    #[arg(short = 'R', long, requires = "files")]
    pub recursive: bool,
    /// Succeed, saying nothing, for objects that do not exist.
    #[arg(long)]
    pub ignore_not_found: bool,
    /// `name` prints only `kind/name` of each deleted object.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<DeleteOutput>,
    #[command(flatten)]
    pub dry_run: DryRunArg,
}

/// `-o name` is the one output format of a delete, as kubectl's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeleteOutput {
    Name,
}

/// What to delete: PortAllocations (namespace, name), then PortPools.
struct Targets {
    allocations: Vec<(String, String)>,
    pools: Vec<String>,
}

pub async fn run(global: &GlobalArgs, args: DeleteArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let targets = targets(&session, global, &args).await?;
    if let Some(mode) = args.dry_run.mode() {
        return dry_run(&session, &args, targets, mode).await;
    }
    let total = targets.allocations.len() + targets.pools.len();
    if total == 0 {
        eprintln!(
            "No PortAllocations found in namespace {}.",
            session.namespace
        );
        return Ok(());
    }
    let names_only = args.output == Some(DeleteOutput::Name);
    let mut failures: Vec<anyhow::Error> = Vec::new();
    for (namespace, name) in &targets.allocations {
        let result =
            k8s::delete_allocation(&session.allocator, &session.client, namespace, name).await;
        match result {
            Ok(_) if names_only => println!("portallocation.portalloc.dev/{name}"),
            Ok(deleted) => println!(
                "portallocation.portalloc.dev/{name} deleted ({} ports released in pool {})",
                deleted.freed, deleted.pool
            ),
            Err(DeleteError::Kube(e))
                if args.ignore_not_found && e.kind() == ApiErrorKind::NotFound => {}
            Err(e) => failures.push(e.into()),
        }
    }
    for name in &targets.pools {
        match k8s::delete_pool(&session.client, name, false).await {
            Ok(_) if names_only => println!("portpool.portalloc.dev/{name}"),
            Ok(_) => println!("portpool.portalloc.dev/{name} deleted"),
            Err(PoolError::Kube(e))
                if args.ignore_not_found && e.kind() == ApiErrorKind::NotFound => {}
            Err(e) => failures.push(e.into()),
        }
    }
    match failures.len() {
        0 => Ok(()),
        1 => Err(failures.remove(0)),
        n => {
            for e in &failures {
                eprintln!("error: {}", render_error(e));
            }
            Err(CliError::new(
                exit_for(&failures[0]),
                format!("{n} of {total} objects could not be deleted (see above)"),
            )
            .into())
        }
    }
}

/// The objects the command line names: its names, the matches of its selector, or the
/// documents of its files (PortAllocations in their own namespace, else in -n's).
async fn targets(
    session: &Session,
    global: &GlobalArgs,
    args: &DeleteArgs,
) -> anyhow::Result<Targets> {
    let ns = session.namespace.clone();
    if let Some(selector) = &args.selector {
        let matched =
            k8s::list_allocations_matching(&session.client, Some(&ns), Some(selector)).await?;
        return Ok(Targets {
            allocations: matched
                .iter()
                .map(|pa| (ns.clone(), pa.name_any()))
                .collect(),
            pools: Vec::new(),
        });
    }
    if args.files.is_empty() {
        return Ok(Targets {
            allocations: args.names.iter().map(|n| (ns.clone(), n.clone())).collect(),
            pools: Vec::new(),
        });
    }
    let mut targets = Targets {
        allocations: Vec::new(),
        pools: Vec::new(),
    };
    for manifest in read_manifest_paths(&args.files, args.recursive)? {
        match manifest {
            Manifest::Pool(pool) => targets.pools.push(pool.name_any()),
            Manifest::Allocation(pa) => {
                let in_doc = pa.namespace();
                if let (Some(doc), Some(flag)) = (in_doc.as_deref(), global.namespace.as_deref())
                    && doc != flag
                {
                    return Err(CliError::new(
                        Exit::Invalid,
                        format!(
                            "PortAllocation {:?} is in namespace {doc:?} but -n says {flag:?}: drop -n or make them agree",
                            pa.name_any()
                        ),
                    )
                    .into());
                }
                targets
                    .allocations
                    .push((in_doc.unwrap_or_else(|| ns.clone()), pa.name_any()));
            }
        }
    }
    Ok(targets)
}

/// `--dry-run`: each PortAllocation's ports that would be freed; the pools are only named.
async fn dry_run(
    session: &Session,
    args: &DeleteArgs,
    targets: Targets,
    mode: k8s::DryRun,
) -> anyhow::Result<()> {
    let mut items: Vec<(PortAllocation, k8s::Intent)> = Vec::new();
    for (namespace, name) in &targets.allocations {
        match k8s::get_allocation(&session.client, namespace, name).await {
            Ok(pa) => items.push((pa, k8s::Intent::Delete)),
            Err(e) if args.ignore_not_found && e.kind() == ApiErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    for name in &targets.pools {
        match k8s::get_pool(&session.client, name).await {
            Ok(_) => eprintln!("portpool.portalloc.dev/{name} deleted (dry run)"),
            Err(e) if args.ignore_not_found && e.kind() == ApiErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    if items.is_empty() {
        return Ok(());
    }
    let output = args.output.map(|_| OutputFormat::Name);
    super::dry_run::run(session, items, mode, output, &[]).await
}

//! `kubectl portalloc create -f FILE|DIR|-`: check everything, create or update, then allocate.

use std::collections::BTreeSet;

use clap::Args;
use kube::ResourceExt;

use super::dry_run::DryRunArg;
use super::manifest::{Manifest, read_manifest_paths};
use super::output::{OutputFormat, print_names, print_objects};
use super::report::{print_report_to, take_configmap_error};
use super::{CliError, Exit, GlobalArgs, Session, exit_for, render_error};
use crate::api::PortAllocation;
use crate::k8s::{self, Applied, PoolError, PoolPlan};
use crate::ledger::owner_of;

/// Create or update PortAllocations (and PortPools) from YAML, then allocate their ports.
///
/// Every document is checked before anything is written. A new PortAllocation whose ports
/// cannot be allocated is not created at all; an existing one keeps its ports when re-applied.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # Allocate the ports a file describes
  kubectl portalloc create -f sglang-pd.yaml

  # Every *.yaml, *.yml and *.json file of a directory (-R: and of its subdirectories)
  kubectl portalloc create -f manifests/ -R

  # From standard input
  cat sglang-pd.yaml | kubectl portalloc create -f -

  # Re-running is idempotent: every pod keeps its port
  kubectl portalloc create -f sglang-pd.yaml -o yaml

  # Change a PortPool that exists with another spec (refused while a holder's ports would leave it)
  kubectl portalloc create -f pool.yaml --force

  # Which ports it would take, with nothing written (server: the API server checks the writes)
  kubectl portalloc create -f sglang-pd.yaml --dry-run=server")]
pub struct CreateArgs {
    /// A YAML or JSON file of PortAllocations and PortPools, a directory of them, or - for
    /// standard input; repeatable.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<String>,
    /// Also read the subdirectories of the directories given with -f.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Change a PortPool of the file that exists with another spec. Without it such a pool is
    /// refused (what differs is shown) and nothing is written.
    #[arg(long)]
    pub force: bool,
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
    #[command(flatten)]
    pub dry_run: DryRunArg,
}

pub async fn run(global: &GlobalArgs, args: CreateArgs) -> anyhow::Result<()> {
    let manifests = read_manifest_paths(&args.files, args.recursive)?;
    let session = Session::connect(global).await?;
    let mut pools = Vec::new();
    let mut allocations = Vec::new();
    for manifest in manifests {
        match manifest {
            Manifest::Pool(pool) => {
                pool.spec.port_set().map_err(|e| {
                    CliError::new(
                        Exit::Invalid,
                        format!("PortPool {:?}: {e}", pool.name_any()),
                    )
                })?;
                pools.push(pool);
            }
            Manifest::Allocation(mut pa) => {
                let namespace = resolve_namespace(&pa, global, &session)?;
                pa.metadata.namespace = Some(namespace);
                pa.spec.validate().map_err(|e| {
                    CliError::new(
                        Exit::Invalid,
                        format!("PortAllocation {}: {e}", owner_of(&pa)),
                    )
                })?;
                allocations.push(pa);
            }
        }
    }
    check_before_writing(&session, &pools, &allocations, args.force).await?;
    if let Some(mode) = args.dry_run.mode() {
        return dry_run(&session, pools, allocations, mode, args.output).await;
    }
    let mut written: Vec<String> = Vec::new();
    let stopped = |written: &[String], e: anyhow::Error| match written {
        [] => e,
        _ => e.context(format!(
            "create -f stopped part way; written before this failed: {}",
            written.join(", ")
        )),
    };
    for pool in pools {
        let name = pool.name_any();
        let applied = k8s::apply_pool(&session.client, pool)
            .await
            .map_err(|e| stopped(&written, e.into()))?;
        let verb = applied_verb(applied);
        print_line(args.output, "portpool.portalloc.dev", &name, verb);
        if applied != Applied::Unchanged {
            written.push(format!("portpool.portalloc.dev/{name} ({verb})"));
        }
    }
    let mut results = Vec::new();
    // ConfigMaps that could not follow their allocation: the ports are held, the others go on,
    // and the command fails at the end.
    let mut configmap_errors = Vec::new();
    for pa in allocations {
        let name = pa.name_any();
        let mut report = k8s::apply_allocation(&session.allocator, &session.client, pa)
            .await
            .map_err(|e| stopped(&written, e.into()))?;
        configmap_errors.extend(take_configmap_error(&mut report).map(anyhow::Error::from));
        // With -o, stdout is for the objects or names alone.
        print_report_to(&report, session.verbosity, args.output.is_some());
        written.push(format!("portallocation.portalloc.dev/{name}"));
        results.push(report.allocation);
    }
    match args.output {
        Some(format @ (OutputFormat::Json | OutputFormat::Yaml)) => {
            print_objects(&results, format, results.len() == 1)?
        }
        Some(OutputFormat::Name) => print_names(
            "portallocation.portalloc.dev",
            results.iter().map(|pa| pa.name_any()),
        )?,
        _ => {}
    }
    match configmap_errors.len() {
        0 => Ok(()),
        1 => Err(configmap_errors.remove(0)),
        n => {
            for e in &configmap_errors {
                eprintln!("error: {}", render_error(e));
            }
            Err(CliError::new(
                exit_for(&configmap_errors[0]),
                format!("{n} ConfigMaps could not be written (see above); the ports are held"),
            )
            .into())
        }
    }
}

/// `kind/name verb`: on stdout as kubectl prints it; with `-o name` only `kind/name` there;
/// with `-o json|yaml` on stderr, stdout being the objects'.
fn print_line(output: Option<OutputFormat>, kind: &str, name: &str, verb: &str) {
    match output {
        None | Some(OutputFormat::Table | OutputFormat::Wide) => println!("{kind}/{name} {verb}"),
        Some(OutputFormat::Name) => println!("{kind}/{name}"),
        Some(_) => eprintln!("{kind}/{name} {verb}"),
    }
}

/// Everything that can be checked before the first write: each PortPool of the file against
/// the one that exists (a changed spec only with `force`, never one that strands a holder),
/// and, when the file holds more than one object (so that a failure could leave part of it
/// written), every namespace its PortAllocations are in and every pool they name that the
/// file does not bring. A single PortAllocation fails whole on its own, without these reads.
async fn check_before_writing(
    session: &Session,
    pools: &[crate::api::PortPool],
    allocations: &[PortAllocation],
    force: bool,
) -> anyhow::Result<()> {
    let mut changed_pools = BTreeSet::new();
    for pool in pools {
        if let PoolPlan::Change { differences } = k8s::plan_pool(&session.client, pool).await? {
            changed_pools.insert(pool.name_any());
            if !force {
                return Err(PoolError::AlreadyExists {
                    pool: pool.name_any(),
                    differences,
                }
                .into());
            }
            // What --force changes, said before it is done.
            eprintln!(
                "PortPool {:?} changes: {}",
                pool.name_any(),
                differences.join("; ")
            );
        }
    }
    if pools.len() + allocations.len() < 2 {
        return Ok(());
    }
    let namespaces: BTreeSet<String> = allocations.iter().filter_map(|pa| pa.namespace()).collect();
    if let Some(ns) = k8s::missing_namespaces(&session.client, &namespaces)
        .await?
        .first()
    {
        let named: Vec<String> = allocations
            .iter()
            .filter(|pa| pa.namespace().as_deref() == Some(ns))
            .map(|pa| format!("{:?}", pa.name_any()))
            .collect();
        return Err(CliError::new(
            Exit::NotFound,
            format!(
                "namespace {ns:?} does not exist (PortAllocation {} of the file is in it); nothing \
                 was written: create it first (`kubectl create namespace {ns}`) or pass -n",
                named.join(", ")
            ),
        )
        .into());
    }
    let in_file: BTreeSet<String> = pools.iter().map(|p| p.name_any()).collect();
    let named: BTreeSet<String> = allocations
        .iter()
        .map(|pa| pa.spec.pool.clone())
        .filter(|pool| !in_file.contains(pool))
        .collect();
    if let Some(pool) = k8s::missing_pools(&session.client, &named).await?.first() {
        let users: Vec<String> = allocations
            .iter()
            .filter(|pa| &pa.spec.pool == pool)
            .map(owner_of)
            .collect();
        return Err(CliError::new(
            Exit::NotFound,
            format!(
                "PortPool {pool:?}, named by PortAllocation {}, neither exists nor is in the file; \
                 nothing was written: create it first (`kubectl portalloc pool create {pool} \
                 --range A-B`) or add it to the file",
                users.join(", ")
            ),
        )
        .into());
    }
    check_fit(session, pools, allocations, &changed_pools).await
}

/// Whether every PortAllocation of the file fits, decided together against one copy of each
/// pool (as the writes would, in order), with nothing sent. Those of a pool the file changes
/// are decided when written: the copy would have the old spec.
async fn check_fit(
    session: &Session,
    pools: &[crate::api::PortPool],
    allocations: &[PortAllocation],
    changed_pools: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let items: Vec<(PortAllocation, k8s::Intent)> = allocations
        .iter()
        .filter(|pa| !changed_pools.contains(&pa.spec.pool))
        .map(|pa| (pa.clone(), k8s::Intent::Apply))
        .collect();
    if items.is_empty() {
        return Ok(());
    }
    let previews = k8s::preview(&session.client, items, k8s::DryRun::Client, pools).await?;
    let Some(refusal) = previews.iter().find_map(|p| p.refusal.as_ref()) else {
        return Ok(());
    };
    let exit = exit_for(&anyhow::Error::from(k8s::AllocateError::Refused(
        refusal.clone(),
    )));
    Err(CliError::new(exit, format!("{refusal}; nothing of the file was written")).into())
}

/// `create --dry-run`: what applying the pools would do, then each PortAllocation's preview.
async fn dry_run(
    session: &Session,
    pools: Vec<crate::api::PortPool>,
    allocations: Vec<PortAllocation>,
    mode: k8s::DryRun,
    output: Option<OutputFormat>,
) -> anyhow::Result<()> {
    let suffix = match mode {
        k8s::DryRun::Client => "(dry run)",
        k8s::DryRun::Server => "(server dry run)",
    };
    for pool in &pools {
        let verb = applied_verb(k8s::preview_pool(&session.client, pool, mode).await?);
        print_line(
            output,
            "portpool.portalloc.dev",
            &pool.name_any(),
            &format!("{verb} {suffix}"),
        );
    }
    let items = allocations
        .into_iter()
        .map(|pa| (pa, k8s::Intent::Apply))
        .collect();
    super::dry_run::run(session, items, mode, output, &pools).await
}

fn applied_verb(applied: Applied) -> &'static str {
    match applied {
        Applied::Created => "created",
        Applied::Unchanged => "unchanged",
        Applied::Configured => "configured",
    }
}

/// The document's namespace, else `-n`, else the context's; a document that names another
/// namespace than an explicit `-n` is refused, as kubectl does.
fn resolve_namespace(
    pa: &PortAllocation,
    global: &GlobalArgs,
    session: &Session,
) -> Result<String, CliError> {
    match (
        pa.metadata.namespace.as_deref(),
        global.namespace.as_deref(),
    ) {
        (Some(doc), Some(flag)) if doc != flag => Err(CliError::new(
            Exit::Invalid,
            format!(
                "PortAllocation {:?} is in namespace {doc:?} but -n says {flag:?}: drop -n or make them agree",
                pa.name_any()
            ),
        )),
        (Some(doc), _) => Ok(doc.to_string()),
        (None, _) => Ok(session.namespace.clone()),
    }
}

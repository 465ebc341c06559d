//! `kubectl portalloc create -f FILE|-`: create or update, then allocate.

use clap::Args;
use kube::ResourceExt;

use super::dry_run::DryRunArg;
use super::manifest::{Manifest, read_manifests};
use super::output::{OutputFormat, print_names, print_objects};
use super::report::{print_report, take_configmap_error};
use super::{CliError, Exit, GlobalArgs, Session, exit_for, render_error};
use crate::api::PortAllocation;
use crate::k8s::{self, Applied};
use crate::ledger::owner_of;

/// Create or update PortAllocations (and PortPools) from YAML, then allocate their ports.
///
/// Every document is checked before anything is written. A new PortAllocation whose ports
/// cannot be allocated is not created at all; an existing one keeps its ports when re-applied.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # Allocate the ports a file describes
  kubectl portalloc create -f sglang-pd.yaml

  # From standard input
  cat sglang-pd.yaml | kubectl portalloc create -f -

  # Re-running is idempotent: every pod keeps its port
  kubectl portalloc create -f sglang-pd.yaml -o yaml

  # Which ports it would take, with nothing written (server: the API server checks the writes)
  kubectl portalloc create -f sglang-pd.yaml --dry-run=server")]
pub struct CreateArgs {
    /// A YAML file of PortAllocations and PortPools, or - for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: String,
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
    #[command(flatten)]
    pub dry_run: DryRunArg,
}

pub async fn run(global: &GlobalArgs, args: CreateArgs) -> anyhow::Result<()> {
    let manifests = read_manifests(&args.file)?;
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
    if let Some(mode) = args.dry_run.mode() {
        return dry_run(&session, pools, allocations, mode, args.output).await;
    }
    for pool in pools {
        let name = pool.name_any();
        let verb = applied_verb(k8s::apply_pool(&session.client, pool).await?);
        println!("portpool.portalloc.dev/{name} {verb}");
    }
    let mut results = Vec::new();
    // ConfigMaps that could not follow their allocation: the ports are held, the others go on,
    // and the command fails at the end.
    let mut configmap_errors = Vec::new();
    for pa in allocations {
        let mut report = k8s::apply_allocation(&session.allocator, &session.client, pa).await?;
        configmap_errors.extend(take_configmap_error(&mut report).map(anyhow::Error::from));
        if args.output.is_none() {
            print_report(&report, session.verbosity);
        }
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
        println!("portpool.portalloc.dev/{} {verb} {suffix}", pool.name_any());
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

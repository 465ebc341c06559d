//! The command line: argument parsing and one file per verb. Each verb parses, calls the library
//! ([`crate::k8s`] for anything that talks to the API server, [`crate::ledger`] and
//! [`crate::core`] for pure decisions) and renders. No API writes happen here.

mod completion;
mod create;
mod delete;
mod describe;
mod diff;
mod dry_run;
mod duration;
mod exit;
mod get;
mod global;
mod import;
mod install;
mod logging;
mod manifest;
mod node_agent;
mod output;
mod pool;
mod release;
mod repair;
mod report;
mod resolve;
mod session;
mod sync;
mod version;
mod webhook;

use clap::{Parser, Subcommand};

pub use completion::{KUBECTL_COMPLETE_NAME, complete};
pub use exit::{CliError, Exit, exit_for, render_error};
pub use global::GlobalArgs;
pub use logging::init_logging;
use session::Session;

const EXAMPLES: &str = "\
Examples:
  # Install the CRDs, then make a first pool (clear of the NodePort and ephemeral ranges)
  kubectl portalloc install
  kubectl portalloc pool create default --range 20000-20999

  # Allocate ports for the PortAllocations in a file (or - for stdin)
  kubectl portalloc create -f sglang-pd.yaml

  # See what a pod of the decode role should get
  kubectl portalloc resolve sglang-pd --role decode --index 1
";

/// Hand out network ports to Kubernetes workloads without collisions.
///
/// Ports come from cluster-scoped PortPools and are recorded in namespaced PortAllocations.
/// Allocation happens in this client with optimistic concurrency on the pool's shards (each a
/// window of its ports), so no controller is needed and any number of concurrent clients never
/// hand out a port twice.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-portalloc",
    bin_name = "kubectl portalloc",
    version,
    after_help = EXAMPLES,
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    Install(install::InstallArgs),
    /// Create, list, inspect and delete PortPools.
    #[command(after_help = "Examples:
  kubectl portalloc pool create default --range 20000-20999
  kubectl portalloc pool get
  kubectl portalloc pool describe default")]
    Pool(pool::PoolArgs),
    Create(create::CreateArgs),
    Sync(sync::SyncArgs),
    Get(get::GetArgs),
    Describe(describe::DescribeArgs),
    Resolve(resolve::ResolveArgs),
    Release(release::ReleaseArgs),
    Delete(delete::DeleteArgs),
    Diff(diff::DiffArgs),
    Repair(repair::RepairArgs),
    Import(import::ImportArgs),
    NodeAgent(node_agent::NodeAgentArgs),
    Completion(completion::CompletionArgs),
    Version(version::VersionArgs),
}

impl Cli {
    /// Whether the command serves until stopped (`sync --watch`, `node-agent`) rather than runs
    /// and ends: it gets an async worker per core.
    pub fn serves(&self) -> bool {
        match &self.command {
            Command::Sync(args) => args.watch,
            Command::NodeAgent(_) => true,
            _ => false,
        }
    }
}

/// Run one parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let global = &cli.global;
    match cli.command {
        Command::Install(args) => install::run(global, args).await,
        Command::Pool(args) => pool::run(global, args).await,
        Command::Create(args) => create::run(global, args).await,
        Command::Sync(args) => sync::run(global, args).await,
        Command::Get(args) => get::run(global, args).await,
        Command::Describe(args) => describe::run(global, args).await,
        Command::Resolve(args) => resolve::run(global, args).await,
        Command::Release(args) => release::run(global, args).await,
        Command::Delete(args) => delete::run(global, args).await,
        Command::Diff(args) => diff::run(global, args).await,
        Command::Repair(args) => repair::run(global, args).await,
        Command::Import(args) => import::run(args),
        Command::NodeAgent(args) => node_agent::run(global, args).await,
        Command::Completion(args) => completion::run(args),
        Command::Version(args) => version::run(args),
    }
}

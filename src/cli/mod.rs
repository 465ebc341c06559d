//! The command line: argument parsing and one file per verb. Each verb is a thin shell over
//! [`crate::k8s`] (API access) and [`crate::core`] (decisions).

mod exit;
mod global;
mod install;
mod version;

use clap::{Parser, Subcommand};

pub use exit::{CliError, Exit, exit_for};
pub use global::GlobalArgs;

const EXAMPLES: &str = "\
Examples:
  # Install the CRDs and a first pool
  kubectl portalloc install --pool default --range 30000-32767

  # Allocate ports for the PortAllocations in a file (or - for stdin)
  kubectl portalloc create -f sglang-pd.yaml

  # See what a pod of the decode role should get
  kubectl portalloc resolve sglang-pd --role decode --index 1
";

/// Hand out network ports to Kubernetes workloads without collisions.
///
/// Ports come from cluster-scoped PortPools and are recorded in namespaced PortAllocations.
/// Allocation happens in this client with optimistic concurrency on the pool object, so no
/// controller is needed and any number of concurrent clients never hand out a port twice.
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
    Version(version::VersionArgs),
}

/// Run one parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Install(args) => install::run(&cli.global, args).await,
        Command::Version(args) => version::run(args),
    }
}

//! `kubectl portalloc install`: the CRDs, server-side applied, then the admission policy that
//! keeps pools of one protocol from sharing ports.

use std::time::Duration;

use clap::Args;

use super::GlobalArgs;
use crate::k8s;

const EXAMPLES: &str = "\
Examples:
  # Install (or upgrade) the CRDs and wait until they are served
  kubectl portalloc install

  # Print the CRDs instead, e.g. to commit them to a GitOps repository
  kubectl portalloc install --dry-run > portalloc-crds.yaml";

/// Install or upgrade the PortPool and PortAllocation CRDs (server-side apply), and the
/// portalloc-pool-overlap ValidatingAdmissionPolicy: the API server then refuses a pool whose
/// ranges meet another pool's of its protocol, whoever writes it.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct InstallArgs {
    /// Print the CRDs as YAML and change nothing (the admission policy install also applies is
    /// deploy/pool-overlap-policy.yaml).
    #[arg(long)]
    pub dry_run: bool,

    /// How long to wait for the CRDs to become Established, e.g. 60s, 2m, 1m30s.
    #[arg(
        long,
        default_value = "60s",
        value_name = "DURATION",
        value_parser = super::duration::parse_duration
    )]
    pub timeout: Duration,
}

pub async fn run(global: &GlobalArgs, args: InstallArgs) -> anyhow::Result<()> {
    if args.dry_run {
        print!("{}", crate::api::crds_yaml());
        return Ok(());
    }
    let client = k8s::connect(&global.client_options()).await?.client;
    for name in k8s::install_crds(&client, args.timeout).await? {
        println!("customresourcedefinition/{name} installed and established");
    }
    for applied in k8s::install_overlap_policy(&client).await? {
        println!("{applied} installed");
    }
    Ok(())
}

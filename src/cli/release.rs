//! `kubectl portalloc release NAME [--role R]`: give ports back, keep the object.

use clap::Args;

use super::dry_run::DryRunArg;
use super::report::{print_report, take_configmap_error};
use super::{CliError, Exit, GlobalArgs, Session};
use crate::k8s::{Intent, get_allocation};
use crate::ledger::{owner_of, recorded_holdings};

/// Give a PortAllocation's ports (or one role's) back to the pool; the object stays.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # Free every port of sglang-pd
  kubectl portalloc release sglang-pd -n llm

  # Free only the decode role's ports; `sync` allocates them again
  kubectl portalloc release sglang-pd --role decode

  # Which ports it would free, with nothing written
  kubectl portalloc release sglang-pd --role decode --dry-run=client")]
pub struct ReleaseArgs {
    pub name: String,
    /// Release only this role's ports.
    #[arg(long)]
    pub role: Option<String>,
    #[command(flatten)]
    pub dry_run: DryRunArg,
}

pub async fn run(global: &GlobalArgs, args: ReleaseArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let pa = get_allocation(&session.client, &session.namespace, &args.name).await?;
    if let Some(role) = &args.role {
        let in_spec = pa.spec.role(role).is_some();
        let held = pa.status.as_ref().is_some_and(|s| {
            recorded_holdings(s)
                .iter()
                .any(|(slot, _)| slot.spec_role() == role)
        });
        if !in_spec && !held {
            let roles: Vec<&str> = pa.spec.roles.iter().map(|r| r.name.as_str()).collect();
            return Err(CliError::new(
                Exit::Invalid,
                format!(
                    "PortAllocation {} has no role {role:?} (roles: {})",
                    owner_of(&pa),
                    roles.join(", ")
                ),
            )
            .into());
        }
    }
    if let Some(mode) = args.dry_run.mode() {
        let items = vec![(pa, Intent::Release { role: args.role })];
        return super::dry_run::run(&session, items, mode, None, &[]).await;
    }
    let mut report = session.allocator.release(pa, args.role).await?;
    let configmap_error = take_configmap_error(&mut report);
    print_report(&report, session.verbosity);
    // The ports are released either way; a ConfigMap that could not follow fails the command.
    match configmap_error {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

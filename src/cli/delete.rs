//! `kubectl portalloc delete NAME`: remove the PortAllocation, then free its ports.

use clap::Args;

use super::dry_run::DryRunArg;
use super::{GlobalArgs, Session};
use crate::k8s;

/// Delete a PortAllocation and give its ports back.
///
/// The object goes first, then its pool entry. If this is interrupted in between, the entry
/// belongs to a UID that no longer exists, which `kubectl portalloc repair` frees; the
/// reverse order could free ports of an object that is still in use.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  kubectl portalloc delete sglang-pd -n llm

  # Which ports it would free, with nothing deleted
  kubectl portalloc delete sglang-pd -n llm --dry-run=server")]
pub struct DeleteArgs {
    pub name: String,
    #[command(flatten)]
    pub dry_run: DryRunArg,
}

pub async fn run(global: &GlobalArgs, args: DeleteArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    if let Some(mode) = args.dry_run.mode() {
        let pa = k8s::get_allocation(&session.client, &session.namespace, &args.name).await?;
        let items = vec![(pa, k8s::Intent::Delete)];
        return super::dry_run::run(&session, items, mode, None, &[]).await;
    }
    let deleted = k8s::delete_allocation(
        &session.allocator,
        &session.client,
        &session.namespace,
        &args.name,
    )
    .await?;
    println!(
        "portallocation.portalloc.dev/{} deleted ({} ports released in pool {})",
        args.name, deleted.freed, deleted.pool
    );
    Ok(())
}

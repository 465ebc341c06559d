//! `kubectl portalloc delete NAME`: remove the PortAllocation, then free its ports.

use clap::Args;

use super::{GlobalArgs, Session};
use crate::k8s;

/// Delete a PortAllocation and give its ports back.
///
/// The object goes first, then its pool entry. If this is interrupted in between, the entry
/// belongs to a UID that no longer exists, which `kubectl portalloc repair` frees; the
/// reverse order could free ports of an object that is still in use.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  kubectl portalloc delete sglang-pd -n llm")]
pub struct DeleteArgs {
    pub name: String,
}

pub async fn run(global: &GlobalArgs, args: DeleteArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
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

//! `kubectl portalloc delete NAME`: remove the PortAllocation, then free its ports.

use clap::Args;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};

use super::allocations::{get_allocation, op};
use super::{GlobalArgs, Session};
use crate::api::PortAllocation;
use crate::k8s::{AllocateError, explain, owner_of};

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
    let namespace = session.namespace.clone();
    let pa = get_allocation(&session.client, &namespace, &args.name).await?;
    let api: Api<PortAllocation> = Api::namespaced(session.client.clone(), &namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pa.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    api.delete(&args.name, &params)
        .await
        .map_err(|e| explain(e, &op("delete", Some(&args.name), Some(&namespace))))?;
    let uid = pa.uid().unwrap_or_default();
    let freed = match session
        .allocator
        .release_holder(&pa.spec.pool, &uid, &owner_of(&pa))
        .await
    {
        Ok(freed) => freed,
        Err(AllocateError::PoolNotFound { .. }) => 0,
        Err(e) => {
            return Err(anyhow::Error::from(e).context(format!(
                "PortAllocation {} was deleted but its ports are still held in pool {:?}; \
                 `kubectl portalloc repair --apply` frees them",
                owner_of(&pa),
                pa.spec.pool
            )));
        }
    };
    println!(
        "portallocation.portalloc.dev/{} deleted ({freed} ports released in pool {})",
        args.name, pa.spec.pool
    );
    Ok(())
}

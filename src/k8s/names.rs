//! Names for shell completion: metadata-only lists (a pool's status or an allocation's spec
//! would be read only to be dropped), and a PortAllocation's role names. Completion must never
//! fail loudly, so callers turn an error into no names.

use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::api::{PortAllocation, PortPool};

pub async fn namespace_names(client: kube::Client) -> Result<Vec<String>, kube::Error> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let list = api.list_metadata(&ListParams::default()).await?;
    Ok(list.items.iter().map(|n| n.name_any()).collect())
}

pub async fn pool_names(client: kube::Client) -> Result<Vec<String>, kube::Error> {
    let api: Api<PortPool> = Api::all(client);
    let list = api.list_metadata(&ListParams::default()).await?;
    Ok(list.items.iter().map(|p| p.name_any()).collect())
}

pub async fn allocation_names(
    client: kube::Client,
    namespace: &str,
) -> Result<Vec<String>, kube::Error> {
    let api: Api<PortAllocation> = Api::namespaced(client, namespace);
    let list = api.list_metadata(&ListParams::default()).await?;
    Ok(list.items.iter().map(|p| p.name_any()).collect())
}

/// The roles of PortAllocation `name`.
pub async fn role_names(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<String>, kube::Error> {
    let api: Api<PortAllocation> = Api::namespaced(client, namespace);
    let pa = api.get(name).await?;
    Ok(pa.spec.roles.iter().map(|r| r.name.clone()).collect())
}

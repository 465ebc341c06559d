//! Reading PortAllocations, with errors that say which one and what to do.

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::api::PortAllocation;
use crate::k8s::{KubeError, Op, explain};

pub const ALLOCATIONS: &str = "portallocations.portalloc.dev";

pub fn op<'a>(verb: &'a str, name: Option<&'a str>, namespace: Option<&'a str>) -> Op<'a> {
    Op {
        verb,
        resource: ALLOCATIONS,
        kind: "PortAllocation",
        name,
        namespace,
    }
}

pub async fn get_allocation(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<PortAllocation, KubeError> {
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), namespace);
    api.get(name).await.map_err(|e| {
        explain(e, &op("get", Some(name), Some(namespace)))
            .with_hint(": list them with `kubectl portalloc get -A`")
    })
}

/// All PortAllocations in `namespace`, or in every namespace; sorted by namespace and name.
pub async fn list_allocations(
    client: &Client,
    namespace: Option<&str>,
) -> Result<Vec<PortAllocation>, KubeError> {
    let api: Api<PortAllocation> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut items = api
        .list(&ListParams::default())
        .await
        .map_err(|e| explain(e, &op("list", None, namespace)))?
        .items;
    items.sort_by_key(|pa| (pa.namespace(), pa.name_any()));
    Ok(items)
}

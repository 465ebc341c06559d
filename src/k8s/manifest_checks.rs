//! What `create -f` of several objects reads before its first write, so that a file whose
//! third object cannot be written leaves nothing half-applied: the namespaces its
//! PortAllocations are in, and the pools they name that the file does not bring.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::Api;

use super::error::KubeError;
use super::record::read_pool;
use super::resources::{NAMESPACES, POOLS};

/// The namespaces of `names` that do not exist.
pub async fn missing_namespaces(
    client: &Client,
    names: &BTreeSet<String>,
) -> Result<Vec<String>, KubeError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut missing = Vec::new();
    for name in names {
        let found = api
            .get_opt(name)
            .await
            .map_err(|e| KubeError::from_kube(e, NAMESPACES.on("get", name, None)))?;
        if found.is_none() {
            missing.push(name.clone());
        }
    }
    Ok(missing)
}

/// The pools of `names` that do not exist.
pub async fn missing_pools(
    client: &Client,
    names: &BTreeSet<String>,
) -> Result<Vec<String>, KubeError> {
    let mut missing = Vec::new();
    for name in names {
        let found = read_pool(client, name)
            .await
            .map_err(|e| KubeError::from_kube(e, POOLS.on("get", name, None)))?;
        if found.is_none() {
            missing.push(name.clone());
        }
    }
    Ok(missing)
}

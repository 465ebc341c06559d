//! Ports of a pool that NodePort (or LoadBalancer) Services use: kube-proxy forwards those on
//! every node, so a hostNetwork server bound there never receives that traffic. `pool describe`
//! warns about each.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::error::KubeError;
use super::pages::{Paged, for_each_page};
use super::resources::SERVICES;
use crate::ledger::WindowRecord;

/// Only NodePort and LoadBalancer Services have node ports: ClusterIP and ExternalName ones are
/// left on the server (the API server selects Services by `spec.type`).
const MAY_HOLD_NODE_PORTS: &str = "spec.type!=ClusterIP,spec.type!=ExternalName";

/// One warning per Service port inside the pool; a line saying why, when Services cannot be read.
pub async fn node_port_conflicts(client: &kube::Client, record: &WindowRecord) -> Vec<String> {
    let services: Api<Service> = Api::all(client.clone());
    let by_type = ListParams::default().fields(MAY_HOLD_NODE_PORTS);
    let listed = match conflicts(&services, &by_type, record).await {
        // A server that cannot select Services by type: every Service, page by page.
        Err(kube::Error::Api(status)) if status.code == 400 => {
            conflicts(&services, &ListParams::default(), record).await
        }
        other => other,
    };
    listed.unwrap_or_else(|e| {
        vec![format!(
            "could not check NodePort Services ({}); ports they use are not reported",
            KubeError::from_kube(e, SERVICES.all("list", None))
        )]
    })
}

/// The conflicts of the Services `params` selects, walked page by page: a cluster's Services
/// are never held in memory all at once.
async fn conflicts(
    services: &Api<Service>,
    params: &ListParams,
    record: &WindowRecord,
) -> Result<Vec<String>, kube::Error> {
    let mut found = Vec::new();
    for_each_page(services, params, |paged| match paged {
        Paged::Object(service) => found.extend(service_conflicts(&service, record)),
        Paged::Restart => found.clear(),
    })
    .await?;
    Ok(found)
}

/// What one Service's node ports mean for the pool.
fn service_conflicts(service: &Service, record: &WindowRecord) -> Vec<String> {
    let protocol = record.pool.spec.protocol.to_string();
    let mut found = Vec::new();
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    for port in ports.into_iter().flatten() {
        let Some(node_port) = port.node_port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        let same_protocol = port.protocol.as_deref().unwrap_or("TCP") == protocol;
        if same_protocol && record.ports.contains(node_port) {
            let held = match record.holder_of(node_port) {
                Some((_, holder, slot)) => {
                    format!(", and the pool has handed it to {} ({slot})", holder.owner)
                }
                None => String::new(),
            };
            found.push(format!(
                "port {node_port} is a NodePort of Service {}/{}{held}: kube-proxy forwards it on every node; exclude it from the pool",
                service.namespace().unwrap_or_default(),
                service.name_any()
            ));
        }
    }
    found
}

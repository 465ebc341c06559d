//! The node agent's Lease: its heartbeat (the renew time) and its report (annotations), one per
//! node in the agent's namespace, as kubelet keeps one per node in `kube-node-lease`. Written
//! with get, then create or update with the resourceVersion read: the rights the chart grants.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};

use crate::k8s::error::KubeError;
use crate::k8s::resources::LEASES;
use crate::ledger::node_report::{NODE_AGENT_LABEL, NodeReport, ReadReport, lease_name};

/// Write `report` as the agent's Lease in `namespace`, renewed now, valid for `duration`.
pub(super) async fn publish(
    client: &kube::Client,
    namespace: &str,
    report: &NodeReport,
    duration: Duration,
) -> Result<(), KubeError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = lease_name(&report.node);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let spec = LeaseSpec {
        holder_identity: Some(report.node.clone()),
        lease_duration_seconds: Some(duration.as_secs().max(1) as i32),
        renew_time: Some(now),
        ..LeaseSpec::default()
    };
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|e| KubeError::from_kube(e, LEASES.on("get", &name, Some(namespace))))?;
    let metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace.to_string()),
        labels: Some([(NODE_AGENT_LABEL.to_string(), "true".to_string())].into()),
        annotations: Some(report.annotations()),
        resource_version: existing
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone()),
        ..ObjectMeta::default()
    };
    let lease = Lease {
        metadata,
        spec: Some(spec),
    };
    let written = match existing {
        None => api.create(&PostParams::default(), &lease).await,
        Some(_) => api.replace(&name, &PostParams::default(), &lease).await,
    };
    let verb = if lease.metadata.resource_version.is_some() {
        "update"
    } else {
        "create"
    };
    written
        .map(drop)
        .map_err(|e| KubeError::from_kube(e, LEASES.on(verb, &name, Some(namespace))))
}

/// Every node agent's report, in every namespace.
pub async fn node_reports(client: &kube::Client) -> Result<Vec<ReadReport>, KubeError> {
    let api: Api<Lease> = Api::all(client.clone());
    let leases = api
        .list(&ListParams::default().labels(&format!("{NODE_AGENT_LABEL}=true")))
        .await
        .map_err(|e| KubeError::from_kube(e, LEASES.all("list", None)))?;
    let now = k8s_openapi::jiff::Timestamp::now();
    Ok(leases
        .items
        .into_iter()
        .filter_map(|lease| {
            let report = NodeReport::from_annotations(lease.metadata.annotations.as_ref()?)?;
            let spec = lease.spec.unwrap_or_default();
            let age = spec.renew_time.and_then(|t| {
                let age = now.duration_since(t.0);
                Duration::try_from(age).ok()
            });
            Some(ReadReport {
                report,
                age,
                lease_duration: Duration::from_secs(
                    spec.lease_duration_seconds.unwrap_or(90).max(1) as u64,
                ),
            })
        })
        .collect())
}

//! The node agent's Lease: its heartbeat (the renew time) and its report (annotations), one per
//! node in the agent's namespace, as kubelet keeps one per node in `kube-node-lease`. Written
//! with get, then create or update with the resourceVersion read: the rights the chart grants.
//! The chart's policy `portalloc-node-agent-lease` lets an agent write only its own node's
//! Lease, so `pool describe` believes a Lease only in the agents' namespace and under its node's
//! name.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};

use super::LEASE_RETRY;
use crate::api::PortPool;
use crate::k8s::error::KubeError;
use crate::k8s::resources::LEASES;
use crate::ledger::node_guard::{HELD_TWICE, listener_conflicts};
use crate::ledger::node_report::{NODE_AGENT_LABEL, NodeReport, ReadReport, lease_name};
use crate::node::listeners::listeners;

/// Write `report` as the agent's Lease in `namespace`, renewed now, valid for `duration`.
pub async fn publish(
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

/// Every node agent's report in `namespace`, the agents' own. A Lease elsewhere, or one whose
/// name is not its report's node's (which no agent may write there), is not an agent's word.
pub async fn node_reports(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<ReadReport>, KubeError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let leases = api
        .list(&ListParams::default().labels(&format!("{NODE_AGENT_LABEL}=true")))
        .await
        .map_err(|e| KubeError::from_kube(e, LEASES.all("list", Some(namespace))))?;
    let now = k8s_openapi::jiff::Timestamp::now();
    Ok(leases
        .items
        .into_iter()
        .filter_map(|lease| {
            let report = NodeReport::from_annotations(lease.metadata.annotations.as_ref()?)?;
            if lease.metadata.name.as_deref() != Some(lease_name(&report.node).as_str()) {
                return None;
            }
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

impl super::Agent {
    /// Renew the Lease with what the agent does now, when that changed or is due.
    /// The listeners are read (all of `/proc/net/tcp` and the like) only when the pools changed
    /// or the report is due, not every round.
    pub(super) async fn publish_report(
        &mut self,
        pools: &BTreeMap<String, PortPool>,
        pools_changed: bool,
    ) {
        let Some(namespace) = self.options.lease_namespace.clone() else {
            return;
        };
        if self.lease_retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let due = self
            .published
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() >= self.options.report_every);
        let plan = self.plan.clone().unwrap_or_default();
        let conflicts = match &self.published {
            Some((last, _)) if !due && !pools_changed => last.conflicts.clone(),
            _ => {
                let listeners: Vec<_> = listeners()
                    .into_iter()
                    .map(|l| (l.protocol, l.port, l.uid))
                    .collect();
                let owners = self.written_owners.clone().unwrap_or_default();
                let pools: Vec<PortPool> = pools.values().cloned().collect();
                let mut lines = listener_conflicts(&pools, &listeners, &owners);
                lines.extend(plan.unreserved.iter().cloned());
                lines
            }
        };
        // Ports two pods on the node hold (two pools over one port) come from the last round
        // of the guard's maps, not from the listeners.
        let mut conflicts = conflicts;
        conflicts.retain(|line| !line.contains(HELD_TWICE));
        conflicts.extend(self.held_twice.iter().cloned());
        let report = NodeReport {
            node: self.options.node_name.clone(),
            guard_unavailable: self.guard_failure.clone(),
            pools: if self.guard.is_some() {
                plan.guarded.clone()
            } else {
                BTreeMap::new()
            },
            reserved: plan.reserved.len(),
            conflicts,
        };
        let changed = self
            .published
            .as_ref()
            .is_none_or(|(last, _)| last != &report);
        if !due && !changed {
            return;
        }
        for gone in self.conditions.holding_with("conflict/") {
            if !report
                .conflicts
                .iter()
                .any(|line| gone == format!("conflict/{line}"))
            {
                self.note(&gone, "no longer so", Ok(()));
            }
        }
        for line in &report.conflicts {
            self.note(&format!("conflict/{line}"), "", Err(line.clone()));
        }
        let duration = self.options.report_every * 3;
        let published = publish(&self.client, &namespace, &report, duration).await;
        let outcome = published
            .as_ref()
            .map_err(|e| format!("renewing the node agent's Lease in namespace {namespace}: {e}"));
        self.note(
            "lease",
            "the node agent's Lease is renewed again",
            outcome.copied(),
        );
        match published {
            Ok(()) => {
                self.published = Some((report, Instant::now()));
                self.lease_retry_at = None;
            }
            Err(_) => {
                self.lease_retry_at =
                    Some(Instant::now() + LEASE_RETRY.min(self.options.report_every));
            }
        }
    }
}

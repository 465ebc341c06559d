//! The pod webhook's decisions: for a pod labelled `portalloc.dev/allocation: NAME`, read that
//! PortAllocation, sync it first if it has not been (applied by GitOps, never synced), and
//! answer with the patch that gives the pod exactly what `resolve --pod` prints for it (and, on
//! hostNetwork, declares those ports in its spec, in the pool's protocol, for kube-scheduler);
//! deny with one line when it cannot (no slot for the pod, a lasting refusal), so the workload
//! controller retries.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

use super::denial::Denial;
use super::record_check;
use crate::api::{POD_ALLOCATION_LABEL, PortAllocation, declares_ports, pod_patch};
use crate::k8s::allocate::{AllocateError, Allocator};
use crate::k8s::error::KubeError;
use crate::k8s::process::Metrics;
use crate::k8s::record::ShardVersions;
use crate::k8s::resources::ALLOCATIONS;
use crate::ledger::is_current;
use crate::ledger::owner_of;

/// Answers AdmissionReviews for pods.
#[derive(Clone)]
pub struct PodWebhook {
    client: kube::Client,
    allocator: Allocator,
    metrics: Metrics,
    /// What the watch of the shards has seen: which remembered copies are current.
    shard_versions: ShardVersions,
}

impl PodWebhook {
    pub fn new(
        client: kube::Client,
        allocator: Allocator,
        metrics: Metrics,
        shard_versions: ShardVersions,
    ) -> Self {
        Self {
            client,
            allocator,
            metrics,
            shard_versions,
        }
    }

    /// One AdmissionReview (the request body) in, its answer out.
    pub async fn review(&self, body: &[u8]) -> AdmissionReview<DynamicObject> {
        let started = Instant::now();
        let review: AdmissionReview<Pod> = match serde_json::from_slice(body) {
            Ok(review) => review,
            Err(e) => {
                self.metrics.record_admission("invalid", started.elapsed());
                return AdmissionResponse::invalid(format!("not an AdmissionReview: {e}"))
                    .into_review();
            }
        };
        let request: AdmissionRequest<Pod> = match review.try_into() {
            Ok(request) => request,
            Err(e) => {
                self.metrics.record_admission("invalid", started.elapsed());
                return AdmissionResponse::invalid(e.to_string()).into_review();
            }
        };
        let response = AdmissionResponse::from(&request);
        let (result, response) = match self.decide(&request).await {
            Ok(Some(patch)) => match response.with_patch(patch) {
                Ok(response) => ("allowed", response),
                Err(e) => (
                    "error",
                    AdmissionResponse::from(&request).deny(format!("portalloc: {e}")),
                ),
            },
            Ok(None) => ("allowed", response),
            Err(denial) => ("denied", response.deny(format!("portalloc: {denial}"))),
        };
        let took = started.elapsed();
        self.metrics.record_admission(result, took);
        tracing::info!(
            pod = %pod_label(&request),
            result,
            took_ms = took.as_millis() as u64,
            "admission"
        );
        response.into_review()
    }

    /// The patch for the pod, `None` to let it pass untouched, or why it is denied.
    async fn decide(
        &self,
        request: &AdmissionRequest<Pod>,
    ) -> Result<Option<json_patch::Patch>, Denial> {
        let Some(pod) = &request.object else {
            return Ok(None);
        };
        let Some(name) = pod.labels().get(POD_ALLOCATION_LABEL) else {
            // Only labelled pods are sent (objectSelector); anything else passes.
            return Ok(None);
        };
        let namespace = request.namespace.clone().unwrap_or_default();
        // The watcher's cache first (no request); a cached object whose status is current
        // either gives the pod ports the record confirms, or the pod is decided again from a
        // fresh read: a denial is never the cache's.
        let cached = self.allocator.watched().get(&namespace, name);
        if let Some(pa) = cached.filter(is_current) {
            match self.admit(pod, &pa).await {
                Ok(patch) => return Ok(patch),
                Err(denial) => tracing::debug!(
                    "admission from the cached {}: {denial}; reading it afresh",
                    owner_of(&pa)
                ),
            }
        }
        let api: Api<PortAllocation> = Api::namespaced(self.client.clone(), &namespace);
        let pa = api
            .get_opt(name)
            .await
            .map_err(|e| {
                Denial::Read(KubeError::from_kube(
                    e,
                    ALLOCATIONS.on("get", name, Some(&namespace)),
                ))
            })?
            .ok_or_else(|| Denial::NoAllocation {
                namespace: namespace.clone(),
                name: name.clone(),
            })?;
        let pa = if is_current(&pa) {
            pa
        } else if request.dry_run {
            return Err(Denial::DryRun {
                owner: owner_of(&pa),
                name: name.clone(),
                namespace,
            });
        } else {
            // Applied and never synced, or its spec changed (a scale-up raising replicas and
            // the PortAllocation together): sync it now, as `kubectl portalloc sync` would.
            match self.allocator.sync_or_record(pa).await {
                Ok(report) => report.allocation,
                Err(AllocateError::Refused(refusal)) => return Err(Denial::Refused(refusal)),
                Err(e) => return Err(Denial::Sync(e)),
            }
        };
        self.admit(pod, &pa).await
    }

    /// The pod's patch from `pa` (current): its ports, each checked against the pool's record.
    async fn admit(
        &self,
        pod: &Pod,
        pa: &PortAllocation,
    ) -> Result<Option<json_patch::Patch>, Denial> {
        let injection = pa.pod_injection(pod)?;
        let record = record_check::Record {
            client: &self.client,
            allocator: &self.allocator,
            versions: &self.shard_versions,
        };
        record.check(pa, &injection).await?;
        let protocol = if declares_ports(pod) {
            Some(self.protocol(pa).await?)
        } else {
            None
        };
        let patch = pod_patch(pod, &injection, protocol);
        serde_json::from_value(serde_json::Value::Array(patch))
            .map(Some)
            .map_err(Denial::Patch)
    }
}

impl PodWebhook {
    /// The protocol of `pa`'s pool, which its pods' declared ports are in.
    async fn protocol(&self, pa: &PortAllocation) -> Result<crate::api::Protocol, Denial> {
        match self.allocator.pool_of(pa).await {
            Ok(Some(pool)) => Ok(pool.spec.protocol),
            Ok(None) => Err(Denial::NoPool {
                pool: pa.spec.pool.clone(),
                owner: owner_of(pa),
            }),
            Err(e) => Err(Denial::Pool(e)),
        }
    }
}

/// `namespace/name` of the pod, or its generateName prefix.
fn pod_label(request: &AdmissionRequest<Pod>) -> String {
    let namespace = request.namespace.clone().unwrap_or_default();
    match &request.object {
        Some(pod) if !pod.name_any().is_empty() => format!("{namespace}/{}", pod.name_any()),
        Some(pod) => format!(
            "{namespace}/{}*",
            pod.metadata.generate_name.clone().unwrap_or_default()
        ),
        None => format!("{namespace}/{}", request.name),
    }
}

//! Installing the CRDs, and the admission policy that keeps pools from sharing ports.

use crate::k8s::error::error_chain;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};

use super::client::FIELD_MANAGER;
use super::error::{ApiErrorKind, KubeError};
use super::resources::{CRDS, POLICIES, POLICY_BINDINGS};
use crate::api;

/// Server-side apply every CRD, then wait until the API server serves them (`Established`).
/// Returns the names applied.
pub async fn install_crds(client: &Client, wait: Duration) -> Result<Vec<String>, KubeError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for crd in api::crds() {
        let name = crd.name_any();
        crds.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(|e| KubeError::from_kube(e, CRDS.on("patch", &name, None)))?;
        tracing::info!("applied CustomResourceDefinition {name}");
        names.push(name);
    }
    for name in &names {
        let established = await_condition(crds.clone(), name, conditions::is_crd_established());
        match tokio::time::timeout(wait, established).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(KubeError::new(
                    ApiErrorKind::Other,
                    CRDS.all("watch", None),
                    format!("waiting for {name} to be Established: {}", error_chain(&e)),
                ));
            }
            Err(_) => {
                return Err(KubeError::new(
                    ApiErrorKind::Unavailable,
                    CRDS.all("watch", None),
                    format!("{name} was not Established within {wait:?}"),
                ));
            }
        }
    }
    Ok(names)
}

/// Server-side apply the portalloc-pool-overlap ValidatingAdmissionPolicy and its binding
/// (after the CRDs: the policy's params are PortPools). Returns what was applied, as
/// `kind/name`.
pub async fn install_overlap_policy(client: &Client) -> Result<Vec<String>, KubeError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let (policy, binding) = api::pool_overlap_policy();
    let name = policy.name_any();
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .patch(&name, &params, &Patch::Apply(&policy))
        .await
        .map_err(|e| KubeError::from_kube(e, POLICIES.on("patch", &name, None)))?;
    let bound = binding.name_any();
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .patch(&bound, &params, &Patch::Apply(&binding))
        .await
        .map_err(|e| KubeError::from_kube(e, POLICY_BINDINGS.on("patch", &bound, None)))?;
    tracing::info!("applied ValidatingAdmissionPolicy {name} and its binding");
    Ok(vec![
        format!("validatingadmissionpolicy.admissionregistration.k8s.io/{name}"),
        format!("validatingadmissionpolicybinding.admissionregistration.k8s.io/{bound}"),
    ])
}

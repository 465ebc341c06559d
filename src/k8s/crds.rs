//! Installing the CRDs.

use crate::k8s::error::error_chain;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};

use super::FIELD_MANAGER;
use super::error::{ApiErrorKind, KubeError};
use super::resources::CRDS;
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

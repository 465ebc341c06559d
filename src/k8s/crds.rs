//! Installing the CRDs and noticing when they are missing.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};

use super::{FIELD_MANAGER, KubeError, Op, explain};
use crate::api;

const CRD_RESOURCE: &str = "customresourcedefinitions.apiextensions.k8s.io";

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
            .map_err(|e| {
                explain(
                    e,
                    &Op {
                        verb: "patch",
                        resource: CRD_RESOURCE,
                        kind: "CustomResourceDefinition",
                        name: Some(&name),
                        namespace: None,
                    },
                )
            })?;
        names.push(name);
    }
    for name in &names {
        let established = await_condition(crds.clone(), name, conditions::is_crd_established());
        match tokio::time::timeout(wait, established).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(KubeError::Other {
                    verb: "watch".into(),
                    resource: CRD_RESOURCE.into(),
                    message: format!("waiting for {name} to be Established: {e}"),
                });
            }
            Err(_) => {
                return Err(KubeError::Unavailable {
                    verb: "watch".into(),
                    resource: CRD_RESOURCE.into(),
                    message: format!("{name} was not Established within {wait:?}"),
                });
            }
        }
    }
    Ok(names)
}

/// Whether both CRDs are served. Reading a CRD needs cluster-scoped rights that ordinary users
/// lack, so this asks the discovery endpoint of our group instead.
pub async fn crds_installed(client: &Client) -> Result<bool, KubeError> {
    let path = format!("/apis/{}/{}", api::GROUP, api::VERSION);
    let request = http::Request::get(&path)
        .body(Vec::new())
        .expect("a GET request always builds");
    match client
        .request::<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList>(request)
        .await
    {
        Ok(list) => Ok(["portpools", "portallocations"]
            .iter()
            .all(|plural| list.resources.iter().any(|r| r.name == *plural))),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(explain(
            e,
            &Op {
                verb: "get",
                resource: &path,
                kind: "APIGroup",
                name: None,
                namespace: None,
            },
        )),
    }
}

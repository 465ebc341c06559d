//! Writing the ConfigMap of env files that pods source.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::FIELD_MANAGER;
use super::error::{ApiErrorKind, KubeError};
use super::resources::CONFIGMAPS;

/// Server-side apply `configmap` (its fields owned by this plugin's field manager).
pub async fn apply_configmap(client: &Client, configmap: &ConfigMap) -> Result<(), KubeError> {
    let namespace = configmap.namespace().unwrap_or_default();
    let name = configmap.name_any();
    let target = || CONFIGMAPS.on("patch", &name, Some(&namespace));
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    // Server-side apply needs the type fields, which the typed object leaves out.
    let mut body = serde_json::to_value(configmap)
        .map_err(|e| KubeError::new(ApiErrorKind::Invalid, target(), e.to_string()))?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "ConfigMap".into();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|e| KubeError::from_kube(e, target()))?;
    tracing::info!("applied ConfigMap {namespace}/{name}");
    Ok(())
}

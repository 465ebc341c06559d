//! Env files: what a pod sources (`. /etc/portalloc/<pod>.env`), and the ConfigMap that holds
//! one per pod. Pure: the PortAllocation in, text and the ConfigMap object out.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::{EnvVar, PortAllocation, ResolveError};

/// Label on every ConfigMap of env files: the PortAllocation it was made from.
pub const ALLOCATION_LABEL: &str = "portalloc.dev/allocation";

/// `KEY=VALUE` lines, each prefixed with `prefix` (`export ` for a shell's eval).
pub fn env_lines(env: &[EnvVar], prefix: &str) -> String {
    env.iter()
        .map(|e| format!("{prefix}{}={}\n", e.name, e.value))
        .collect()
}

/// The ConfigMap holding every pod's env file, named `name` (default: the PortAllocation's
/// `spec.configMap.name`, else `<allocation>-ports`), controlled by the PortAllocation so it goes
/// away with it (where a garbage collector runs).
pub fn env_configmap(pa: &PortAllocation, name: Option<&str>) -> Result<ConfigMap, ResolveError> {
    let all = pa.resolve_all()?;
    let name = name
        .map(str::to_string)
        .or_else(|| pa.spec.config_map.as_ref().map(|c| c.name.clone()))
        .unwrap_or_else(|| format!("{}-ports", pa.name_any()));
    let data = all
        .iter()
        .map(|(pod, env)| (format!("{pod}.env"), env_lines(env, "")))
        .collect();
    let owner = kube::Resource::controller_owner_ref(pa, &());
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: pa.namespace(),
            labels: Some(BTreeMap::from([(
                ALLOCATION_LABEL.to_string(),
                pa.name_any(),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    })
}

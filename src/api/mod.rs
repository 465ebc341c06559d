//! The CustomResourceDefinitions of `portalloc.dev/v1alpha1`.
//!
//! The Rust types are the source of truth: `crds/*.yaml` is generated from them
//! (`kubectl-portalloc crds > ...`, see `scripts/gen-crds.sh`) and a test fails when the
//! checked-in YAML drifts.

mod admission;
mod allocation;
mod env_file;
#[cfg(test)]
mod fixtures;
mod overlap_policy;
mod pods;
mod pool;
mod port_range_text;
mod rbg;
mod reference_check;
mod resolve;
mod shard;
mod static_band;
mod topology;
mod validate;
mod workload;

pub use admission::{
    DEFAULT_CONTAINER_ANNOTATION, POD_ALLOCATION_LABEL, POD_ROLE_LABEL, PORTS_ANNOTATION,
    PodInjection, PodInjectionError, PodPort, declared_ports, declares_ports, pod_patch,
};
pub use allocation::*;
pub use env_file::{ALLOCATION_LABEL, env_configmap, env_lines, quote_env_value};
pub use overlap_policy::{POOL_OVERLAP_POLICY, POOL_OVERLAP_POLICY_YAML, pool_overlap_policy};
pub use pods::{Pod, find_pod};
pub use pool::*;
pub use port_range_text::PortRangeText;
pub use rbg::{ImportError, Imported, RBG_ANNOTATION, import_rbg};
pub use resolve::{EnvVar, ResolveError, index_from_pod_name};
pub use shard::*;
pub use static_band::StaticBandSetting;
pub use topology::{TOPOLOGY_FILE, Topology, TopologyPod, TopologyRole};
pub use validate::SpecError;
pub use workload::{ConfigMapTarget, LwsMember, Workload, WorkloadKind};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every kind this project defines.
pub const GROUP: &str = "portalloc.dev";
/// The only served version so far.
pub const VERSION: &str = "v1alpha1";
/// `kubectl get portalloc` lists both kinds.
pub const CATEGORY: &str = "portalloc";

/// Every CRD this project installs, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![PortPool::crd(), PortAllocation::crd(), PortPoolShard::crd()]
}

/// Where the generated CRDs are checked in, relative to the repository root.
pub const CRDS_FILE: &str = "crds/portalloc-crds.yaml";

/// The CRDs as one multi-document YAML stream, exactly as checked in at [`CRDS_FILE`].
pub fn crds_yaml() -> String {
    let documents: Vec<String> = crds()
        .iter()
        .map(|crd| serde_yaml::to_string(crd).expect("a CRD always serializes"))
        .collect();
    format!(
        "# Generated from the Rust types in src/api by scripts/gen-crds.sh: do not edit by hand.\n{}",
        documents.join("---\n")
    )
}

/// A DNS-1035 label: what role and port names must be, so that `role.port` and
/// `<pod>-<index>` stay unambiguous.
pub(crate) const DNS_LABEL: &str = "^[a-z]([-a-z0-9]*[a-z0-9])?$";
/// A POSIX-ish environment variable name.
pub(crate) const ENV_NAME: &str = "^[A-Za-z_][A-Za-z0-9_]*$";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_in_crds_match_the_rust_types() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CRDS_FILE);
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == crds_yaml(),
            "{} differs from what the Rust types generate: run scripts/gen-crds.sh and commit the result",
            path.display()
        );
    }

    #[test]
    fn crds_carry_subresources_short_names_and_categories() {
        for crd in crds() {
            let names = &crd.spec.names;
            assert_eq!(
                names.categories.as_deref(),
                Some(&[CATEGORY.to_string()][..])
            );
            assert_eq!(
                names.short_names.as_ref().map(Vec::len),
                Some(1),
                "{}",
                crd.spec.names.kind
            );
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, VERSION);
            assert!(
                version
                    .subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some()
            );
            assert!(
                version
                    .additional_printer_columns
                    .as_ref()
                    .is_some_and(|c| c.len() >= 4)
            );
        }
    }
}

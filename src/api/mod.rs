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

    /// Words a YAML 1.1 reader (kubectl's sigs.k8s.io/yaml, Argo CD, Flux) takes for a boolean
    /// or null when unquoted; serde_yaml writes YAML 1.2, where they are plain strings.
    const YAML11_NOT_STRINGS: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
        "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", "~", "null", "Null", "NULL",
    ];

    fn enum_words(schema: &serde_json::Value, out: &mut Vec<String>) {
        match schema {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::Array(words)) = map.get("enum") {
                    // `null` is how a nullable enum is written, not a word.
                    out.extend(words.iter().filter(|w| !w.is_null()).map(|w| w.to_string()));
                }
                map.values().for_each(|v| enum_words(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| enum_words(v, out)),
            _ => {}
        }
    }

    #[test]
    fn no_enum_word_reads_as_a_boolean_null_or_number_in_yaml_1_1() {
        let mut words = Vec::new();
        for crd in crds() {
            enum_words(&serde_json::to_value(&crd).unwrap(), &mut words);
        }
        assert!(words.iter().any(|w| w == "\"Enforce\""), "found {words:?}");
        for word in &words {
            let bare = word.trim_matches('"');
            assert!(
                !YAML11_NOT_STRINGS.contains(&bare) && bare.parse::<f64>().is_err(),
                "enum word {word} is not a string to a YAML 1.1 reader: users writing it unquoted get a boolean or number"
            );
        }
    }

    fn strings(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::String(s) => out.push(s.clone()),
            serde_json::Value::Object(map) => {
                map.iter().for_each(|(k, v)| {
                    out.push(k.clone());
                    strings(v, out)
                });
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
            _ => {}
        }
    }

    /// A string the CRDs hold that YAML 1.1 reads as a boolean or null is quoted in the
    /// checked-in file, so `kubectl apply -f crds/` serves the schema `install` applies.
    #[test]
    fn checked_in_crds_quote_every_string_yaml_1_1_would_misread() {
        let mut held = Vec::new();
        for crd in crds() {
            strings(&serde_json::to_value(&crd).unwrap(), &mut held);
        }
        let yaml = crds_yaml();
        for word in held
            .iter()
            .filter(|s| YAML11_NOT_STRINGS.contains(&s.as_str()))
        {
            for line in yaml.lines() {
                let bare = line.trim_start().trim_start_matches("- ");
                let value = bare.rsplit_once(": ").map_or(bare, |(_, v)| v);
                assert!(
                    value != word,
                    "kubectl would read {word:?} in `{line}` as a boolean or null"
                );
            }
        }
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

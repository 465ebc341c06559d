//! `PortPoolShard`: the record of one 256-port window of a PortPool (docs/record-at-scale.md),
//! in one of its copies (`nodeReuse`). Every pool keeps its holders this way, whatever its size:
//! a small pool is one shard.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{PortPoolSpec, PortRangeText};

/// The message of the spec's immutability rule.
pub const SHARD_SPEC_IMMUTABLE: &str = "spec of a PortPoolShard is immutable: it names the ports this record is the lock for; delete the shard (repair recreates it) instead of editing it";

/// Which ports of a pool this shard is the record (and the compare-and-swap lock) for.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "portalloc.dev",
    version = "v1alpha1",
    kind = "PortPoolShard",
    plural = "portpoolshards",
    shortname = "ppshard",
    // Lets the allocator and `repair` list one pool's shards with a field selector: a label
    // cannot carry every pool name (label values stop at 63 characters, names at 253).
    selectable = ".spec.pool",
    doc = "The holders of one 256-port window of a PortPool.",
    category = "portalloc",
    status = "PortPoolShardStatus",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.pool"}"#,
    printcolumn = r#"{"name":"Ranges","type":"string","jsonPath":".spec.ranges"}"#,
    printcolumn = r#"{"name":"Copy","type":"integer","priority":1,"jsonPath":".spec.copy"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.size"}"#,
    printcolumn = r#"{"name":"Allocated","type":"integer","jsonPath":".status.allocated"}"#,
    printcolumn = r#"{"name":"Holders","type":"integer","priority":1,"jsonPath":".status.holderCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message(SHARD_SPEC_IMMUTABLE))]
pub struct PortPoolShardSpec {
    /// Name of the PortPool this shard belongs to.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub pool: String,
    /// UID of that PortPool: a shard left over from a deleted pool of the same name is foreign.
    #[serde(rename = "poolUID")]
    #[schemars(length(min = 1, max = 64))]
    pub pool_uid: String,
    /// The window number: this shard covers ports `256*index .. 256*index+255` (port 0 excepted).
    #[schemars(range(min = 0, max = 255))]
    pub index: i32,
    /// The window as port ranges, for humans and CEL; the ports the shard records are these
    /// ranges intersected with the pool's current ports.
    #[schemars(length(min = 1, max = 1))]
    pub ranges: Vec<PortRangeText>,
    /// Which copy of the pool's ports this shard records (a pool with `nodeReuse: N` keeps
    /// copies 0 to N-1; a port is held at most once in each). Omitted for copy 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 255))]
    pub copy: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// The record of the shard's ports. Written only through the status subresource with the
/// resourceVersion read: that compare-and-swap keeps the shard's ports unique.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortPoolShardStatus {
    /// `metadata.generation` of the PortPool whose spec is copied below.
    #[serde(default)]
    pub pool_generation: i64,
    /// The pool's spec this record was last decided under: a copy, so that an allocation that
    /// lives in this shard needs no read of the PortPool. A newer spec reaches the shards with
    /// the next write of a client that read the pool (`sync --all`, `repair`, the watcher, a
    /// pool applied with `kubectl portalloc create -f`); `kubectl portalloc pool describe`
    /// says how many shards still carry an older one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_spec: Option<PortPoolSpec>,
    /// The shard's ports after the pool's exclusions.
    #[serde(default)]
    pub size: i32,
    /// Ports held by some PortAllocation.
    #[serde(default)]
    pub allocated: i32,
    /// Ports free to allocate.
    #[serde(default)]
    pub available: i32,
    /// How many PortAllocations hold ports here.
    #[serde(default)]
    pub holder_count: i32,
    /// Who holds which of the shard's ports: a port is taken exactly when some holder lists it
    /// here. An atomic list: it is only ever replaced whole (with the resourceVersion read),
    /// and a keyed list would make the server track every holder in managedFields, doubling
    /// the stored object and the work of every write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub holders: Vec<PoolHolder>,
    /// PortAllocations whose home window this is (in copy 0) and whose ports a group commit
    /// (`sync --all`, the watcher) is placing in other shards before their status can name
    /// them: their next sync reads every shard of the pool instead of this one alone. Written
    /// before those entries; an entry goes once its PortAllocation's status names its shards.
    /// Atomic, as `holders` is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub elsewhere: Vec<PlacedElsewhere>,
}

/// A PortAllocation placed outside its home shard by a group commit (see `status.elsewhere`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct PlacedElsewhere {
    /// The PortAllocation's UID: a recreated object with the same name is not it.
    pub uid: String,
    /// `namespace/name` of the PortAllocation, for humans and for the tenancy policy.
    pub owner: String,
}

/// One PortAllocation's holdings in one shard.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolHolder {
    /// The PortAllocation's UID: a recreated object with the same name is a new holder.
    pub uid: String,
    /// `namespace/name` of the PortAllocation, for humans and for the tenancy policy.
    pub owner: String,
    /// Compact holdings: space-separated `role.port=v0,v1,...` groups, values in pod-index order.
    pub ports: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::Value;

    fn schema() -> Value {
        let crd = PortPoolShard::crd();
        assert_eq!(crd.spec.scope, "Cluster");
        let version = &crd.spec.versions[0];
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "status must be a subresource, so holders are written with their own CAS"
        );
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("a structural schema");
        serde_json::to_value(schema).unwrap()
    }

    #[test]
    fn spec_is_immutable_by_cel() {
        let schema = schema();
        let spec = &schema["properties"]["spec"];
        let rules = spec["x-kubernetes-validations"]
            .as_array()
            .expect("spec carries validation rules");
        assert!(
            rules
                .iter()
                .any(|r| r["rule"] == "self == oldSelf" && r["message"] == SHARD_SPEC_IMMUTABLE),
            "{rules:?}"
        );
        let required: Vec<&str> = spec["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let index = &spec["properties"]["index"];
        assert_eq!(index["format"], "int32");
        assert_eq!(
            (index["minimum"].as_f64(), index["maximum"].as_f64()),
            (Some(0.0), Some(255.0))
        );
        for field in ["pool", "poolUID", "index", "ranges"] {
            assert!(required.contains(&field), "{field} missing in {required:?}");
        }
    }

    #[test]
    fn holders_are_an_atomic_list_beside_a_copy_of_the_pool_spec() {
        let schema = schema();
        let status = &schema["properties"]["status"]["properties"];
        assert_eq!(status["holders"]["x-kubernetes-list-type"], "atomic");
        let entry = &status["holders"]["items"]["properties"];
        for field in ["uid", "owner", "ports"] {
            assert_eq!(entry[field]["type"], "string", "{field}");
        }
        for field in [
            "size",
            "allocated",
            "available",
            "holderCount",
            "poolGeneration",
        ] {
            assert_eq!(status[field]["type"], "integer", "{field}");
        }
        assert!(status["poolSpec"]["properties"]["ranges"].is_object());
    }

    #[test]
    fn installed_with_the_other_kinds() {
        assert!(
            super::super::crds()
                .iter()
                .any(|crd| crd.spec.names.kind == "PortPoolShard"),
        );
    }
}

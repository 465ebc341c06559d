//! `PortPool`: a cluster-scoped set of ports that PortAllocations draw from.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::port_range_text::{cel_first, cel_last};
use super::{PortRangeText, StaticBandSetting};

/// A cluster-wide pool of ports. Pools of different protocols never conflict; ports are unique
/// among the holders of one pool.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "portalloc.dev",
    version = "v1alpha1",
    kind = "PortPool",
    plural = "portpools",
    shortname = "ppool",
    doc = "A cluster-scoped pool of ports that PortAllocations draw from.",
    category = "portalloc",
    status = "PortPoolStatus",
    printcolumn = r#"{"name":"Protocol","type":"string","jsonPath":".spec.protocol"}"#,
    printcolumn = r#"{"name":"Ranges","type":"string","jsonPath":".spec.ranges"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.size"}"#,
    printcolumn = r#"{"name":"Allocated","type":"integer","jsonPath":".status.allocated"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.available"}"#,
    printcolumn = r#"{"name":"Holders","type":"integer","priority":1,"jsonPath":".status.holderCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(exclusions_inside_ranges()).message("every exclusion must lie inside one of spec.ranges").field_path(".exclude"))]
#[x_kube(validation = Rule::new(ranges_disjoint()).message("spec.ranges must not overlap: list each port once").field_path(".ranges"))]
pub struct PortPoolSpec {
    /// Inclusive port ranges ("A-B") or single ports ("A") in 1..65535; they must not overlap.
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub ranges: Vec<PortRangeText>,

    /// Ports or ranges inside `ranges` that are never handed out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub exclude: Vec<PortRangeText>,

    /// The protocol these ports are for. Pools of different protocols never conflict.
    #[serde(default)]
    pub protocol: Protocol,

    /// Ports at the low end kept for requested ports (Kubernetes KEP-3668): `Auto`, `None`, or a
    /// count. Automatic allocation uses them only when the rest of the pool is full.
    #[serde(default)]
    pub static_band: StaticBandSetting,
}

fn exclusions_inside_ranges() -> String {
    let (ef, el, rf, rl) = (cel_first("e"), cel_last("e"), cel_first("r"), cel_last("r"));
    format!(
        "!has(self.exclude) || self.exclude.all(e, self.ranges.exists(r, {ef} >= {rf} && {el} <= {rl}))"
    )
}

fn ranges_disjoint() -> String {
    let (af, al, bf, bl) = (cel_first("a"), cel_last("a"), cel_first("b"), cel_last("b"));
    format!("self.ranges.all(a, self.ranges.all(b, a == b || {al} < {bf} || {bl} < {af}))")
}

/// The transport protocol of a pool's ports.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Protocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        })
    }
}

/// Written only by the allocator, through the status subresource, with the resourceVersion it
/// read: that compare-and-swap is what keeps ports unique under concurrent clients.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(FORMAT_KEPT_RULE).message(FORMAT_KEPT_MESSAGE))]
#[x_kube(validation = Rule::new(FROZEN_WHILE_MIGRATING_RULE).message(FROZEN_WHILE_MIGRATING_MESSAGE))]
pub struct PortPoolStatus {
    /// How the holders are recorded: absent for the one-object record (`holders` below),
    /// `Migrating` while `kubectl portalloc pool upgrade` copies them into PortPoolShards,
    /// `Sharded` once the shards are the record and `holders` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<RecordFormat>,
    /// Ports in the pool after exclusions.
    #[serde(default)]
    pub size: i32,
    /// Ports held by some PortAllocation.
    #[serde(default)]
    pub allocated: i32,
    /// Ports free to allocate.
    #[serde(default)]
    pub available: i32,
    /// How many PortAllocations hold ports.
    #[serde(default)]
    pub holder_count: i32,
    /// Who holds which ports. This is the authoritative record: a port is taken exactly when
    /// some holder lists it here. An atomic list: it is only ever replaced whole (with the
    /// resourceVersion read), and a keyed list would make the server track every holder in
    /// managedFields, doubling the stored object and the work of every write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub holders: Vec<PoolHolder>,
}

/// Where a pool's holders are recorded (docs/record-at-scale.md).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordFormat {
    /// `holders` is frozen while its entries are copied into shards.
    Migrating,
    /// One PortPoolShard per 256-port window holds the entries; `holders` is empty.
    Sharded,
}

// Transition rules (they see `oldSelf`, so they bind updates only): a client that does not know
// `format` drops it when it writes the status back, and must be refused rather than write a
// one-object record beside the shards. `holders` is omitted when empty, hence the `has` guards.
pub const FORMAT_KEPT_RULE: &str = "!has(oldSelf.format) || (has(self.format) && (self.format == oldSelf.format || (oldSelf.format == 'Migrating' && self.format == 'Sharded')))";
pub const FORMAT_KEPT_MESSAGE: &str = "this PortPool records its holders in PortPoolShards; this client is too old to write it: upgrade kubectl-portalloc (kubectl krew upgrade portalloc)";
pub const FROZEN_WHILE_MIGRATING_RULE: &str = "!has(oldSelf.format) || oldSelf.format != 'Migrating' || (has(self.format) && self.format == 'Sharded') || (has(self.holders) == has(oldSelf.holders) && (!has(self.holders) || self.holders == oldSelf.holders))";
pub const FROZEN_WHILE_MIGRATING_MESSAGE: &str = "this PortPool is being upgraded to PortPoolShards (status.format Migrating): its holders are frozen; retry in a moment, or finish it with kubectl portalloc pool upgrade";

/// One PortAllocation's holdings in a pool.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolHolder {
    /// The PortAllocation's UID: a recreated object with the same name is a new holder.
    pub uid: String,
    /// `namespace/name` of the PortAllocation, for humans.
    pub owner: String,
    /// Compact holdings: space-separated `role.port=v0,v1,...` groups, values in pod-index order.
    pub ports: String,
}

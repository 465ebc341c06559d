//! `PortPool`: a cluster-scoped set of ports that PortAllocations draw from.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
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
    printcolumn = r#"{"name":"Allocated","type":"integer","jsonPath":".status.usage.allocated","description":"Ports held, as the watcher (sync --watch) last counted them; see Counted"}"#,
    printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.usage.free","description":"Ports free to allocate, as last counted"}"#,
    printcolumn = r#"{"name":"Largest Free Run","type":"integer","jsonPath":".status.usage.largestFreeRun","description":"The longest run of contiguous free ports: the largest block the pool can still give, as last counted"}"#,
    printcolumn = r#"{"name":"Counted","type":"date","jsonPath":".status.usage.countedAt","description":"When the watcher last counted the usage (at least every 5 minutes while one runs); empty: no watcher keeps it, kubectl portalloc pool get counts on demand"}"#,
    printcolumn = r#"{"name":"Static","type":"string","priority":1,"jsonPath":".spec.staticBand"}"#,
    printcolumn = r#"{"name":"Reuse","type":"integer","priority":1,"jsonPath":".spec.nodeReuse"}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","priority":1,"jsonPath":".status.nodes","description":"With spec.followNodes: the nodes able to run the pool's pods, as last counted"}"#,
    printcolumn = r#"{"name":"Guard","type":"string","priority":1,"jsonPath":".spec.guard"}"#,
    printcolumn = r#"{"name":"Overlap","type":"string","jsonPath":".status.conditions[?(@.type==\"Overlap\")].message","description":"Ports this pool shares with another pool of its protocol, as the watcher last found them; empty: none"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(exclusions_inside_ranges()).message("every exclusion must lie inside one of spec.ranges").field_path(".exclude"))]
#[x_kube(validation = Rule::new(ranges_disjoint()).message("spec.ranges must not overlap: list each port once").field_path(".ranges"))]
#[x_kube(validation = Rule::new(GUARD_NOT_SCTP).message("spec.guard Audit or Enforce cannot be set on an SCTP pool: the kernel hands an SCTP bind to sctp_bind, which runs no cgroup bind4/bind6 hook, so the node agent can neither see nor refuse it; set guard to Off or remove it (the agent still reserves the pool's ports)").field_path(".guard"))]
#[x_kube(validation = Rule::new(FIXED_OR_FOLLOWING).message("set either nodeReuse (a fixed number of copies) or followNodes (copies that follow the nodes), not both: keep followNodes and remove nodeReuse, or the reverse").field_path(".followNodes"))]
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

    /// How many pods may hold one port at once, never two on one node (default 1: each port has
    /// one holder in the cluster). With N > 1 the pool keeps N copies of its ports, filled in
    /// order: a second copy is used only when the first cannot take a PortAllocation whole.
    /// The pod webhook declares every hostNetwork pod's ports as hostPorts, so kube-scheduler
    /// keeps two holders of a port off one node; a pod that gets its ports another way (the env
    /// ConfigMap, `resolve`) must declare them itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub node_reuse: Option<i32>,

    /// Let the pool's copies follow the nodes that can run its pods, instead of a fixed
    /// `nodeReuse`: a port gets another holder (in the next copy) only while the nodes its
    /// holders' pods could be kept off (ports per pod x other holders of each port) stay fewer
    /// than the nodes counted (`status.nodes`, kept by the watcher). Not with `nodeReuse` > 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_nodes: Option<FollowNodes>,

    /// What the node agent (`kubectl portalloc node-agent`) does with a bind of one of these
    /// ports, in the node's network namespace, from a pod that does not hold it: `Disabled` (allow),
    /// `Audit` (allow, and report it as an Event on the pod), `Enforce` (refuse it with EPERM,
    /// and report it). Processes outside pods are never touched. Absent means `Disabled`: nothing
    /// changes for a pool until its admin asks; roll out with `Audit`, then `Enforce`. The
    /// agent keeps every pool's ports out of the kernel's ephemeral choice whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardMode>,

    /// Let this pool share ports with other pools of its protocol that set it too, for pools
    /// whose pods never run on one node (disjoint node sets): each pool hands out its ports on
    /// its own, so one port may then have a holder in each. Without it on both, the API server
    /// refuses a pool whose ranges meet another's (the portalloc-pool-overlap admission policy).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_overlap: bool,
}

impl PortPoolSpec {
    /// The pool's bind guard: `spec.guard`, `Disabled` when unset.
    pub fn guard_mode(&self) -> GuardMode {
        self.guard.unwrap_or_default()
    }

    /// The guard the kernel can apply: `Off` for SCTP, whose binds no cgroup bind hook sees
    /// (see [`PortPoolSpec::check_guard`]), else `spec.guard`.
    pub fn judged_guard(&self) -> GuardMode {
        match self.protocol {
            Protocol::Sctp => GuardMode::Disabled,
            _ => self.guard_mode(),
        }
    }

    /// How many copies of its ports the pool keeps: `nodeReuse`, 1 when unset. Values the
    /// schema refuses (below 1, above 256) are read as the nearest it allows.
    pub fn reuse(&self) -> u16 {
        self.node_reuse.unwrap_or(1).clamp(1, MAX_NODE_REUSE) as u16
    }

    /// Whether a port may have more than one holder: `nodeReuse` > 1, or `followNodes`.
    pub fn may_reuse(&self) -> bool {
        self.reuse() > 1 || self.follow_nodes.is_some()
    }
}

/// `spec.followNodes`: which nodes count as able to run the pool's pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FollowNodes {
    /// The nodes that count (matchLabels, matchExpressions); absent: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
}

/// Refuses `nodeReuse` > 1 beside `followNodes` (the CEL rule; [`PortPoolSpec::port_set`]
/// repeats it client-side).
const FIXED_OR_FOLLOWING: &str =
    "!has(self.followNodes) || !has(self.nodeReuse) || self.nodeReuse <= 1";

/// Refuses a guard on an SCTP pool (the CEL rule; [`PortPoolSpec::check_guard`] repeats it).
const GUARD_NOT_SCTP: &str =
    "!has(self.guard) || self.guard == 'Off' || !has(self.protocol) || self.protocol != 'SCTP'";

/// The most copies a pool may keep: a shard's copy number is 0-255.
pub const MAX_NODE_REUSE: i32 = 256;

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

/// What the node agent does with a bind of a pool port by a pod that does not hold it, in the
/// words of Kyverno's `validationFailureAction` and Pod Security's modes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GuardMode {
    /// Binds are not looked at. Not `Off`: YAML 1.1 readers (kubectl, Argo CD, Flux) read an
    /// unquoted `Off` as the boolean false, so the word is accepted only where no YAML is read
    /// (`--guard off`) and, for objects stored before the rename, when decoding.
    #[default]
    #[serde(alias = "Off")]
    Disabled,
    /// The bind succeeds and is reported.
    Audit,
    /// The bind fails with EPERM and is reported.
    Enforce,
}

impl std::fmt::Display for GuardMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Disabled => "Disabled",
            Self::Audit => "Audit",
            Self::Enforce => "Enforce",
        })
    }
}

impl std::str::FromStr for GuardMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Disabled" | "disabled" | "Off" | "off" => Ok(Self::Disabled),
            "Audit" | "audit" => Ok(Self::Audit),
            "Enforce" | "enforce" => Ok(Self::Enforce),
            other => Err(format!(
                "{other:?} is not a guard mode: use Disabled, Audit or Enforce"
            )),
        }
    }
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

/// What is known of the pool as a whole. The holders are not here: they live in the pool's
/// PortPoolShards (one per 256-port window), each its own compare-and-swap lock, so no
/// allocation ever writes the PortPool. `kubectl portalloc` writes the size when it creates or
/// changes the pool; the in-cluster watcher (`sync --watch`) keeps the usage, counted from the
/// shards (`kubectl portalloc pool get` counts them on demand).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortPoolStatus {
    /// Ports in the pool after exclusions, by its spec.
    #[serde(default)]
    pub size: i32,

    /// How much of the pool is held, as the watcher last counted it; absent where no watcher
    /// runs (or before its first count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<PortPoolUsage>,

    /// With `spec.followNodes`: how many nodes match its node selector (every node without
    /// one), as last counted by the watcher. Absent: never counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i32>,

    /// When `nodes` was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_counted_at: Option<Time>,

    /// `Overlap` (status True) while the pool shares ports with another pool of its protocol,
    /// as the watcher last found: its message names the other pool and the shared ports. Kept
    /// by the watcher; absent when there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The pool's usage over all its ports (both bands), as counted from its shards at `countedAt`.
/// The watcher writes it when a figure changes, at most once per count (every 10 s), and
/// again at least every 5 minutes while none does: a `countedAt` older than that means no
/// watcher is counting.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortPoolUsage {
    /// Ports held by PortAllocations.
    pub allocated: i32,
    /// Ports free to allocate (size minus allocated).
    pub free: i32,
    /// The longest run of contiguous free ports inside one band: the largest block an automatic
    /// allocation can still get.
    pub largest_free_run: i32,
    /// When these figures were counted.
    pub counted_at: Time,
}

//! `PortAllocation`: the ports one workload (a group of roles) needs from a pool.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigMapTarget, Workload};

/// Upper bound on replicas of one role: keeps one PortAllocation's holdings (and the shard writes
/// that carry them) small enough for a compare-and-swap each.
pub const MAX_REPLICAS: i32 = 1024;

/// The ports a group of roles needs. Allocated client-side by `kubectl portalloc create|sync`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "portalloc.dev",
    version = "v1alpha1",
    kind = "PortAllocation",
    plural = "portallocations",
    shortname = "palloc",
    // Lets `repair` list one pool's PortAllocations with a field selector on spec.pool.
    selectable = ".spec.pool",
    doc = "The ports a group of roles (a workload) needs from a PortPool.",
    category = "portalloc",
    namespaced,
    status = "PortAllocationStatus",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.pool"}"#,
    printcolumn = r#"{"name":"Roles","type":"string","jsonPath":".status.roles"}"#,
    printcolumn = r#"{"name":"Ports","type":"string","jsonPath":".status.ports"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.pool == oldSelf.pool").message("spec.pool is immutable: delete the PortAllocation (which releases its ports) and create it again").field_path(".pool"))]
#[x_kube(validation = Rule::new(REFERENCED_ROLES_EXIST).message(REFERENCED_ROLES_MESSAGE).field_path(".roles"))]
#[x_kube(validation = Rule::new(REFERENCED_PORTS_EXIST).message(REFERENCED_PORTS_MESSAGE).field_path(".roles"))]
pub struct PortAllocationSpec {
    /// Name of the PortPool to allocate from.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub pool: String,

    /// How many groups of this shape there are (a LeaderWorkerSet's `replicas`, a
    /// RoleBasedGroup's replicas). Every role has `replicas` pods in each group, and a pod's
    /// references resolve inside its own group. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub groups: Option<i32>,

    /// The roles of the workload, each with its replicas and ports. Role names are unique.
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub roles: Vec<Role>,

    /// The ConfigMap holding one env file per pod (`<pod-name>.env`), kept up to date by
    /// `create`, `sync` and `sync --watch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapTarget>,
}

/// One role of a workload: `replicas` pods that share RoleScoped ports and each get their own
/// PodScoped ports.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(env_names_unique()).message("env names must be unique within a role, across its ports and references"))]
pub struct Role {
    /// A DNS-1035 label, e.g. `prefill`.
    #[schemars(length(min = 1, max = 63), regex(pattern = super::DNS_LABEL))]
    pub name: String,

    /// How many pods this role has (in each group); pods are addressed by index
    /// 0..replicas-1.
    #[schemars(range(min = 0, max = 1024))]
    pub replicas: i32,

    /// The workload running this role's pods, which names them and gives them addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,

    /// Ports this role needs. Port names are unique within the role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub ports: Vec<PortRequest>,

    /// Environment variables resolved from other roles' ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["env".into()]))]
    pub references: Vec<PortReference>,
}

/// The ports' env names are read once into a list of strings, then compared there: the API
/// server evaluates this rule on every write of a PortAllocation, its status writes included,
/// and reading `q.env` inside a nested loop over the ports cost 7 % of its CPU while
/// `sync --all` wrote statuses (docs/performance.md, "Status writes the API server checks for
/// less").
fn env_names_unique() -> &'static str {
    "!has(self.ports) || [self.ports.map(p, p.env)].all(envs, \
     envs.all(e, envs.exists_one(f, f == e)) && \
     (!has(self.references) || self.references.all(r, !(r.env in envs))))"
}

/// One named port of a role.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.port) || self.scope == 'RoleScoped'").message("a requested port must be RoleScoped: one fixed port cannot be unique per pod").field_path(".port"))]
pub struct PortRequest {
    /// A DNS-1035 label, unique within the role, e.g. `http`.
    #[schemars(length(min = 1, max = 63), regex(pattern = super::DNS_LABEL))]
    pub name: String,

    /// `PodScoped` (one port per pod index) or `RoleScoped` (one port shared by every pod of the
    /// role; on hostNetwork such pods need anti-affinity so two never share a node).
    #[serde(default)]
    pub scope: PortScope,

    /// The environment variable that carries this port, e.g. `PREFILL_PORT`.
    #[schemars(length(min = 1, max = 128), regex(pattern = super::ENV_NAME))]
    pub env: String,

    /// A requested (fixed) port. Omit it to have one chosen automatically. For a block, its
    /// first port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,

    /// A contiguous block of this many ports (e.g. Ray's worker ports, NIXL's side channel per
    /// rank); `env` carries the first. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub count: Option<i32>,

    /// For a block: the environment variable that carries its last port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = super::ENV_NAME))]
    pub last_env: Option<String>,

    /// For a block: the environment variable that carries it as `first-last`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = super::ENV_NAME))]
    pub range_env: Option<String>,
}

// Its doc is the CRD's description of `scope` (crds/): the planner's own copy of it is
// `core::Scope`, which `api::validate` converts it into.
/// Whether a port is shared by the role's pods or unique to each pod.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PortScope {
    /// One port for every pod of the role.
    RoleScoped,
    /// One port per pod index.
    #[default]
    PodScoped,
}

impl std::fmt::Display for PortScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::RoleScoped => "RoleScoped",
            Self::PodScoped => "PodScoped",
        })
    }
}

/// An environment variable whose value comes from another role's ports or pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.format) || !self.from.contains('.')").message("format applies to pod references (role, role[i], role[*]); a port reference (role.port) is the port itself").field_path(".format"))]
pub struct PortReference {
    /// The environment variable to set, e.g. `ROUTER_PORT`.
    #[schemars(length(min = 1, max = 128), regex(pattern = super::ENV_NAME))]
    pub env: String,

    /// Ports: `role.port` (a RoleScoped port, or a PodScoped port of a one-replica role),
    /// `role.port[i]` (pod i's port) or `role.port[*]` (all pods' ports, joined).
    /// Pods: `role`, `role[i]` or `role[*]`, each written with `format`.
    /// With groups, pods and ports are those of the referencing pod's own group.
    #[schemars(length(min = 1, max = 140))]
    #[x_kube(validation = Rule::new(REFERENCE_SYNTAX_RULE).message("must be role.port, role.port[i], role.port[*], role, role[i] or role[*], e.g. prefill.bootstrap[*]"))]
    pub from: String,

    /// How each pod of a pod reference is written: `{address}`, `{pod}`, `{index}`,
    /// `{<port>}` (that pod's port; a block's first), `{<port>.last}`, `{<port>.range}`.
    /// Default `{address}`. E.g. `--prefill http://{address}:{http} {bootstrap}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub format: Option<String>,

    /// What goes between the values of a `[*]` reference. Default `,`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub join: Option<String>,
}

// Apply-time checks of what references name, so `kubectl apply --dry-run=server` and GitOps
// diffs catch a reference to a missing role or port before the plugin sees the object. A
// reference's role is the leading label of `from` (`find('^[-a-z0-9]+')`), its port the label
// after the dot. Messages list the offending references, so the one line says what to fix.

// A reference's role is the leading label of `from` (`find('^[-a-z0-9]+')`), its port the label
// after the dot. CRD rules have no `cel.bind`: a one-element list `[x].all(name, ...)` computes a
// value once, so the role walk inside a reference does no regex (the API server's cost budget
// refuses the rule otherwise).
const REFERENCED_ROLES_EXIST: &str = "[self.roles.map(t, t.name)].all(names, \
     self.roles.all(r, !has(r.references) || \
       r.references.all(f, f.from.find('^[-a-z0-9]+') in names)))";

const REFERENCED_ROLES_MESSAGE: &str = "every references[].from must name a role of this PortAllocation (the part before the dot or bracket)";

const REFERENCED_PORTS_EXIST: &str = "self.roles.all(r, !has(r.references) || r.references.all(f, \
     !f.from.contains('.') || [f.from.find('[.][-a-z0-9]+').substring(1)].all(port, \
       self.roles.all(t, !f.from.startsWith(t.name + '.') || \
         (has(t.ports) && t.ports.exists(p, p.name == port))))))";

const REFERENCED_PORTS_MESSAGE: &str = "a port reference (role.port) must name a port of that role: the part after the dot is one of its ports[].name";

const REFERENCE_SYNTAX_RULE: &str = r"self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?([.][a-z]([-a-z0-9]*[a-z0-9])?)?(\\[([0-9]+|\\*)\\])?$')";

/// Observed state, written by the allocator after the shard writes that commit the ports.
///
/// The API server fills in a default status (generation 0 observed, phase Pending) for an object
/// nobody has synced yet, since it stores none: health checks that follow kstatus (Flux,
/// `kubectl wait`) then read it as in progress rather than current.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("default" = {"observedGeneration": 0, "phase": "Pending"}))]
pub struct PortAllocationStatus {
    /// The spec generation these assignments satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Pending` (not yet allocated), `Allocated`, or `Failed` (see conditions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// UID of the pool object the ports were committed to. If the pool is deleted and recreated,
    /// a different UID tells `repair` that the pool lost these holdings and they must be restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "poolUID")]
    pub pool_uid: Option<String>,

    /// The PortPoolShards where this object may have entries, written before any entry outside
    /// them, so a sync killed half-way finds every part again (docs/record-at-scale.md): the
    /// window for the pool's first copy, `copy * 256 + window` for a copy beyond it (a pool with
    /// `nodeReuse`, whose ports other pods hold on other nodes too). Atomic, as `assignments`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub shards: Vec<i32>,

    /// The roles with their replicas, e.g. `router:1,prefill:2`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<String>,

    /// `allocated/desired` port count, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<String>,

    /// The allocated ports, per role and port name, values in pod-index order. An atomic list:
    /// only the allocator writes it, always whole, and a keyed list would make the server track
    /// every field of every assignment in managedFields, which every status write then decodes,
    /// checks and writes again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub assignments: Vec<PortAssignment>,

    /// `Allocated` with a reason such as `PoolFull`, `PortHeld`, `PoolNotFound`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

impl PortAllocationStatus {
    /// The copy of its pool these ports are in: the lowest copy `shards` names (a value is
    /// `copy * 256 + window`), 0 when it names none. Beyond 0 the same ports are held by other
    /// pods on other nodes (`nodeReuse`), so the pods must declare them as hostPorts.
    pub fn pool_copy(&self) -> u16 {
        self.shards
            .iter()
            .filter_map(|&value| u16::try_from(value).ok())
            .map(|value| value / 256)
            .min()
            .unwrap_or(0)
    }
}

impl PortAllocationStatus {
    /// The copy of its pool holding value `value` of `role.port` (its index in `values`):
    /// what `copies` says, else the one copy of [`pool_copy`](Self::pool_copy).
    pub fn copy_of(&self, role: &str, port: &str, value: usize) -> u16 {
        self.assignments
            .iter()
            .find(|a| a.role == role && a.port == port)
            .and_then(|a| a.copies.get(value))
            .and_then(|&copy| u16::try_from(copy).ok())
            .unwrap_or_else(|| self.pool_copy())
    }

    /// The highest copy any of its ports is in.
    pub fn highest_copy(&self) -> u16 {
        let spread = self.assignments.iter().flat_map(|a| &a.copies);
        spread
            .filter_map(|&copy| u16::try_from(copy).ok())
            .chain([self.pool_copy()])
            .max()
            .unwrap_or(0)
    }
}

impl PortAllocation {
    /// The copy of its pool its ports are in (see [`PortAllocationStatus::pool_copy`]).
    pub fn pool_copy(&self) -> u16 {
        self.status
            .as_ref()
            .map_or(0, PortAllocationStatus::pool_copy)
    }

    /// For ports in a copy beyond the first: the one-line warning for whoever hands them to a
    /// pod other than through the pod webhook (`resolve`, the env files).
    pub fn reused_ports_warning(&self) -> Option<String> {
        let copy = self
            .status
            .as_ref()
            .map_or(0, PortAllocationStatus::highest_copy);
        (copy > 0).then(|| {
            format!(
                "the ports of PortAllocation {}/{} are in copy {copy} of pool {}: pods on other \
                 nodes hold the same ports, so each pod must declare its ports as hostPorts \
                 (containers[].ports) or be admitted by the portalloc pod webhook, which declares them",
                self.metadata.namespace.as_deref().unwrap_or_default(),
                self.metadata.name.as_deref().unwrap_or_default(),
                self.spec.pool
            )
        })
    }
}

/// Lifecycle of a PortAllocation.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Allocated,
    Failed,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pending => "Pending",
            Self::Allocated => "Allocated",
            Self::Failed => "Failed",
        })
    }
}

/// The ports allocated to one (role, port) pair.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortAssignment {
    pub role: String,
    pub port: String,
    pub scope: PortScope,
    pub env: String,
    /// One value per group for RoleScoped, one per pod for PodScoped (pod `g * replicas + i`
    /// is pod i of group g). For a block, its first port.
    pub values: Vec<i32>,
    /// Ports per block, when more than one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
    /// With groups: how many values each group has (pods per group for PodScoped, 1 for
    /// RoleScoped), so value `f` belongs to group `f / groupSize`. Omitted without groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<i32>,
    /// When the workload's pods are spread over copies of a pool with reuse (it is bigger than
    /// one copy): the copy each value is in, in the order of `values`. Omitted when every
    /// value is in the copy `shards` names first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    /// What only the allocator writes, whole, is atomic, so the server tracks no field of it
    /// in managedFields; the spec, which people apply, keeps its keyed lists.
    #[test]
    fn the_status_lists_are_atomic_and_the_spec_lists_keyed() {
        let crd = PortAllocation::crd();
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("a structural schema");
        let schema = serde_json::to_value(schema).unwrap();
        let status = &schema["properties"]["status"]["properties"];
        for list in ["assignments", "shards"] {
            assert_eq!(status[list]["x-kubernetes-list-type"], "atomic", "{list}");
        }
        assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
        let roles = &schema["properties"]["spec"]["properties"]["roles"];
        assert_eq!(roles["x-kubernetes-list-type"], "map");
    }
}

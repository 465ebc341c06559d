//! How a role's pods are named and reached: the workload that runs them and the Service that
//! gives them DNS names. Env files are named after pods, and references that carry addresses
//! are formatted from these names.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The workload that runs a role's pods. Without it, pods are taken to be named
/// `<role>-<index>` (a StatefulSet named after the role) and have no address.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(self.kind == 'LeaderWorkerSet') == has(self.member)").message("member (Leader or Workers) is required for a LeaderWorkerSet and allowed only there").field_path(".member"))]
pub struct Workload {
    /// `StatefulSet` (pods `<name>-<i>`), `LeaderWorkerSet` (leader `<name>-<g>`, workers
    /// `<name>-<g>-<w>`) or `Deployment` (random pod names: its pods share one env file).
    pub kind: WorkloadKind,

    /// The StatefulSet, LeaderWorkerSet or Deployment name.
    #[schemars(length(min = 1, max = 63), regex(pattern = super::DNS_LABEL))]
    pub name: String,

    /// The headless Service that gives the pods DNS names: a StatefulSet's `serviceName`; for a
    /// LeaderWorkerSet it defaults to the LeaderWorkerSet's name (the Service LWS creates). Pods
    /// are then reached at `<pod>.<service>.<namespace>.svc`; a Deployment's pods at
    /// `<service>.<namespace>.svc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = super::DNS_LABEL))]
    pub service: Option<String>,

    /// LeaderWorkerSet only: whether this role is each group's leader (one pod, worker index 0)
    /// or its workers (`size - 1` pods, worker indices 1..size-1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<LwsMember>,
}

/// The kinds of workload whose pod names we know.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    StatefulSet,
    LeaderWorkerSet,
    Deployment,
}

/// The part of a LeaderWorkerSet group a role stands for.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LwsMember {
    Leader,
    Workers,
}

/// The ConfigMap that holds one env file per pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapTarget {
    /// The ConfigMap's name, in the PortAllocation's namespace. `create`, `sync` and
    /// `sync --watch` write it (server-side apply, owned by the PortAllocation) whenever the
    /// assignments change.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
}

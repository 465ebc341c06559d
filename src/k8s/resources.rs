//! The resources this plugin reads and writes, and how a request on one is named in errors.

use super::error::Target;

/// A resource as the API server names it in RBAC and errors, and the kind of its objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    pub plural: &'static str,
    pub kind: &'static str,
}

pub const POOLS: Resource = Resource {
    plural: "portpools.portalloc.dev",
    kind: "PortPool",
};
pub const POOL_STATUS: Resource = Resource {
    plural: "portpools.portalloc.dev/status",
    kind: "PortPool",
};
pub const ALLOCATIONS: Resource = Resource {
    plural: "portallocations.portalloc.dev",
    kind: "PortAllocation",
};
pub const ALLOCATION_STATUS: Resource = Resource {
    plural: "portallocations.portalloc.dev/status",
    kind: "PortAllocation",
};
pub const SHARDS: Resource = Resource {
    plural: "portpoolshards.portalloc.dev",
    kind: "PortPoolShard",
};
pub const SHARD_STATUS: Resource = Resource {
    plural: "portpoolshards.portalloc.dev/status",
    kind: "PortPoolShard",
};
pub const CRDS: Resource = Resource {
    plural: "customresourcedefinitions.apiextensions.k8s.io",
    kind: "CustomResourceDefinition",
};
pub const POLICIES: Resource = Resource {
    plural: "validatingadmissionpolicies.admissionregistration.k8s.io",
    kind: "ValidatingAdmissionPolicy",
};
pub const POLICY_BINDINGS: Resource = Resource {
    plural: "validatingadmissionpolicybindings.admissionregistration.k8s.io",
    kind: "ValidatingAdmissionPolicyBinding",
};
pub const CONFIGMAPS: Resource = Resource {
    plural: "configmaps",
    kind: "ConfigMap",
};
pub const SERVICES: Resource = Resource {
    plural: "services",
    kind: "Service",
};
pub const LEASES: Resource = Resource {
    plural: "leases.coordination.k8s.io",
    kind: "Lease",
};
pub const NODES: Resource = Resource {
    plural: "nodes",
    kind: "Node",
};
pub const NAMESPACES: Resource = Resource {
    plural: "namespaces",
    kind: "Namespace",
};

impl Resource {
    /// `verb` on one object.
    pub fn on(self, verb: &'static str, name: &str, namespace: Option<&str>) -> Target {
        Target {
            verb,
            resource: self.plural.to_string(),
            kind: self.kind,
            name: Some(name.to_string()),
            namespace: namespace.map(str::to_string),
        }
    }

    /// `verb` on the collection, in `namespace` or cluster-wide.
    pub fn all(self, verb: &'static str, namespace: Option<&str>) -> Target {
        Target {
            verb,
            resource: self.plural.to_string(),
            kind: self.kind,
            name: None,
            namespace: namespace.map(str::to_string),
        }
    }
}

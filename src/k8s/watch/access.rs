//! What the watcher must be allowed to do, asked of the API server at start
//! (SelfSubjectAccessReview), so a missing binding is one clear error rather than retries
//! forever; and what it may do but need not (the pools' usage summary).

use crate::k8s::error::error_chain;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::Api;

use crate::k8s::error::{ApiErrorKind, KubeError, Target};
use crate::k8s::leader::LeaseRef;

const PORTALLOC: &str = crate::api::GROUP;

/// What the watcher needs to be allowed: (verb, API group, resource, subresource).
const NEEDED: [(&str, &str, &str, &str); 14] = [
    ("list", PORTALLOC, "portallocations", ""),
    ("watch", PORTALLOC, "portallocations", ""),
    ("update", PORTALLOC, "portallocations", "status"),
    ("get", PORTALLOC, "portpools", ""),
    ("list", PORTALLOC, "portpools", ""),
    // Pools' shards are read, created when missing and written; the repair pass deletes the
    // shards of an earlier pool of the same name.
    ("get", PORTALLOC, "portpoolshards", ""),
    ("list", PORTALLOC, "portpoolshards", ""),
    ("create", PORTALLOC, "portpoolshards", ""),
    ("delete", PORTALLOC, "portpoolshards", ""),
    ("update", PORTALLOC, "portpoolshards", "status"),
    // The tenancy policy lets a holder entry change only for those who may update
    // PortAllocations in its namespace.
    ("update", PORTALLOC, "portallocations", ""),
    // The ConfigMaps named by spec.configMap: read to compare, then server-side applied (an
    // apply that creates the object needs create as well as patch).
    ("get", "", "configmaps", ""),
    ("create", "", "configmaps", ""),
    ("patch", "", "configmaps", ""),
];

/// Ask the API server (SelfSubjectAccessReview) whether this identity may do everything the
/// watcher does, so a missing binding is one clear error at start, not retries forever.
pub async fn check_access(client: &Client, namespace: Option<&str>) -> Result<(), KubeError> {
    for (verb, group, resource, subresource) in NEEDED {
        if !allowed(client, verb, group, resource, subresource, namespace).await? {
            let qualified = match group {
                "" => resource.to_string(),
                group => format!("{resource}.{group}"),
            };
            let plural = match subresource {
                "" => qualified,
                sub => format!("{qualified}/{sub}"),
            };
            let kind = match resource {
                "configmaps" => "ConfigMap",
                "portpools" => "PortPool",
                "portpoolshards" => "PortPoolShard",
                _ => "PortAllocation",
            };
            // Pools and shards are cluster-wide: refused for every namespace alike.
            let namespaced = ["portallocations", "configmaps"].contains(&resource);
            return Err(KubeError::new(
                ApiErrorKind::Forbidden,
                Target {
                    verb,
                    resource: plural,
                    kind,
                    name: None,
                    namespace: namespace.filter(|_| namespaced).map(str::to_string),
                },
                "the watcher needs it (see deploy/watcher.yaml for its ClusterRole)",
            ));
        }
    }
    Ok(())
}

/// Whether this identity may do `verb` on `resource/subresource` (in `namespace`, or everywhere),
/// by the API server's answer to a SelfSubjectAccessReview.
async fn allowed(
    client: &Client,
    verb: &str,
    group: &str,
    resource: &str,
    subresource: &str,
    namespace: Option<&str>,
) -> Result<bool, KubeError> {
    allowed_on(
        client,
        (verb, group, resource, subresource),
        None,
        namespace,
    )
    .await
}

/// [`allowed`], on the object `name` when given (rights limited by `resourceNames` are granted
/// only for a request that names the object).
async fn allowed_on(
    client: &Client,
    (verb, group, resource, subresource): (&str, &str, &str, &str),
    name: Option<&str>,
    namespace: Option<&str>,
) -> Result<bool, KubeError> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                subresource: (!subresource.is_empty()).then(|| subresource.to_string()),
                verb: Some(verb.to_string()),
                namespace: namespace.map(str::to_string),
                name: name.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let target = crate::k8s::resources::Resource {
        plural: "selfsubjectaccessreviews.authorization.k8s.io",
        kind: "SelfSubjectAccessReview",
    }
    .all("create", None);
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&crate::k8s::client::write_params(), &review)
        .await
        .map_err(|e| KubeError::from_kube(e, target))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Whether this identity may write pools' status, for their usage summary. Not required (the
/// watcher allocates without it, as an allocating user may run it): said once when missing.
pub(super) async fn may_keep_usage(client: &Client) -> bool {
    let (verb, resource, subresource) = ("update", "portpools", "status");
    match allowed(client, verb, PORTALLOC, resource, subresource, None).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::info!(
                "not keeping the PortPools' usage summary (status.usage): this identity may not \
                 update portpools/status (deploy/watcher.yaml's ClusterRole may)"
            );
            false
        }
        Err(e) => {
            tracing::warn!(
                "not keeping the PortPools' usage summary: {}",
                error_chain(&e)
            );
            false
        }
    }
}

/// With `--leader-elect`: whether this identity may read, create and write the Lease it
/// competes for, asked at start so a missing Role is one clear error, not a replica that
/// never leads and says so only in its log.
pub async fn check_leader_access(client: &Client, lease: &LeaseRef) -> Result<(), KubeError> {
    let namespace = Some(lease.namespace.as_str());
    // A create names no object (its rights cannot be limited by name); get and update do.
    for (verb, name) in [
        ("get", Some(lease.name.as_str())),
        ("create", None),
        ("update", Some(lease.name.as_str())),
    ] {
        let access = (verb, "coordination.k8s.io", "leases", "");
        if !allowed_on(client, access, name, namespace).await? {
            return Err(KubeError::new(
                ApiErrorKind::Forbidden,
                Target {
                    verb,
                    resource: "leases.coordination.k8s.io".into(),
                    kind: "Lease",
                    name: Some(lease.name.clone()),
                    namespace: Some(lease.namespace.clone()),
                },
                format!(
                    "--leader-elect needs it, to lead through Lease {}/{} (the chart's Role \
                     portalloc-watcher-leader grants it; or set --leader-election-namespace to \
                     a namespace where this identity has it)",
                    lease.namespace, lease.name
                ),
            ));
        }
    }
    Ok(())
}

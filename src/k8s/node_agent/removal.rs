//! Taking the agent off a node: the bind guard detached (its pins removed) and the agent's
//! reserved ports given back, others' entries kept. `node-agent --detach` does it by hand; a
//! running agent does it on SIGTERM only when its own DaemonSet is gone or being deleted (the
//! chart uninstalled, `nodeAgent.enabled=false`), never for a rollout or a pod deletion, where
//! the next agent takes the guard over.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::{NodeAgentError, NodeAgentOptions};
use crate::node::bind_guard::BindGuard;
use crate::node::cgroups::{self, CgroupDriver};
use crate::node::guard_pins;
use crate::node::reserved_ports::ReservedPorts;

/// How long each read that decides between "uninstalled" and "restarting" may take: the pod's
/// termination grace period must leave time for the removal itself.
const DECIDE_WITHIN: Duration = Duration::from_secs(5);

/// What the agent on one node puts there, and where.
pub struct NodeFootprint<'a> {
    pub cgroup_root: &'a Path,
    /// `None`: whichever kubelet's tree shows.
    pub cgroup_driver: Option<CgroupDriver>,
    pub bpf_dir: &'a Path,
    pub reserved_ports_file: &'a Path,
    pub state_dir: &'a Path,
}

/// Detach the guard and release the agent's reserved ports; what was done, a line each.
pub fn remove_from_node(node: &NodeFootprint<'_>) -> Result<Vec<String>, String> {
    let root = node.cgroup_root;
    let driver = node
        .cgroup_driver
        .unwrap_or_else(|| CgroupDriver::detect(root));
    let kubepods = root.join(driver.kubepods());
    let pins = guard_pins::pin_dir(node.bpf_dir, &kubepods);
    let guard = if !cgroups::is_cgroup2(root) || !kubepods.is_dir() {
        format!(
            "no guard to detach: {} is not a cgroup v2 kubepods directory",
            kubepods.display()
        )
    } else {
        let detached = BindGuard::detach(&kubepods, &pins).map_err(|e| {
            format!(
                "detaching the bind guard from {} (pinned in {}): {e} (detaching needs root \
                 with CAP_NET_ADMIN and CAP_BPF, and the bpffs of --bpf-dir mounted)",
                kubepods.display(),
                pins.display()
            )
        })?;
        format!(
            "detached {detached} bind guard program{} from {}",
            if detached == 1 { "" } else { "s" },
            kubepods.display()
        )
    };
    let reserved = ReservedPorts::at(node.reserved_ports_file, node.state_dir);
    let released = reserved.release().map_err(|e| e.to_string())?;
    Ok(vec![
        guard,
        format!(
            "took {} port{} the agent had reserved out of {}; entries others put there stay",
            released.len(),
            if released.len() == 1 { "" } else { "s" },
            node.reserved_ports_file.display()
        ),
    ])
}

/// The DaemonSet that runs this agent's pod, as found when it started: read then, because on
/// an uninstall the pod may be gone (collected with its DaemonSet) by the time of SIGTERM.
#[derive(Clone, Debug)]
pub struct OwnDaemonSet {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The DaemonSet that controls the pod `pod` in `namespace`, read once to know the agent may
/// (a refusal at SIGTERM then means its rights were taken away); `Err`: why the agent cannot
/// tell, so it keeps the guard on SIGTERM.
pub async fn own_daemonset(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
) -> Result<OwnDaemonSet, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let read = tokio::time::timeout(DECIDE_WITHIN, pods.get_opt(pod)).await;
    let found = match read {
        Err(_) => return Err(format!("reading its pod {namespace}/{pod} timed out")),
        Ok(Err(e)) => return Err(format!("reading its pod {namespace}/{pod}: {e}")),
        Ok(Ok(None)) => return Err(format!("its pod {namespace}/{pod} does not exist")),
        Ok(Ok(Some(found))) => found,
    };
    let owners = found.metadata.owner_references.unwrap_or_default();
    let owner = owners
        .into_iter()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true))
        .ok_or_else(|| format!("its pod {namespace}/{pod} is not run by a DaemonSet"))?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let what = format!("its DaemonSet {namespace}/{}", owner.name);
    match tokio::time::timeout(DECIDE_WITHIN, daemonsets.get_opt(&owner.name)).await {
        Err(_) => return Err(format!("reading {what} timed out")),
        Ok(Err(e)) => {
            return Err(format!(
                "reading {what}: {e} (the agent needs get on daemonsets in its namespace, as \
                 the chart's Role grants)"
            ));
        }
        Ok(Ok(_)) => {}
    }
    Ok(OwnDaemonSet {
        namespace: namespace.to_string(),
        name: owner.name,
        uid: owner.uid,
    })
}

/// Why the agent is being removed from the node (its DaemonSet gone or being deleted), or
/// `None` for a restart, a rollout or a pod deletion, and a read that fails or is slow: in
/// doubt the guard stays, and `node-agent --detach` removes it by hand.
pub async fn removed_because(client: &kube::Client, own: &OwnDaemonSet) -> Option<String> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &own.namespace);
    let what = format!("its DaemonSet {}/{}", own.namespace, own.name);
    match tokio::time::timeout(DECIDE_WITHIN, api.get_opt(&own.name)).await {
        Ok(Ok(None)) => Some(format!("{what} is gone")),
        Ok(Ok(Some(ds))) if ds.metadata.uid.as_deref() != Some(own.uid.as_str()) => {
            tracing::info!("{what} was made anew; its agent takes the guard over");
            None
        }
        Ok(Ok(Some(ds))) if ds.metadata.deletion_timestamp.is_some() => {
            Some(format!("{what} is being deleted"))
        }
        Ok(Ok(Some(_))) => None,
        // An uninstall deletes the agent's ServiceAccount and RBAC with its DaemonSet, often
        // before the pod gets SIGTERM: a refused read that worked at start says as much.
        Ok(Err(kube::Error::Api(status))) if status.code == 401 || status.code == 403 => {
            Some(format!(
                "reading {what} is refused ({}): its ServiceAccount or rights were removed, as an uninstall does",
                status.message
            ))
        }
        Ok(Err(e)) => {
            tracing::warn!("reading {what}: {e}; the guard stays (node-agent --detach removes it)");
            None
        }
        Err(_) => {
            tracing::warn!(
                "reading {what} timed out; the guard stays (node-agent --detach removes it)"
            );
            None
        }
    }
}

/// The agent's DaemonSet, if it can tell an uninstall from a restart (said once if not).
pub async fn own_daemonset_of(
    client: &kube::Client,
    options: &NodeAgentOptions,
) -> Option<OwnDaemonSet> {
    let (Some(pod), Some(namespace)) = (&options.pod_name, &options.lease_namespace) else {
        return None;
    };
    match own_daemonset(client, namespace, pod).await {
        Ok(own) => Some(own),
        Err(why) => {
            tracing::warn!(
                node = %options.node_name,
                "{why}: on SIGTERM the guard and the reserved ports stay (an uninstall leaves them; `node-agent --detach` removes them)"
            );
            None
        }
    }
}

/// After SIGTERM: everything kept, or, when the agent's DaemonSet is gone, removed.
pub async fn on_stop(
    client: &kube::Client,
    own: Option<&OwnDaemonSet>,
    options: &NodeAgentOptions,
) -> Result<(), NodeAgentError> {
    let node = &options.node_name;
    let removed = match own {
        Some(own) => removed_because(client, own).await,
        None => None,
    };
    let Some(why) = removed else {
        tracing::info!(node = %node, "node agent stopped; the guard stays attached");
        return Ok(());
    };
    tracing::info!(node = %node, "{why}: taking the guard and the agent's reserved ports off the node");
    match remove_from_node(&footprint(options)) {
        Ok(lines) => {
            for line in lines {
                tracing::info!(node = %node, "{line}");
            }
            Ok(())
        }
        Err(reason) => Err(NodeAgentError::Removal {
            node: node.clone(),
            reason,
        }),
    }
}

/// The footprint of an agent run with `options`.
fn footprint(options: &NodeAgentOptions) -> NodeFootprint<'_> {
    NodeFootprint {
        cgroup_root: &options.cgroup_root,
        cgroup_driver: options.cgroup_driver,
        bpf_dir: &options.bpf_dir,
        reserved_ports_file: &options.reserved_ports_file,
        state_dir: &options.state_dir,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_removal_says_how_to_finish_it_by_hand() {
        let error = NodeAgentError::Removal {
            node: "gpu-1".into(),
            reason: "cannot detach the guard: Permission denied".into(),
        };
        assert_eq!(
            error.to_string(),
            "cannot detach the guard: Permission denied; run `kubectl portalloc node-agent \
             --detach` on node gpu-1"
        );
    }
}

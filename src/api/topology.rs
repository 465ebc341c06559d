//! `topology.yaml`, written beside the env files in a PortAllocation's ConfigMap: every role,
//! and for each of its pods the name, group, DNS address and ports (blocks as ranges). Mounted
//! as a volume, kubelet refreshes it after every sync (a scale included), so a router that
//! re-reads it on change needs no restart.

use std::collections::BTreeMap;

use kube::ResourceExt;
use serde::Serialize;

use super::{PortAllocation, ResolveError};

/// Its key in the ConfigMap.
pub const TOPOLOGY_FILE: &str = "topology.yaml";

/// The file's content, as serialized.
#[derive(Serialize, Debug, PartialEq)]
pub struct Topology {
    /// `namespace/name` of the PortAllocation.
    pub allocation: String,
    pub pool: String,
    pub groups: u32,
    pub roles: Vec<TopologyRole>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct TopologyRole {
    pub name: String,
    pub replicas: u32,
    pub pods: Vec<TopologyPod>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct TopologyPod {
    /// The pod's name (a Deployment's pods: the role's name; they share one address).
    pub name: String,
    pub group: u32,
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Port name to its value: a number, or `first-last` for a block.
    pub ports: BTreeMap<String, String>,
}

impl PortAllocation {
    /// Every pod of every role with its ports, in spec and index order.
    pub fn topology(&self) -> Result<Topology, ResolveError> {
        let namespace = self.namespace().unwrap_or_default();
        let groups = self.spec.group_count();
        let mut roles = Vec::new();
        for role in &self.spec.roles {
            let mut pods = Vec::new();
            for pod in role.env_file_pods(groups) {
                let mut ports = BTreeMap::new();
                for port in &role.ports {
                    let held = self.held(role, &port.name, port.scope, &pod)?;
                    let value = match held.count {
                        1 => held.first.to_string(),
                        _ => format!("{}-{}", held.first, held.last()),
                    };
                    ports.insert(port.name.clone(), value);
                }
                pods.push(TopologyPod {
                    address: role.address(&pod, &namespace),
                    name: pod.name,
                    group: pod.group,
                    index: pod.index,
                    ports,
                });
            }
            roles.push(TopologyRole {
                name: role.name.clone(),
                replicas: role.per_group(),
                pods,
            });
        }
        Ok(Topology {
            allocation: format!("{namespace}/{}", self.name_any()),
            pool: self.spec.pool.clone(),
            groups,
            roles,
        })
    }

    /// [`PortAllocation::topology`] as the YAML file.
    pub fn topology_yaml(&self) -> Result<String, ResolveError> {
        let topology = self.topology()?;
        let body = serde_yaml::to_string(&topology).unwrap_or_default();
        Ok(format!(
            "# Written by kubectl-portalloc from PortAllocation {} at every sync.\n{body}",
            topology.allocation
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::resolve::tests::{lws, sglang_pd};

    #[test]
    fn every_pod_with_its_address_and_ports() {
        let text = sglang_pd().topology_yaml().unwrap();
        let value: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(value["allocation"], "llm/pd");
        let prefill = &value["roles"][1];
        assert_eq!(prefill["name"], "prefill");
        assert_eq!(prefill["pods"][1]["name"], "prefill-1");
        assert_eq!(prefill["pods"][1]["address"], "prefill-1.prefill.llm.svc");
        assert_eq!(prefill["pods"][1]["ports"]["http"], "30003");
        assert_eq!(prefill["pods"][1]["ports"]["bootstrap"], "30004");
        // A Deployment's pods share one entry and the Service's address.
        let router = &value["roles"][0]["pods"];
        assert_eq!(router.as_sequence().unwrap().len(), 1);
        assert_eq!(router[0]["address"], "router.llm.svc");
    }

    #[test]
    fn groups_and_blocks() {
        let topology = lws().topology().unwrap();
        assert_eq!(topology.groups, 2);
        let leader = &topology.roles[0];
        assert_eq!(leader.pods[1].name, "sglang-1");
        assert_eq!(leader.pods[1].group, 1);
        assert_eq!(leader.pods[1].ports["dist"], "30200");
        assert_eq!(leader.pods[1].ports["nixl"], "31010-31013");
        // An LWS's pods are addressed through its own headless Service.
        assert_eq!(
            leader.pods[0].address.as_deref(),
            Some("sglang-0.sglang.llm.svc")
        );
        let workers: Vec<&str> = topology.roles[1]
            .pods
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(
            workers,
            ["sglang-0-1", "sglang-0-2", "sglang-1-1", "sglang-1-2"]
        );
    }
}

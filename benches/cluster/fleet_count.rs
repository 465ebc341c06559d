//! 2r's figures, from the pods as the scheduler left them: which are bound, which are Pending
//! for their ports while a node has the GPUs they ask for, which for GPUs alone, and how many
//! nodes the other holders of a pod's ports keep it off. Pure.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

use crate::controllers::{NO_FREE_PORTS, unschedulable};
use crate::nodes::GPU;
use portalloc::api::POD_ALLOCATION_LABEL;

/// What counts about one pod.
#[derive(Clone, Debug)]
pub struct PodView {
    pub name: String,
    /// Its PortAllocation (the webhook's label).
    pub group: String,
    pub node: Option<String>,
    pub gpus: u32,
    /// The host ports it declares (what the scheduler's NodePorts filter compares).
    pub ports: BTreeSet<u16>,
    /// The scheduler's message, if it could not place the pod.
    pub refused: Option<String>,
}

impl PodView {
    pub fn of(pod: &Pod) -> PodView {
        let spec = pod.spec.as_ref();
        let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        let gpus = containers
            .iter()
            .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(GPU))
            .filter_map(|q| q.0.parse::<u32>().ok())
            .sum();
        let ports = containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| u16::try_from(p.host_port?).ok())
            .collect();
        PodView {
            name: pod.metadata.name.clone().unwrap_or_default(),
            group: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POD_ALLOCATION_LABEL))
                .cloned()
                .unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()),
            gpus,
            ports,
            refused: unschedulable(pod),
        }
    }

    /// Bound, or refused by the scheduler: decided either way.
    pub fn decided(&self) -> bool {
        self.node.is_some() || self.refused.is_some()
    }
}

/// The figures of one placed fleet.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub pods: usize,
    pub bound: usize,
    /// Refused with the scheduler's "didn't have free ports" while some node has the GPUs.
    pub pending_for_ports: Vec<String>,
    /// Refused, and no node has the GPUs they ask for.
    pub pending_for_gpus: usize,
    /// Copies of the pool holding a PortAllocation, of `reuse`.
    pub copies_in_use: usize,
    pub reuse: u16,
    /// The most nodes any pod is kept off by bound pods declaring one of its ports, that pod,
    /// and its bound k x (N-1).
    pub kept_off: (usize, String, usize),
    /// Other pods sharing a port with a pod (bound or not): the most, and the mean.
    pub sharing_max: usize,
    pub sharing_mean: f64,
    /// GPUs free on the nodes at the end, and in all.
    pub free_gpus: u32,
    /// One line per pod Pending for ports: the nodes with its GPUs, and who holds its ports there.
    pub why: Vec<String>,
    /// Ports declared by two pods on one node (the scheduler's NodePorts filter failed: must be
    /// none).
    pub collisions: Vec<String>,
}

/// Count. `copies`: each PortAllocation's copy of the pool (`status_copy`); `nodes`: each
/// node's GPUs.
pub fn count(
    pods: &[PodView],
    copies: &BTreeMap<String, u16>,
    nodes: &BTreeMap<String, u32>,
    reuse: u16,
) -> Figures {
    let mut free = nodes.clone();
    for pod in pods {
        if let Some(left) = pod.node.as_ref().and_then(|n| free.get_mut(n)) {
            *left = left.saturating_sub(pod.gpus);
        }
    }
    let mut holders: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    let mut on_node: BTreeMap<(&str, u16), Vec<&str>> = BTreeMap::new();
    for (i, pod) in pods.iter().enumerate() {
        for &port in &pod.ports {
            holders.entry(port).or_default().push(i);
            if let Some(node) = &pod.node {
                on_node.entry((node, port)).or_default().push(&pod.name);
            }
        }
    }
    // The other pods sharing a port with pod i.
    let sharing = |i: usize| -> BTreeSet<usize> {
        pods[i]
            .ports
            .iter()
            .flat_map(|p| holders[p].iter().copied())
            .filter(|&j| j != i)
            .collect()
    };
    let copy_of = |pod: &PodView| copies.get(&pod.group).copied().unwrap_or(0);
    let mut figures = Figures {
        pods: pods.len(),
        reuse,
        copies_in_use: copies.values().collect::<BTreeSet<_>>().len(),
        free_gpus: free.values().sum(),
        collisions: on_node
            .iter()
            .filter(|(_, names)| names.len() > 1)
            .map(|((node, port), names)| format!("{node} port {port}: {}", names.join(", ")))
            .collect(),
        ..Figures::default()
    };
    let mut sharing_total = 0;
    for (i, pod) in pods.iter().enumerate() {
        let others = sharing(i);
        sharing_total += others.len();
        figures.sharing_max = figures.sharing_max.max(others.len());
        let kept_off: BTreeSet<&str> = others
            .iter()
            .filter_map(|&j| pods[j].node.as_deref())
            .filter(|n| pod.node.as_deref() != Some(*n))
            .collect();
        if kept_off.len() > figures.kept_off.0 || figures.kept_off.1.is_empty() {
            let bound = pod.ports.len() * usize::from(reuse.saturating_sub(1));
            figures.kept_off = (kept_off.len(), pod.name.clone(), bound);
        }
        if pod.node.is_some() {
            figures.bound += 1;
            continue;
        }
        let Some(message) = &pod.refused else {
            continue;
        };
        let roomy: Vec<(&String, &u32)> = free.iter().filter(|(_, f)| **f >= pod.gpus).collect();
        if !message.contains(NO_FREE_PORTS) || roomy.is_empty() {
            figures.pending_for_gpus += 1;
            continue;
        }
        figures.pending_for_ports.push(pod.name.clone());
        let blockers: Vec<String> = roomy
            .iter()
            .map(|(node, left)| {
                let there: Vec<String> = others
                    .iter()
                    .filter(|&&j| pods[j].node.as_ref() == Some(*node))
                    .map(|&j| {
                        let shared: Vec<String> = pods[j]
                            .ports
                            .intersection(&pod.ports)
                            .map(u16::to_string)
                            .collect();
                        format!(
                            "{} (copy {}) holds {}",
                            pods[j].name,
                            copy_of(&pods[j]),
                            shared.join(",")
                        )
                    })
                    .collect();
                format!("{node} ({left} free): {}", there.join("; "))
            })
            .collect();
        let ports: Vec<String> = pod.ports.iter().map(u16::to_string).collect();
        figures.why.push(format!(
            "{} ({} GPUs, copy {}, ports {}): {}",
            pod.name,
            pod.gpus,
            copy_of(pod),
            ports.join(","),
            blockers.join(" | ")
        ));
    }
    figures.sharing_mean = sharing_total as f64 / pods.len().max(1) as f64;
    figures
}

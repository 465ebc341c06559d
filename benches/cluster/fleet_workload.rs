//! 2r's fleet, drawn from a seed: GPU servers and the PortAllocations that fill them, each one
//! StatefulSet of hostNetwork pods, and the pool that serves them. Pure (the manifests are
//! JSON values; `fleet.rs` creates them).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use portalloc::api::POD_ALLOCATION_LABEL;

/// GPUs per node (the Nodes helper's `gpu_server`).
pub const GPUS_PER_NODE: u32 = 8;
/// Pod sizes, in GPUs, each as likely.
const POD_GPUS: [u32; 4] = [1, 2, 4, 8];
/// Pods per PortAllocation (its one role, its one StatefulSet).
const REPLICAS: std::ops::RangeInclusive<u32> = 1..=4;
/// PodScoped ports per pod.
const PORTS: std::ops::RangeInclusive<u32> = 3..=6;
/// The share of the fleet's GPUs the PortAllocations ask for, in percent.
pub const ASKED_PERCENT: u32 = 95;

/// One PortAllocation and its StatefulSet (same name): `replicas` pods of `gpus` GPUs, each
/// with `ports` PodScoped ports.
#[derive(Clone, Debug)]
pub struct Group {
    pub name: String,
    pub gpus: u32,
    pub replicas: u32,
    pub ports: u32,
}

impl Group {
    pub fn pool_ports(&self) -> u32 {
        self.replicas * self.ports
    }
}

/// The fleet of one seed: its nodes and its groups, in the order they are created.
#[derive(Clone, Debug)]
pub struct Fleet {
    pub seed: u64,
    pub nodes: usize,
    pub groups: Vec<Group>,
}

impl Fleet {
    /// Groups drawn in random order (size, replicas, ports each uniform) until
    /// [`ASKED_PERCENT`] of the GPUs are asked for, rounded up: a group that would ask for more
    /// than is left gets fewer replicas, or is drawn again if one pod is already too many.
    pub fn draw(seed: u64, nodes: usize) -> Fleet {
        let mut rng = StdRng::seed_from_u64(seed);
        let total = nodes as u32 * GPUS_PER_NODE;
        let target = (total * ASKED_PERCENT).div_ceil(100);
        let mut asked = 0;
        let mut groups = Vec::new();
        while asked < target {
            let gpus = POD_GPUS[rng.random_range(0..POD_GPUS.len())];
            let replicas = rng.random_range(REPLICAS);
            let ports = rng.random_range(PORTS);
            let replicas = replicas.min((target - asked) / gpus);
            if replicas == 0 {
                continue;
            }
            asked += gpus * replicas;
            groups.push(Group {
                name: format!("w{}", groups.len()),
                gpus,
                replicas,
                ports,
            });
        }
        Fleet {
            seed,
            nodes,
            groups,
        }
    }

    pub fn gpus(&self) -> u32 {
        self.nodes as u32 * GPUS_PER_NODE
    }

    pub fn asked_gpus(&self) -> u32 {
        self.groups.iter().map(|g| g.gpus * g.replicas).sum()
    }

    pub fn pods(&self) -> u32 {
        self.groups.iter().map(|g| g.replicas).sum()
    }

    /// The ports the fleet's pods hold in all (sum over pods of their ports).
    pub fn held_ports(&self) -> u32 {
        self.groups.iter().map(Group::pool_ports).sum()
    }

    /// A pool of `held / divisor` ports (rounded up), grown until `reuse` copies taken in
    /// order, each group whole in the first copy with room, hold every group (a group's ports
    /// are all in one copy, so a tiny fleet may need more than the share).
    pub fn pool_size(&self, divisor: u32, reuse: u32) -> u32 {
        let mut size = self.held_ports().div_ceil(divisor);
        while !self.fits(size, reuse) {
            size += 1;
        }
        size
    }

    fn fits(&self, size: u32, reuse: u32) -> bool {
        let mut free = vec![size; reuse as usize];
        self.groups.iter().all(|g| {
            free.iter_mut()
                .find(|f| **f >= g.pool_ports())
                .map(|f| *f -= g.pool_ports())
                .is_some()
        })
    }
}

/// The PortPool: `size` ports from `first`, the default static band, `nodeReuse`.
pub fn pool(name: &str, first: u32, size: u32, reuse: u32) -> Value {
    json!({
        "apiVersion": "portalloc.dev/v1alpha1",
        "kind": "PortPool",
        "metadata": {"name": name},
        "spec": {
            "ranges": [format!("{first}-{}", first + size - 1)],
            "nodeReuse": reuse,
        },
    })
}

/// The group's PortAllocation: one role named as its StatefulSet, `ports` PodScoped ports.
pub fn allocation(group: &Group, pool: &str) -> Value {
    let ports: Vec<Value> = (0..group.ports)
        .map(
            |p| json!({"name": format!("p{p}"), "scope": "PodScoped", "env": format!("P{p}_PORT")}),
        )
        .collect();
    json!({
        "apiVersion": "portalloc.dev/v1alpha1",
        "kind": "PortAllocation",
        "metadata": {"name": group.name},
        "spec": {
            "pool": pool,
            "roles": [{
                "name": group.name,
                "replicas": group.replicas,
                "workload": {"kind": "StatefulSet", "name": group.name},
                "ports": ports,
            }],
        },
    })
}

/// The group's StatefulSet: hostNetwork pods labelled for the webhook (which injects their
/// env and declares their ports), each asking for `gpus` GPUs; all pods at once (Parallel).
pub fn stateful_set(group: &Group) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": group.name},
        "spec": {
            "replicas": group.replicas,
            "serviceName": group.name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": group.name}},
            "template": {
                "metadata": {"labels": {"app": group.name, POD_ALLOCATION_LABEL: group.name}},
                "spec": {
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "engine",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {"nvidia.com/gpu": group.gpus}},
                    }],
                },
            },
        },
    })
}

/// kube-scheduler's configuration: the default profile, scoring nodes by the GPUs already
/// asked for with `scoring` (MostAllocated: fill a server before starting the next, as GPU
/// fleets configure it so that whole servers stay free for 8-GPU pods; or LeastAllocated).
pub fn scheduler_config(kubeconfig: &str, scoring: &str) -> String {
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
leaderElection:
  leaderElect: false
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: {scoring}
        resources:
        - name: nvidia.com/gpu
          weight: 1
"
    )
}

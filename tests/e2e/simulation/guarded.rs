//! Simulated nodes with a node agent each: every node a network namespace of the simulation
//! (`NodeNetworks`), a cgroup tree laid out as kubelet's (cgroupfs driver) and the agent binary
//! running in that namespace (tests/common/agent_node.rs), so a pool's `spec.guard` is enforced
//! by the kernel on the binds of the scenario's own processes.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::Scenario;
use super::netns::NodeNetworks;
use crate::support::{self, agent_node::AgentNode, cli};

/// How long the agents may take to guard the pool and to see every pod.
const GUARD_TIMEOUT: Duration = Duration::from_secs(30);

/// See the module's comment. Fields drop in order: the agents (killed, their guards detached,
/// their relays stopped, their cgroup trees removed), then the networks.
pub struct GuardedNodes {
    pub agents: BTreeMap<String, AgentNode>,
    /// Where the agents keep their Leases (`pool describe --node-agent-namespace`).
    lease_namespace: String,
    pub addresses: BTreeMap<String, Ipv4Addr>,
    pub networks: NodeNetworks,
}

impl GuardedNodes {
    /// A node of each name, its agent running (`-v 1`, a round every 100 ms) and keeping its
    /// Lease in `lease_namespace`.
    pub fn start(names: &[&str], lease_namespace: &str) -> GuardedNodes {
        let addresses: BTreeMap<String, Ipv4Addr> = names
            .iter()
            .enumerate()
            .map(|(i, name)| (name.to_string(), Ipv4Addr::new(10, 202, 0, i as u8 + 1)))
            .collect();
        let networks = NodeNetworks::new(addresses.iter().map(|(n, ip)| (n.as_str(), *ip)));
        let kubeconfig = &support::cluster().kubeconfig;
        let agents = names
            .iter()
            .map(|&name| {
                let mut agent = AgentNode::start_in(kubeconfig, name, &networks.netns(name));
                agent.start_agent(&[
                    "-v",
                    "1",
                    "--node-name",
                    name,
                    "--round",
                    "100ms",
                    "--lease-namespace",
                    lease_namespace,
                ]);
                (name.to_string(), agent)
            })
            .collect();
        GuardedNodes {
            agents,
            lease_namespace: lease_namespace.to_string(),
            addresses,
            networks,
        }
    }

    /// Every agent's log, each under its node's name.
    pub fn logs(&self) -> String {
        self.agents
            .iter()
            .map(|(node, agent)| format!("--- agent on {node}\n{}", agent.log()))
            .collect()
    }

    /// A cgroup for every pod the scenario created, as kubelet makes it on the pod's node: the
    /// pod's UID and QoS class from the API's Pod; returns each pod's container cgroup.
    pub fn pod_cgroups(&self, scenario: &Scenario) -> BTreeMap<String, PathBuf> {
        scenario
            .created
            .iter()
            .map(|(name, pod)| {
                let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
                let node = node.unwrap_or_else(|| panic!("pod {name} was created on no node"));
                let qos = pod.status.as_ref().and_then(|s| s.qos_class.as_deref());
                let qos = match qos {
                    Some("Guaranteed") => None,
                    Some("Burstable") => Some("burstable"),
                    Some("BestEffort") => Some("besteffort"),
                    other => panic!("pod {name}: QoS class {other:?}"),
                };
                let uid = pod
                    .metadata
                    .uid
                    .as_deref()
                    .expect("a created pod has a UID");
                (name.clone(), self.agents[node].cgroups.pod(qos, uid))
            })
            .collect()
    }

    /// Until `pool describe POOL` says every node's agent guards the pool under `Enforce`.
    pub fn wait_until_guarding(&self, pool: &str) {
        let started = Instant::now();
        loop {
            let run = cli::run(&[
                "pool",
                "describe",
                pool,
                "--node-agent-namespace",
                &self.lease_namespace,
            ]);
            assert!(run.ok(), "{run}");
            let guarding = run
                .stdout
                .lines()
                .find_map(|l| l.trim().strip_prefix("guard it (Enforce): "))
                .map(|nodes| nodes.split(", ").map(str::to_string).collect::<Vec<_>>())
                .unwrap_or_default();
            if self.agents.keys().all(|node| guarding.contains(node)) {
                return;
            }
            assert!(
                started.elapsed() < GUARD_TIMEOUT,
                "the agents do not all guard pool {pool}:\n{}\n{}",
                run.stdout,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Until the agent of every pod's node has seen the pod: a process of a pod the agent does
    /// not know (a cgroup of a UID the API does not show) is refused the pod's port `env` (its
    /// env var). Until the agent has seen the pod, the guard lets the unknown pod claim that
    /// port, and lets it bind it again (its own claim); a second unknown pod would be refused
    /// it, and an unknown pod counts as one that holds nothing after 10 s: so one probe cgroup
    /// for a few seconds, and a new one only after the agent has dropped the old one's claim
    /// (it does when the cgroup goes, within a round).
    pub fn wait_until_seen(&self, scenario: &Scenario, env: &str) {
        const PROBE_FOR: Duration = Duration::from_secs(4);
        let mut probes = 0u32;
        for (name, pod) in &scenario.created {
            let node = pod.spec.as_ref().unwrap().node_name.as_deref().unwrap();
            let agent = &self.agents[node];
            let port: u16 = scenario.env(name, env).parse().unwrap();
            let started = Instant::now();
            let mut probe: Option<(PathBuf, Instant)> = None;
            let remove = |cgroup: &PathBuf| {
                std::fs::remove_dir(cgroup).unwrap();
                std::fs::remove_dir(cgroup.parent().unwrap()).unwrap();
            };
            loop {
                if let Some((old, _)) = probe.take_if(|(_, at)| at.elapsed() > PROBE_FOR) {
                    remove(&old);
                    std::thread::sleep(Duration::from_millis(500));
                }
                let (cgroup, _) = probe.get_or_insert_with(|| {
                    probes += 1;
                    let uid = format!("00000000-0000-4000-8000-{probes:012x}");
                    (agent.cgroups.pod(Some("besteffort"), &uid), Instant::now())
                });
                let answer = agent.bind(Some(cgroup), port);
                if answer == "EPERM" {
                    remove(cgroup);
                    break;
                }
                assert_eq!(answer, "ok", "a probe's bind of {name}'s port {port}");
                assert!(
                    started.elapsed() < GUARD_TIMEOUT,
                    "the agent on {node} never saw pod {name} (a probe still binds its port \
                     {port});\n{}",
                    self.logs()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// The agents' log lines about binds of the scenario's pods (refused, audited, or taken
    /// before the agent saw the pod).
    pub fn verdicts_on(&self, scenario: &Scenario) -> Vec<String> {
        let pod = format!("pod=\"{}/", scenario.ns);
        self.agents
            .iter()
            .flat_map(|(node, agent)| {
                agent
                    .log()
                    .lines()
                    .filter(|l| l.contains("verdict=") && l.contains(&pod))
                    .map(|l| format!("{node}: {l}"))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

//! What the node agent should make the kernel hold, decided from the pools and from which pod on
//! the node holds which port. Pure: the agent (`k8s/node_agent`) reads and writes.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;

use crate::api::{GuardMode, PortPool, Protocol};

/// Slots per protocol in the guard's port-indexed maps.
pub const PORTS_PER_PROTOCOL: u32 = 65536;

/// The guard's index of a protocol.
pub fn protocol_index(protocol: Protocol) -> u32 {
    match protocol {
        Protocol::Tcp => 0,
        Protocol::Udp => 1,
        Protocol::Sctp => 2,
    }
}

/// A port of a protocol, as one number: the guard's map index.
pub fn slot(protocol: Protocol, port: u16) -> u32 {
    protocol_index(protocol) * PORTS_PER_PROTOCOL + u32::from(port)
}

/// The protocol and port of a slot.
pub fn port_of_slot(slot: u32) -> (Protocol, u16) {
    let protocol = match slot / PORTS_PER_PROTOCOL {
        0 => Protocol::Tcp,
        1 => Protocol::Udp,
        _ => Protocol::Sctp,
    };
    (protocol, (slot % PORTS_PER_PROTOCOL) as u16)
}

/// What every pool asks of one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePlan {
    /// Every pool's ports, whatever its guard: kept out of the kernel's ephemeral choice.
    pub reserved: BTreeSet<u16>,
    /// Guarded slots and their mode (the stricter where two pools share a port).
    pub modes: BTreeMap<u32, GuardMode>,
    /// The pool each guarded slot belongs to, for reports.
    pub pool_of_slot: BTreeMap<u32, String>,
    /// Pools with a guard on, and its mode.
    pub guarded: BTreeMap<String, GuardMode>,
    /// Pools whose spec names no usable ports, with why.
    pub unusable: Vec<(String, String)>,
    /// Pools whose ports are not reserved because they would leave the node too few ports for
    /// outgoing connections, one line each naming the pool.
    pub unreserved: Vec<String>,
}

/// The node's ephemeral range (`net.ipv4.ip_local_port_range`), inclusive.
pub type EphemeralRange = (u16, u16);

/// How many ports of the ephemeral range reservations must leave free: a node that cannot
/// pick a source port cannot connect anywhere (kubelet to the API server included). A quarter
/// of the range, at least 1,024 (all of a smaller range).
pub fn ephemeral_floor((first, last): EphemeralRange) -> u32 {
    let size = u32::from(last.saturating_sub(first)) + 1;
    (size / 4).max(1024).min(size)
}

/// The plan for `pools` on a node whose ephemeral range is `ephemeral` (`None`: unknown, every
/// pool reserved). Pools are reserved in order while the ephemeral range keeps its floor free;
/// a pool that would take it below is guarded all the same but not reserved, and said so.
pub fn node_plan(pools: &[PortPool], ephemeral: Option<EphemeralRange>) -> NodePlan {
    let mut plan = NodePlan::default();
    for pool in pools {
        let ports = match pool.spec.port_set() {
            Ok(ports) => ports,
            Err(e) => {
                plan.unusable.push((pool.name_any(), e.to_string()));
                continue;
            }
        };
        match ephemeral.and_then(|range| crowds_out(&plan.reserved, &ports, range)) {
            Some(left) => plan
                .unreserved
                .push(unreserved_line(pool, &ports, ephemeral, left)),
            None => plan.reserved.extend(ports.iter()),
        }
        // SCTP binds run no cgroup bind hook: such a pool is reserved, never called guarded.
        let mode = pool.spec.judged_guard();
        if mode == GuardMode::Disabled {
            continue;
        }
        plan.guarded.insert(pool.name_any(), mode);
        for port in ports.iter() {
            let slot = slot(pool.spec.protocol, port);
            let stricter = plan.modes.get(&slot).is_none_or(|&m| rank(mode) > rank(m));
            if stricter {
                plan.modes.insert(slot, mode);
                plan.pool_of_slot.insert(slot, pool.name_any());
            }
        }
    }
    plan
}

/// How many ports of `range` would stay free if `ports` were reserved beside `reserved`, when
/// that is below the floor; `None` when reserving them is fine.
fn crowds_out(
    reserved: &BTreeSet<u16>,
    ports: &crate::core::PortSet,
    range: EphemeralRange,
) -> Option<u32> {
    let in_range = |p: &u16| (range.0..=range.1).contains(p);
    let taken = reserved.iter().filter(|p| in_range(p)).count() as u32;
    let more = ports
        .iter()
        .filter(|p| in_range(p) && !reserved.contains(p))
        .count() as u32;
    let size = u32::from(range.1.saturating_sub(range.0)) + 1;
    let left = size.saturating_sub(taken + more);
    (more > 0 && left < ephemeral_floor(range)).then_some(left)
}

fn unreserved_line(
    pool: &PortPool,
    ports: &crate::core::PortSet,
    ephemeral: Option<EphemeralRange>,
    left: u32,
) -> String {
    let (first, last) = ephemeral.expect("only with a range");
    let overlap = ports.iter().filter(|p| (first..=last).contains(p)).count();
    format!(
        "PortPool {} is not reserved on this node: it has {overlap} ports of the ephemeral range \
         {first}-{last}, and reserving them would leave {left} for outgoing connections (at least \
         {} are kept); move the pool out of that range or narrow net.ipv4.ip_local_port_range",
        pool.name_any(),
        ephemeral_floor((first, last))
    )
}

fn rank(mode: GuardMode) -> u8 {
    match mode {
        GuardMode::Disabled => 0,
        GuardMode::Audit => 1,
        GuardMode::Enforce => 2,
    }
}

/// The ports one pod on the node holds in the record, in its pool's protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodHolding {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// `namespace/name` of its PortAllocation.
    pub owner: String,
    pub pool: String,
    pub protocol: Protocol,
    pub ports: BTreeSet<u16>,
}

/// A slot two pods on one node both hold: each has its entry in a record (two pools over one
/// port, or one entry written by hand), and the guard's map has room for one owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldTwice {
    pub slot: u32,
    /// The pod the guard lets bind the port: the one that owned it already, else the first.
    pub kept: PodHolding,
    pub other: PodHolding,
}

impl HeldTwice {
    /// One line for the agent's report, naming both pools (`pool describe` of either shows it).
    pub fn line(&self) -> String {
        let (protocol, port) = port_of_slot(self.slot);
        let (kept, other) = (&self.kept, &self.other);
        format!(
            "port {port}/{protocol} {HELD_TWICE} {} (of PortPool {} for PortAllocation {}) and \
             {} (of PortPool {} for PortAllocation {}): the guard lets only {} bind it, the other fails \
             with EADDRINUSE or EPERM; give the pools disjoint ranges (`kubectl portalloc pool \
             describe` names the shared ports) or keep their pods on different nodes",
            kept.pod, kept.pool, kept.owner, other.pod, other.pool, other.owner, kept.pod
        )
    }
}

/// What every [`HeldTwice::line`] says, to tell those lines from others in a report.
pub const HELD_TWICE: &str = "is held on this node by two pods:";

/// Which pod cgroup holds each slot on this node, and the slots two pods on the node both hold
/// (the scheduler keeps them apart only if both declared their ports). A slot keeps the owner
/// it had in `previous` while that pod still holds it, so a newcomer never takes a port from
/// a pod that may be bound to it already; a new slot goes to the first pod. Both stay named in
/// the [`HeldTwice`] returned.
pub fn owners(
    holders: &[(u64, &PodHolding)],
    previous: &BTreeMap<u32, u64>,
) -> (BTreeMap<u32, u64>, Vec<HeldTwice>) {
    let mut owners: BTreeMap<u32, u64> = BTreeMap::new();
    let mut by_slot: BTreeMap<u32, &PodHolding> = BTreeMap::new();
    let mut twice = Vec::new();
    for &(cgroup, holding) in holders {
        for &port in &holding.ports {
            let slot = slot(holding.protocol, port);
            let Some(&first) = by_slot.get(&slot) else {
                by_slot.insert(slot, holding);
                owners.insert(slot, cgroup);
                continue;
            };
            let (kept, other) = if previous.get(&slot) == Some(&cgroup) {
                by_slot.insert(slot, holding);
                owners.insert(slot, cgroup);
                (holding, first)
            } else {
                (first, holding)
            };
            twice.push(HeldTwice {
                slot,
                kept: kept.clone(),
                other: other.clone(),
            });
        }
    }
    (owners, twice)
}

/// Pool ports something on the node already listens on (`listeners`: protocol, port, user id)
/// that no pod the agent knows to hold them does: their holders will fail with EADDRINUSE.
/// One line each, naming the pool (`pool describe` picks its pool's lines by that).
pub fn listener_conflicts(
    pools: &[PortPool],
    listeners: &[(Protocol, u16, u32)],
    owners: &BTreeMap<u32, u64>,
) -> Vec<String> {
    let mut lines = BTreeSet::new();
    for &(protocol, port, uid) in listeners {
        if owners.contains_key(&slot(protocol, port)) {
            continue;
        }
        for pool in pools.iter().filter(|p| p.spec.protocol == protocol) {
            if pool.spec.port_set().is_ok_and(|ports| ports.contains(port)) {
                lines.insert(format!(
                    "port {port}/{protocol} of PortPool {} is already listened on (user id {uid}) \
                     by no pod known to hold it: its holder will fail with EADDRINUSE; exclude the \
                     port from the pool or stop that listener",
                    pool.name_any()
                ));
            }
        }
    }
    lines.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortPoolSpec, PortRangeText, StaticBandSetting};

    fn pool(name: &str, ranges: &[&str], protocol: Protocol, guard: Option<GuardMode>) -> PortPool {
        PortPool::new(
            name,
            PortPoolSpec {
                ranges: ranges
                    .iter()
                    .map(|r| PortRangeText(r.to_string()))
                    .collect(),
                exclude: vec![],
                protocol,
                static_band: StaticBandSetting::default(),
                node_reuse: None,
                follow_nodes: None,
                guard,
                allow_overlap: false,
            },
        )
    }

    #[test]
    fn every_pool_is_reserved_and_only_guarded_ones_are_watched() {
        let plan = node_plan(
            &[
                pool("plain", &["30000-30009"], Protocol::Tcp, None),
                pool(
                    "udp",
                    &["31000-31001"],
                    Protocol::Udp,
                    Some(GuardMode::Audit),
                ),
                // No cgroup bind hook runs for SCTP: reserved, never guarded.
                pool(
                    "sctp",
                    &["33000-33002"],
                    Protocol::Sctp,
                    Some(GuardMode::Enforce),
                ),
            ],
            Some((32768, 60999)),
        );
        assert_eq!(plan.reserved.len(), 15);
        assert_eq!(plan.modes.len(), 2);
        assert_eq!(
            plan.modes.get(&slot(Protocol::Udp, 31000)),
            Some(&GuardMode::Audit)
        );
        assert_eq!(plan.modes.get(&slot(Protocol::Tcp, 31000)), None);
        assert_eq!(plan.guarded.keys().collect::<Vec<_>>(), ["udp"]);
    }

    #[test]
    fn the_stricter_mode_wins_where_pools_share_a_port() {
        let plan = node_plan(
            &[
                pool("a", &["30000-30009"], Protocol::Tcp, Some(GuardMode::Audit)),
                pool(
                    "b",
                    &["30005-30014"],
                    Protocol::Tcp,
                    Some(GuardMode::Enforce),
                ),
                pool("c", &["30010-30019"], Protocol::Tcp, Some(GuardMode::Audit)),
            ],
            None,
        );
        assert_eq!(plan.modes[&slot(Protocol::Tcp, 30004)], GuardMode::Audit);
        assert_eq!(plan.modes[&slot(Protocol::Tcp, 30005)], GuardMode::Enforce);
        assert_eq!(plan.pool_of_slot[&slot(Protocol::Tcp, 30012)], "b");
        assert_eq!(plan.modes[&slot(Protocol::Tcp, 30015)], GuardMode::Audit);
    }

    #[test]
    fn a_pool_that_would_leave_too_few_ephemeral_ports_is_guarded_but_not_reserved() {
        let range = (32768, 60999); // 28,232 ports; 7,058 are kept free
        let plan = node_plan(
            &[
                pool("a-rbg", &["30000-34999"], Protocol::Tcp, None),
                pool(
                    "b-everything",
                    &["1-65535"],
                    Protocol::Udp,
                    Some(GuardMode::Enforce),
                ),
                pool("c-high", &["40000-59999"], Protocol::Tcp, None),
                pool("d-small", &["61000-61009"], Protocol::Tcp, None),
            ],
            Some(range),
        );
        // a-rbg takes 2,232 of the range; b-everything would take all of it, c-high 20,000 more
        // than leaves the floor; d-small is outside the range.
        assert_eq!(plan.reserved.len(), 5000 + 10);
        assert_eq!(plan.unreserved.len(), 2, "{:?}", plan.unreserved);
        assert!(plan.unreserved[0].starts_with(
            "PortPool b-everything is not reserved on this node: it has 28232 ports of the ephemeral range 32768-60999, and reserving them would leave 0"
        ));
        assert!(plan.unreserved[1].starts_with("PortPool c-high is not reserved"));
        // Still guarded: the guard needs no reservation.
        assert_eq!(plan.guarded.len(), 1);
        assert_eq!(ephemeral_floor(range), 7058);
        assert_eq!(ephemeral_floor((60000, 60999)), 1000);
    }

    #[test]
    fn listeners_on_pool_ports_are_conflicts_unless_a_holder_listens() {
        let pools = [pool("llm", &["30000-30009"], Protocol::Tcp, None)];
        let listeners = [
            (Protocol::Tcp, 22, 0),       // sshd: no pool's
            (Protocol::Tcp, 30001, 0),    // something of the node's
            (Protocol::Udp, 30002, 0),    // another protocol
            (Protocol::Tcp, 30003, 1000), // the holder on this node
        ];
        let owners = BTreeMap::from([(slot(Protocol::Tcp, 30003), 7)]);
        let lines = listener_conflicts(&pools, &listeners, &owners);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with("port 30001/TCP of PortPool llm is already listened on"));
    }

    #[test]
    fn slots_round_trip() {
        for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            assert_eq!(port_of_slot(slot(protocol, 65535)), (protocol, 65535));
        }
    }

    #[test]
    fn a_port_two_pods_hold_on_one_node_stays_with_the_first() {
        let holding = |pod: &str, ports: &[u16]| PodHolding {
            pod: pod.into(),
            owner: "ns/pa".into(),
            pool: "p".into(),
            protocol: Protocol::Tcp,
            ports: ports.iter().copied().collect(),
        };
        let (a, b) = (holding("ns/a", &[1, 2]), holding("ns/b", &[2, 3]));
        let (owners, twice) = owners(&[(10, &a), (20, &b)], &BTreeMap::new());
        assert_eq!(owners, BTreeMap::from([(1, 10), (2, 10), (3, 20)]));
        assert_eq!(twice.len(), 1);
        assert_eq!(
            (twice[0].kept.pod.as_str(), twice[0].other.pod.as_str()),
            ("ns/a", "ns/b")
        );
    }

    #[test]
    fn a_port_two_pools_give_two_pods_on_one_node_stays_with_its_owner_and_both_are_named() {
        let holding = |pod: &str, pool: &str, ports: &[u16]| PodHolding {
            pod: pod.into(),
            owner: format!("ns/{pool}-pa"),
            pool: pool.into(),
            protocol: Protocol::Tcp,
            ports: ports.iter().copied().collect(),
        };
        let (old, new) = (
            holding("ns/old", "b", &[49005]),
            holding("ns/new", "a", &[49005]),
        );
        let port = slot(Protocol::Tcp, 49005);
        // The newcomer comes first in the list (a lower pod UID), yet the owner stays.
        let previous = BTreeMap::from([(port, 20)]);
        let (kept, twice) = owners(&[(10, &new), (20, &old)], &previous);
        assert_eq!(kept, BTreeMap::from([(port, 20)]));
        assert_eq!(twice.len(), 1);
        let line = twice[0].line();
        assert!(
            line.starts_with(
                "port 49005/TCP is held on this node by two pods: ns/old (of PortPool b for \
                 PortAllocation ns/b-pa) and ns/new (of PortPool a for PortAllocation ns/a-pa): \
                 the guard lets only ns/old bind it"
            ),
            "{line}"
        );
        // pool describe picks a line by "PortPool NAME ": both pools see it.
        assert!(line.contains("PortPool a ") && line.contains("PortPool b "));
        // With no owner yet, the first pod gets it.
        let (kept, _) = owners(&[(10, &new), (20, &old)], &BTreeMap::new());
        assert_eq!(kept, BTreeMap::from([(port, 10)]));
    }
}

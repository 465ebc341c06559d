//! What a node agent says about its node, and what `pool describe` makes of every agent's word.
//! Each agent keeps a Lease (`portalloc-node-<node>`, as kubelet keeps its node Lease) whose
//! renew time is its heartbeat and whose annotations are its report: whether the guard is
//! attached, which pools it guards in which mode, how many ports it reserves, and ports of a
//! pool that something on the node already listens on. Pure: the agent writes the Lease and
//! `pool describe` reads it (`k8s/node_agent/lease.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::api::GuardMode;
use crate::ledger::record::windows::fnv1a;

/// The label on every node agent's Lease.
pub const NODE_AGENT_LABEL: &str = "portalloc.dev/node-agent";
/// The namespace the chart and deploy/node-agent run the agents in (a namespace of their own,
/// the only one labelled for Pod Security's privileged level): their Leases there are the
/// reports `pool describe` reads.
pub const NODE_AGENT_NAMESPACE: &str = "portalloc-node-agent";
const NODE: &str = "portalloc.dev/node";
const GUARD: &str = "portalloc.dev/guard";
const POOLS: &str = "portalloc.dev/guarded-pools";
const RESERVED: &str = "portalloc.dev/reserved-ports";
const CONFLICTS: &str = "portalloc.dev/listener-conflicts";

/// The Lease of the agent on `node`. Node names are DNS subdomains (at most 253 characters),
/// and so is this, shortened with a hash where the prefix would make it too long.
pub fn lease_name(node: &str) -> String {
    let name = format!("portalloc-node-{node}");
    if name.len() <= 253 {
        return name;
    }
    format!(
        "portalloc-node-{}-{:016x}",
        &node[..200],
        fnv1a(node.as_bytes())
    )
}

/// One agent's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeReport {
    pub node: String,
    /// `None`: the guard is attached; else why the node has none.
    pub guard_unavailable: Option<String>,
    /// The pools it guards, with their mode.
    pub pools: BTreeMap<String, GuardMode>,
    /// Ports it keeps in the node's reserved ports.
    pub reserved: usize,
    /// Pool ports something on the node listens on that no pod on the node holds, one line each.
    pub conflicts: Vec<String>,
}

impl NodeReport {
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let pools = self
            .pools
            .iter()
            .map(|(pool, mode)| format!("{pool}={mode}"))
            .collect::<Vec<_>>()
            .join(",");
        BTreeMap::from([
            (NODE.into(), self.node.clone()),
            (
                GUARD.into(),
                match &self.guard_unavailable {
                    None => "attached".into(),
                    Some(why) => format!("unavailable: {why}"),
                },
            ),
            (POOLS.into(), pools),
            (RESERVED.into(), self.reserved.to_string()),
            (CONFLICTS.into(), self.conflicts.join("\n")),
        ])
    }

    /// The report a Lease's annotations carry; `None` for a Lease that is not an agent's.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Option<NodeReport> {
        let node = annotations.get(NODE)?.clone();
        let guard = annotations
            .get(GUARD)
            .map(String::as_str)
            .unwrap_or_default();
        let pools = annotations
            .get(POOLS)
            .map(String::as_str)
            .unwrap_or_default()
            .split(',')
            .filter_map(|item| {
                let (pool, mode) = item.split_once('=')?;
                Some((pool.to_string(), mode.parse().ok()?))
            })
            .collect();
        Some(NodeReport {
            node,
            guard_unavailable: match guard {
                "attached" => None,
                other => Some(
                    other
                        .strip_prefix("unavailable: ")
                        .unwrap_or(other)
                        .to_string(),
                ),
            },
            pools,
            reserved: annotations
                .get(RESERVED)
                .and_then(|n| n.parse().ok())
                .unwrap_or_default(),
            conflicts: annotations
                .get(CONFLICTS)
                .map(|c| c.lines().map(str::to_string).collect())
                .unwrap_or_default(),
        })
    }
}

/// A report as read, with how long ago it was renewed and how long it may go unrenewed.
#[derive(Clone, Debug)]
pub struct ReadReport {
    pub report: NodeReport,
    pub age: Option<Duration>,
    pub lease_duration: Duration,
}

/// What every node agent says of one pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolGuardSummary {
    /// Nodes whose agent guards the pool, with the mode.
    pub guarding: Vec<(String, GuardMode)>,
    /// Nodes whose agent reserves the pool's ports but has no guard, with why.
    pub unguarded: Vec<(String, String)>,
    /// Nodes whose agent stopped renewing its report, with how long ago it last did.
    pub stale: Vec<(String, Option<Duration>)>,
    /// Listener conflicts the agents found in this pool, `node: line`.
    pub conflicts: Vec<String>,
}

/// The summary for `pool` (whose guard is `mode`) from every agent's report.
pub fn pool_guard_summary(pool: &str, mode: GuardMode, reports: &[ReadReport]) -> PoolGuardSummary {
    let mut summary = PoolGuardSummary::default();
    for read in reports {
        let node = read.report.node.clone();
        if read.age.is_none_or(|age| age > read.lease_duration) {
            summary.stale.push((node, read.age));
            continue;
        }
        for line in &read.report.conflicts {
            if line.contains(&format!("PortPool {pool} ")) {
                summary.conflicts.push(format!("{node}: {line}"));
            }
        }
        match (&read.report.guard_unavailable, read.report.pools.get(pool)) {
            (None, Some(&mode)) => summary.guarding.push((node, mode)),
            // The agent has not caught up with a guard turned on, or the guard is off.
            (None, None) if mode != GuardMode::Disabled => summary
                .unguarded
                .push((node, "the agent has not applied the guard yet".into())),
            (None, None) => {}
            (Some(why), _) => summary.unguarded.push((node, why.clone())),
        }
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: &str) -> NodeReport {
        NodeReport {
            node: node.into(),
            guard_unavailable: None,
            pools: BTreeMap::from([
                ("llm".into(), GuardMode::Enforce),
                ("rdma".into(), GuardMode::Audit),
            ]),
            reserved: 4000,
            conflicts: vec![
                "port 30022/TCP of PortPool llm is already listened on, by no pod".into(),
            ],
        }
    }

    #[test]
    fn a_report_round_trips_through_annotations() {
        let mut unguarded = report("gpu-2");
        unguarded.guard_unavailable = Some("no cgroup v2 hierarchy at /sys/fs/cgroup".into());
        for report in [report("gpu-1"), unguarded] {
            assert_eq!(
                NodeReport::from_annotations(&report.annotations()),
                Some(report)
            );
        }
        assert_eq!(NodeReport::from_annotations(&BTreeMap::new()), None);
    }

    #[test]
    fn the_summary_sorts_nodes_by_what_their_agent_says() {
        let fresh = |report| ReadReport {
            report,
            age: Some(Duration::from_secs(5)),
            lease_duration: Duration::from_secs(90),
        };
        let mut no_bpf = report("gpu-2");
        no_bpf.guard_unavailable = Some("no cgroup v2".into());
        let mut stale = fresh(report("gpu-3"));
        stale.age = Some(Duration::from_secs(600));
        let reports = [fresh(report("gpu-1")), fresh(no_bpf), stale];
        let summary = pool_guard_summary("llm", GuardMode::Enforce, &reports);
        assert_eq!(summary.guarding, vec![("gpu-1".into(), GuardMode::Enforce)]);
        assert_eq!(
            summary.unguarded,
            vec![("gpu-2".into(), "no cgroup v2".into())]
        );
        assert_eq!(
            summary.stale,
            vec![("gpu-3".into(), Some(Duration::from_secs(600)))]
        );
        // Every fresh agent's conflicts count, guard or not; a stale one's do not.
        assert_eq!(summary.conflicts.len(), 2);
        assert!(summary.conflicts[0].starts_with("gpu-1: port 30022/TCP"));
        assert!(summary.conflicts[1].starts_with("gpu-2: port 30022/TCP"));
        let other = pool_guard_summary("other", GuardMode::Disabled, &reports);
        assert!(other.guarding.is_empty() && other.conflicts.is_empty());
    }

    #[test]
    fn long_node_names_still_make_a_valid_lease_name() {
        assert_eq!(lease_name("gpu-1"), "portalloc-node-gpu-1");
        assert!(lease_name(&"n".repeat(253)).len() <= 253);
    }
}

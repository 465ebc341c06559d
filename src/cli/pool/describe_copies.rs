//! The part of `pool describe` about node reuse: the pool's copies, how full each is, who holds
//! ports in the copies past the first, and what reuse costs the scheduler.

use std::fmt::Write as _;

use crate::cli::output::bar;
use crate::k8s::{NodesView, PoolView};
use crate::ledger::NodeCount;

/// The copies section, printed after the rest of `pool describe` for a pool with reuse.
pub fn copies_text(view: &PoolView) -> String {
    let mut out = String::new();
    let reuse = view.reuse;
    let size = view.record.state.size();
    match &view.nodes {
        Some(nodes) => write_nodes(&mut out, nodes),
        None => {
            let _ = writeln!(
                out,
                "Node reuse:   {reuse} (each port may be held by up to {reuse} pods, never two on \
                 one node)"
            );
        }
    }
    let in_use = view
        .copies()
        .filter(|(_, r)| r.state.held_count() > 0)
        .count();
    let _ = writeln!(
        out,
        "Copies:       {in_use} of {reuse} in use; {} of {} ports held in all",
        view.held(),
        view.capacity()
    );
    for (copy, record) in view.copies() {
        let held = record.state.held_count();
        let holders = record.holders.len() + record.opaque.len();
        let past = if copy >= reuse {
            "  (past nodeReuse)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  copy {copy:<3} {held:>5}/{size:<5} {} {holders} holders{past}",
            bar(held, size, 20)
        );
    }
    // A pod's port is held by at most reuse - 1 pods of other copies, each on some node the
    // scheduler then keeps the pod off.
    let others = match &view.nodes {
        Some(_) => in_use.saturating_sub(1) as u16,
        None => reuse.saturating_sub(1),
    };
    let _ = writeln!(
        out,
        "Scheduling:   a pod with k ports is kept off at most k x {others} nodes (the other \
         copies' holders of its ports); pods must declare their ports as hostPorts (the pod \
         webhook does)"
    );
    if view.reused.iter().any(|(_, r)| !r.holders.is_empty()) {
        let _ = writeln!(out, "Holders in other copies:");
        for (copy, record) in &view.reused {
            for (uid, holder) in &record.holders {
                let _ = writeln!(
                    out,
                    "  {}  (copy {copy}, {} ports, uid {uid})",
                    holder.owner,
                    holder.holdings.port_count()
                );
                let _ = writeln!(out, "    {}", holder.holdings.encode());
            }
        }
    }
    out
}

/// How many nodes count, when, and the copies allowed for pods of each size the pool's
/// holders have (with the reason the next copy is refused).
fn write_nodes(out: &mut String, nodes: &NodesView) {
    let counted = match (&nodes.count, &nodes.counted_at) {
        (NodeCount::Counted(n), Some(at)) => format!("{n} ({}), counted {}", nodes.selector, at.0),
        (NodeCount::Counted(n), None) => format!(
            "{n} ({}), counted now by this command: no watcher keeps status.nodes",
            nodes.selector
        ),
        (NodeCount::Unknown(why), _) => format!("not counted ({}): {why}", nodes.selector),
    };
    let _ = writeln!(
        out,
        "Node reuse:   follows the nodes (a port gets another holder only while its holders' \
         pods cannot be kept off every node)"
    );
    let _ = writeln!(out, "Nodes:        {counted}");
    let mut sizes = nodes.sizes.clone();
    if sizes.is_empty() {
        sizes.push(1);
    }
    let _ = writeln!(out, "Copies allowed, by ports per pod:");
    for k in sizes {
        let allowed = nodes.bound.copies_allowed(k, nodes.in_use);
        let copies = match allowed {
            0 => "none".to_string(),
            1 => "copy 0".to_string(),
            n => format!("copies 0-{}", n - 1),
        };
        let refused = nodes
            .bound
            .copy_allowed(allowed, k, nodes.in_use)
            .err()
            .map(|refusal| format!("; {refusal}"))
            .unwrap_or_default();
        let ports = if k == 1 { "port" } else { "ports" };
        let _ = writeln!(out, "  {k:>3} {ports:<5}  {copies}{refused}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PoolHolder, PortPool, PortPoolSpec, StaticBandSetting};
    use crate::ledger::{PoolSnapshot, WindowRecord};

    fn record(pool: &PortPool, holders: Vec<PoolHolder>) -> WindowRecord {
        let snapshot = PoolSnapshot::of_pool(pool);
        let ports = snapshot.ports().unwrap();
        let band = snapshot.spec.core_static_band();
        WindowRecord::joined(snapshot, ports, band, holders)
    }

    #[test]
    fn copies_in_use_their_fill_and_the_exclusion_bound() {
        let pool = PortPool::new(
            "ray",
            PortPoolSpec {
                ranges: vec!["20000-20009".into()],
                exclude: vec![],
                protocol: Default::default(),
                static_band: StaticBandSetting::None,
                node_reuse: Some(4),
                follow_nodes: None,
                guard: None,
                allow_overlap: false,
            },
        );
        let holder = |uid: &str, owner: &str, ports: &str| PoolHolder {
            uid: uid.into(),
            owner: owner.into(),
            ports: ports.into(),
        };
        let view = PoolView {
            record: record(&pool, vec![holder("a", "ml/a", "w.p=20000-20009")]),
            reused: vec![(
                1,
                record(&pool, vec![holder("b", "ml/b", "w.p=20000-20004")]),
            )],
            reuse: 4,
            nodes: None,
            shards: 2,
            warnings: vec![],
        };
        let text = copies_text(&view);
        assert!(
            text.contains("Copies:       2 of 4 in use; 15 of 40 ports held in all\n"),
            "{text}"
        );
        assert!(text.contains("  copy 0      10/10"), "{text}");
        assert!(text.contains("  copy 1       5/10"), "{text}");
        assert!(text.contains("kept off at most k x 3 nodes"), "{text}");
        assert!(
            text.contains("  ml/b  (copy 1, 5 ports, uid b)\n    w.p=20000-20004\n"),
            "{text}"
        );
    }

    #[test]
    fn a_pool_that_follows_its_nodes_says_how_many_count_and_the_copies_each_size_gets() {
        use crate::k8s::NodesView;
        use crate::ledger::{CopyBound, InUse};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

        let pool = PortPool::new(
            "ray",
            PortPoolSpec {
                ranges: vec!["20000-20009".into()],
                exclude: vec![],
                protocol: Default::default(),
                static_band: StaticBandSetting::None,
                node_reuse: None,
                follow_nodes: Some(Default::default()),
                guard: None,
                allow_overlap: false,
            },
        );
        let holder = |uid: &str, owner: &str, ports: &str| PoolHolder {
            uid: uid.into(),
            owner: owner.into(),
            ports: ports.into(),
        };
        let in_use = InUse {
            highest_copy: Some(2),
            largest_pod: 4,
        };
        let counted = NodeCount::Counted(12);
        let at = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
        let view = PoolView {
            record: record(&pool, vec![holder("a", "ml/a", "w.p=20000-20003")]),
            reused: vec![],
            reuse: 3,
            nodes: Some(NodesView {
                selector: "pool=gpu".into(),
                count: counted.clone(),
                counted_at: Some(at),
                bound: CopyBound::FollowNodes(counted),
                in_use,
                sizes: vec![1, 4],
            }),
            shards: 1,
            warnings: vec![],
        };
        let text = copies_text(&view);
        assert!(text.contains("Node reuse:   follows the nodes"), "{text}");
        assert!(
            text.contains("Nodes:        12 (pool=gpu), counted 2027-01-15T08:00:00Z\n"),
            "{text}"
        );
        // Pods of 1 port are bounded by the largest holder's 4: 4 x 3 reaches 12.
        assert!(
            text.contains(
                "    4 ports  copies 0-2; copy 3 refused: pods of 4 ports with 3 other holders \
                 per port could be kept off 12 of the pool's 12 nodes\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("    1 port   copies 0-2; copy 3 refused: pods of 4 ports (the pool's largest; this holder's have 1)"),
            "{text}"
        );
    }
}

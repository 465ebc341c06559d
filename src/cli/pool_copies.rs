//! The part of `pool describe` about node reuse: the pool's copies, how full each is, who holds
//! ports in the copies past the first, and what reuse costs the scheduler.

use std::fmt::Write as _;

use super::output::bar;
use crate::k8s::PoolView;

/// The copies section, printed after the rest of `pool describe` for a pool with reuse.
pub fn copies_text(view: &PoolView) -> String {
    let mut out = String::new();
    let reuse = view.reuse;
    let size = view.record.state.size();
    let _ = writeln!(
        out,
        "Node reuse:   {reuse} (each port may be held by up to {reuse} pods, never two on one node)"
    );
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
    let _ = writeln!(
        out,
        "Scheduling:   a pod with k ports is kept off at most k x {} nodes (the other copies' \
         holders of its ports); pods must declare their ports as hostPorts (the pod webhook does)",
        reuse.saturating_sub(1)
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
                guard: None,
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
}

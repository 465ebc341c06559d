//! Rules about pools as a whole, as opposed to one pool's holders: which pools share ports.
//!
//! Ports are unique among the holders of one pool only, so two pools of one protocol that share
//! a port could hand it to two workloads. A pool's ports here are its `spec.ranges` as written:
//! an exclusion makes no room (the port is still the pool's, and is handed out once
//! un-excluded). The same rule as the portalloc-pool-overlap admission policy
//! (rbac/portalloc-pool-overlap-policy.yaml), which refuses new overlaps; this finds the ones
//! written before it, or with it absent.

use kube::ResourceExt;

use crate::api::{PortPool, PortPoolSpec, Protocol};
use crate::core::PortSet;

/// An existing pool a new one would share ports with.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolOverlap {
    pub other: String,
    pub other_ports: PortSet,
    /// The ports both pools' ranges list.
    pub shared: PortSet,
}

/// The ports of a pool's `spec.ranges`, exclusions not taken off; `None` when they do not
/// parse (the API server refuses such a spec).
pub fn ranges_of(spec: &PortPoolSpec) -> Option<PortSet> {
    let texts: Vec<&str> = spec.ranges.iter().map(|r| r.as_str()).collect();
    PortSet::parse_list(&texts).ok()
}

/// The ports both sets hold.
pub fn shared_ports(a: &PortSet, b: &PortSet) -> PortSet {
    a.subtract(&a.subtract(b))
}

/// Whether two pools may share ports: both say so (`spec.allowOverlap`), or their protocols
/// differ (ports of different protocols never conflict).
pub fn may_share(a: &PortPoolSpec, b: &PortPoolSpec) -> bool {
    a.protocol != b.protocol || (a.allow_overlap && b.allow_overlap)
}

/// The first pool of the same protocol (another name) whose ranges meet those of `spec`,
/// unless both allow it: a port could then be handed out by both.
pub fn overlapping_pool(
    name: &str,
    spec: &PortPoolSpec,
    existing: &[PortPool],
) -> Option<PoolOverlap> {
    let mine = ranges_of(spec)?;
    existing
        .iter()
        .filter(|other| other.name_any() != name && !may_share(spec, &other.spec))
        .find_map(|other| {
            let theirs = ranges_of(&other.spec)?;
            let shared = shared_ports(&mine, &theirs);
            (!shared.is_empty()).then(|| PoolOverlap {
                other: other.name_any(),
                other_ports: theirs,
                shared,
            })
        })
}

/// Two pools that share ports without both allowing it.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedPorts {
    pub pool: String,
    pub other: String,
    pub protocol: Protocol,
    pub shared: PortSet,
}

impl SharedPorts {
    /// "port P" or "ports A-B,C".
    pub fn ports(&self) -> String {
        format!("{} {}", ports_word(&self.shared), self.shared)
    }

    /// One line for a person, from `pool`'s side: what is shared, and what to do.
    pub fn describe(&self) -> String {
        format!(
            "PortPool {} shares {} {} with PortPool {}: each pool may hand such a port to a \
             workload of its own; change the ranges of one of them, or set spec.allowOverlap: \
             true on both if their pods never run on one node",
            self.pool,
            self.protocol,
            self.ports(),
            self.other
        )
    }
}

fn ports_word(set: &PortSet) -> &'static str {
    if set.len() == 1 { "port" } else { "ports" }
}

/// Every overlap among `pools`, once per pool involved (so `a`'s list and `b`'s both show
/// the pair), ordered by pool, then other pool. Pools whose ranges do not parse are skipped.
pub fn all_overlaps(pools: &[PortPool]) -> Vec<SharedPorts> {
    let parsed: Vec<(String, &PortPoolSpec, PortSet)> = pools
        .iter()
        .filter_map(|p| Some((p.name_any(), &p.spec, ranges_of(&p.spec)?)))
        .collect();
    let mut found = Vec::new();
    for (i, (a, a_spec, a_ports)) in parsed.iter().enumerate() {
        for (b, b_spec, b_ports) in &parsed[i + 1..] {
            if a == b || may_share(a_spec, b_spec) {
                continue;
            }
            if !a_ports.overlaps(b_ports) {
                continue;
            }
            let shared = shared_ports(a_ports, b_ports);
            for (pool, other) in [(a, b), (b, a)] {
                found.push(SharedPorts {
                    pool: pool.clone(),
                    other: other.clone(),
                    protocol: a_spec.protocol,
                    shared: shared.clone(),
                });
            }
        }
    }
    found.sort_by(|x, y| (&x.pool, &x.other).cmp(&(&y.pool, &y.other)));
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::StaticBandSetting;

    fn pool(name: &str, ranges: &[&str], protocol: Protocol) -> PortPool {
        PortPool::new(
            name,
            PortPoolSpec {
                ranges: ranges.iter().map(|r| (*r).into()).collect(),
                exclude: vec![],
                protocol,
                static_band: StaticBandSetting::Auto,
                node_reuse: None,
                follow_nodes: None,
                guard: None,
                allow_overlap: false,
            },
        )
    }

    #[test]
    fn only_pools_of_the_same_protocol_overlap() {
        let existing = [
            pool("udp", &["100-200"], Protocol::Udp),
            pool("tcp", &["150-160"], Protocol::Tcp),
        ];
        let new = pool("new", &["120-155"], Protocol::Tcp);
        let overlap = overlapping_pool("new", &new.spec, &existing).unwrap();
        assert_eq!(overlap.other, "tcp");
        assert_eq!(overlap.other_ports.to_string(), "150-160");
        assert_eq!(overlap.shared.to_string(), "150-155");
        let disjoint = pool("d", &["300-400"], Protocol::Tcp);
        assert_eq!(overlapping_pool("d", &disjoint.spec, &existing), None);
    }

    #[test]
    fn a_pool_does_not_overlap_itself_and_exclusions_make_no_room() {
        let mut old = pool("a", &["49000-49009"], Protocol::Tcp);
        // The same name: the pool being replaced, not another one.
        assert_eq!(overlapping_pool("a", &old.spec, &[old.clone()]), None);
        // An exclusion over the shared ports does not make them the other pool's.
        old.spec.exclude = vec!["49005-49009".into()];
        let new = pool("b", &["49005-49014"], Protocol::Tcp);
        let overlap = overlapping_pool("b", &new.spec, &[old]).unwrap();
        assert_eq!(overlap.shared.to_string(), "49005-49009");
    }

    #[test]
    fn pools_share_ports_only_when_both_allow_it() {
        let mut a = pool("a", &["49000-49009"], Protocol::Tcp);
        let mut b = pool("b", &["49005-49014"], Protocol::Tcp);
        a.spec.allow_overlap = true;
        assert!(overlapping_pool("b", &b.spec, std::slice::from_ref(&a)).is_some());
        assert_eq!(all_overlaps(&[a.clone(), b.clone()]).len(), 2);
        b.spec.allow_overlap = true;
        assert_eq!(
            overlapping_pool("b", &b.spec, std::slice::from_ref(&a)),
            None
        );
        assert_eq!(all_overlaps(&[a, b]), vec![]);
    }

    #[test]
    fn every_overlap_is_listed_from_both_sides() {
        let pools = [
            pool("c", &["49100-49200"], Protocol::Tcp),
            pool("a", &["49000-49009", "49150"], Protocol::Tcp),
            pool("b", &["49005-49014"], Protocol::Tcp),
            pool("u", &["49000-49200"], Protocol::Udp),
        ];
        let found = all_overlaps(&pools);
        let seen: Vec<(&str, &str, String)> = found
            .iter()
            .map(|s| (s.pool.as_str(), s.other.as_str(), s.shared.to_string()))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("a", "b", "49005-49009".to_string()),
                ("a", "c", "49150".to_string()),
                ("b", "a", "49005-49009".to_string()),
                ("c", "a", "49150".to_string()),
            ]
        );
        assert_eq!(
            found[1].describe(),
            "PortPool a shares TCP port 49150 with PortPool c: each pool may hand such a port to \
             a workload of its own; change the ranges of one of them, or set spec.allowOverlap: \
             true on both if their pods never run on one node"
        );
    }
}

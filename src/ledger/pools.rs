//! Rules about pools as a whole, as opposed to one pool's holders.

use kube::ResourceExt;

use crate::api::{PortPool, PortPoolSpec};
use crate::core::PortSet;

/// An existing pool a new one would share ports with.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolOverlap {
    pub other: String,
    pub other_ports: PortSet,
}

/// The first pool of the same protocol whose ports overlap `ports`: a port could then be handed
/// out by both, since uniqueness holds per pool. Pools whose own spec is unusable are skipped.
pub fn overlapping_pool(
    spec: &PortPoolSpec,
    ports: &PortSet,
    existing: &[PortPool],
) -> Option<PoolOverlap> {
    existing
        .iter()
        .filter(|other| other.spec.protocol == spec.protocol)
        .find_map(|other| {
            let theirs = other.spec.port_set().ok()?;
            ports.overlaps(&theirs).then(|| PoolOverlap {
                other: other.name_any(),
                other_ports: theirs,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Protocol, StaticBandSetting};

    fn pool(name: &str, range: &str, protocol: Protocol) -> PortPool {
        PortPool::new(
            name,
            PortPoolSpec {
                ranges: vec![range.into()],
                exclude: vec![],
                protocol,
                static_band: StaticBandSetting::Auto,
                node_reuse: None,
                follow_nodes: None,
                guard: None,
            },
        )
    }

    #[test]
    fn only_pools_of_the_same_protocol_overlap() {
        let existing = [
            pool("udp", "100-200", Protocol::Udp),
            pool("tcp", "150-160", Protocol::Tcp),
        ];
        let new = pool("new", "120-155", Protocol::Tcp);
        let ports = new.spec.port_set().unwrap();
        let overlap = overlapping_pool(&new.spec, &ports, &existing).unwrap();
        assert_eq!(overlap.other, "tcp");
        assert_eq!(overlap.other_ports.to_string(), "150-160");
        let disjoint = pool("d", "300-400", Protocol::Tcp);
        let ports = disjoint.spec.port_set().unwrap();
        assert_eq!(overlapping_pool(&disjoint.spec, &ports, &existing), None);
    }
}

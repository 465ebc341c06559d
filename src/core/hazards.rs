//! Port ranges that are risky to hand out on hostNetwork, and why.

use super::range::{PortRange, PortSet};

/// Linux's default `net.ipv4.ip_local_port_range`: outgoing connections take source ports from
/// here, so a listener may find its port already in use by a client socket.
pub const LINUX_EPHEMERAL: PortRange = PortRange {
    first: 32768,
    last: 60999,
};

/// The default `--service-node-port-range`: kube-proxy forwards these ports on every node, so a
/// hostNetwork listener on one never sees the traffic of a NodePort Service that uses it.
pub const DEFAULT_NODE_PORTS: PortRange = PortRange {
    first: 30000,
    last: 32767,
};

/// One warning about a pool's ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hazard {
    pub overlap: PortSet,
    pub message: String,
}

/// Warnings for a pool's port set; empty when it avoids both ranges.
pub fn hazards(ports: &PortSet) -> Vec<Hazard> {
    let mut found = Vec::new();
    let checks = [
        (
            LINUX_EPHEMERAL,
            "overlap the Linux ephemeral range 32768-60999 (net.ipv4.ip_local_port_range): a listener can find its port taken by an outgoing connection; reserve them with net.ipv4.ip_local_reserved_ports or move the pool",
        ),
        (
            DEFAULT_NODE_PORTS,
            "overlap the default NodePort range 30000-32767: kube-proxy forwards a NodePort Service's port on every node, so a hostNetwork listener there never sees that traffic",
        ),
    ];
    for (range, why) in checks {
        let overlap = ports.subtract(&ports.subtract(&PortSet::from_ranges([range])));
        if !overlap.is_empty() {
            found.push(Hazard {
                message: format!("{} ports ({overlap}) {why}", overlap.len()),
                overlap,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_exact_overlaps() {
        let pool = PortSet::parse_list(&["30000-30010", "40000-40004", "20000-20010"]).unwrap();
        let found = hazards(&pool);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].overlap.to_string(), "40000-40004");
        assert!(
            found[0]
                .message
                .starts_with("5 ports (40000-40004) overlap the Linux ephemeral range")
        );
        assert_eq!(found[1].overlap.to_string(), "30000-30010");
        assert!(hazards(&PortSet::parse_list(&["20000-29999"]).unwrap()).is_empty());
    }
}

//! Which copies of its ports a pool lets a holder use (docs/node-reuse.md, "Copies that follow
//! the nodes"). Pure.
//!
//! A holder of a port in one copy keeps every holder of that port in another copy off its
//! node (kube-scheduler's NodePorts filter, through the hostPorts the pod webhook declares).
//! So a pod with k ports, each held by h other pods, may be kept off k x h nodes. Copies fill
//! in order, so conservatively every port is held in every copy in use: a holder placed in
//! copy c has h = max(c, highest copy in use) other holders of each of its ports.
//!
//! - `nodeReuse: N` (fixed): copies 0..N, whatever the nodes; the cost is the user's to judge.
//! - `followNodes`: a holder whose largest pod has k ports may go to copy c only while
//!   `max(k, k_max) x max(c, highest copy in use) < nodes`, k_max being the largest pod of the
//!   holders already in the pool (they must stay schedulable too) and `nodes` those counted
//!   able to run the pool's pods. Never counted: copy 0 only, as without reuse. Copy 0 while no
//!   other copy is in use excludes nobody and is always allowed.

use std::ops::Range;

/// The most copies a pool may keep: a shard's copy number is 0-255.
pub const MAX_COPIES: u16 = 256;

/// How a pool bounds its copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyBound {
    /// `nodeReuse: N`: copies 0..N.
    Fixed(u16),
    /// `followNodes`: by the nodes able to run the pool's pods, when counted.
    FollowNodes(NodeCount),
}

/// The nodes a follow-nodes pool counts, or why there is no count.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NodeCount {
    Counted(u32),
    /// Never counted; why (no watcher keeps `status.nodes`, and this client may not list
    /// nodes, ...).
    Unknown(String),
}

/// The pool as a new placement finds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InUse {
    /// The highest copy holding a port; `None`: nothing is held.
    pub highest_copy: Option<u16>,
    /// The most ports one pod of any holder has (see `Holdings::ports_per_pod`).
    pub largest_pod: u32,
}

/// Why a holder may not take new ports in a copy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CopyRefusal {
    /// Past a fixed `nodeReuse`.
    #[error("copy {copy} is past the pool's nodeReuse {reuse} (copies 0-{})", .reuse - 1)]
    BeyondReuse { copy: u16, reuse: u16 },

    /// A follow-nodes pool whose nodes were never counted: copy 0 only.
    #[error(
        "copy {copy} refused: the pool follows the nodes, but they are not counted ({why}), so \
         only copy 0 is used"
    )]
    NodesUncounted { copy: u16, why: String },

    /// The rule: `ports_per_pod x other_holders` would reach the nodes counted.
    #[error(
        "copy {copy} refused: pods of {ports_per_pod} {}{largest} with {other_holders} other \
         {} per port could be kept off {} of the pool's {nodes} nodes{product}",
        plural(*.ports_per_pod, "port"),
        plural(u32::from(*.other_holders), "holder"),
        .ports_per_pod.saturating_mul(u32::from(*.other_holders)).min(*.nodes),
        largest = largest_note(*.ports_per_pod, *.own_ports_per_pod),
        product = product_note(*.ports_per_pod, *.other_holders, *.nodes)
    )]
    NodeBound {
        copy: u16,
        /// max(the holder's, the largest already in the pool).
        ports_per_pod: u32,
        /// The holder's own.
        own_ports_per_pod: u32,
        other_holders: u16,
        nodes: u32,
    },

    /// Copy numbers end at 255.
    #[error("copy {copy} refused: a pool keeps at most {MAX_COPIES} copies")]
    PastLastCopy { copy: u16 },
}

fn plural(n: u32, word: &str) -> String {
    if n == 1 {
        word.to_string()
    } else {
        format!("{word}s")
    }
}

fn largest_note(ports: u32, own: u32) -> String {
    if own < ports {
        format!(" (the pool's largest; this holder's have {own})")
    } else {
        String::new()
    }
}

fn product_note(ports: u32, others: u16, nodes: u32) -> String {
    let product = ports.saturating_mul(u32::from(others));
    if product > nodes {
        format!(" ({ports} x {others} = {product})")
    } else {
        String::new()
    }
}

impl CopyBound {
    /// Whether a holder whose largest pod has `ports_per_pod` ports may take new ports in
    /// `copy`, with the pool as `in_use` says.
    pub fn copy_allowed(
        &self,
        copy: u16,
        ports_per_pod: u32,
        in_use: InUse,
    ) -> Result<(), CopyRefusal> {
        let nodes = match self {
            CopyBound::Fixed(reuse) if copy < *reuse => return Ok(()),
            CopyBound::Fixed(reuse) => {
                return Err(CopyRefusal::BeyondReuse {
                    copy,
                    reuse: *reuse,
                });
            }
            CopyBound::FollowNodes(_) if copy >= MAX_COPIES => {
                return Err(CopyRefusal::PastLastCopy { copy });
            }
            CopyBound::FollowNodes(NodeCount::Counted(nodes)) => *nodes,
            CopyBound::FollowNodes(NodeCount::Unknown(_)) if copy == 0 => return Ok(()),
            CopyBound::FollowNodes(NodeCount::Unknown(why)) => {
                return Err(CopyRefusal::NodesUncounted {
                    copy,
                    why: why.clone(),
                });
            }
        };
        let other_holders = copy.max(in_use.highest_copy.unwrap_or(0));
        if other_holders == 0 {
            return Ok(());
        }
        let largest = ports_per_pod.max(in_use.largest_pod).max(1);
        if u64::from(largest) * u64::from(other_holders) < u64::from(nodes) {
            return Ok(());
        }
        Err(CopyRefusal::NodeBound {
            copy,
            ports_per_pod: largest,
            own_ports_per_pod: ports_per_pod,
            other_holders,
            nodes,
        })
    }

    /// How many copies such a holder may use: exactly copies `0..n` are allowed (the allowed
    /// copies are always a prefix). 0 when even copy 0 is refused (other copies are in use and
    /// its pods are too large for the nodes).
    pub fn copies_allowed(&self, ports_per_pod: u32, in_use: InUse) -> u16 {
        let nodes = match self {
            CopyBound::Fixed(reuse) => return *reuse,
            CopyBound::FollowNodes(NodeCount::Unknown(_)) => return 1,
            CopyBound::FollowNodes(NodeCount::Counted(nodes)) => u64::from(*nodes),
        };
        let largest = u64::from(ports_per_pod.max(in_use.largest_pod).max(1));
        let highest = u64::from(in_use.highest_copy.unwrap_or(0));
        if highest > 0 && largest * highest >= nodes {
            return 0;
        }
        // Copy c >= 1 is allowed while c x largest < nodes; copy 0 always is here.
        let past_zero = nodes.saturating_sub(1) / largest;
        (past_zero + 1).min(u64::from(MAX_COPIES)) as u16
    }

    /// The copies a new holder is tried in, in order: those allowed, and for a follow-nodes
    /// pool the first refused one too, so that a holder no allowed copy takes is refused with
    /// the rule's reason (and its figures) rather than as if the pool were simply full.
    pub fn candidates(&self, ports_per_pod: u32, in_use: InUse) -> Range<u16> {
        let allowed = self.copies_allowed(ports_per_pod, in_use);
        match self {
            CopyBound::Fixed(_) => 0..allowed,
            CopyBound::FollowNodes(_) => 0..allowed.saturating_add(1).min(MAX_COPIES),
        }
    }
}

#[cfg(test)]
#[path = "node_bound_tests.rs"]
mod placement_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn follow(nodes: u32) -> CopyBound {
        CopyBound::FollowNodes(NodeCount::Counted(nodes))
    }

    fn in_use(highest: Option<u16>, largest: u32) -> InUse {
        InUse {
            highest_copy: highest,
            largest_pod: largest,
        }
    }

    #[test]
    fn a_fixed_reuse_allows_its_copies_as_before() {
        let bound = CopyBound::Fixed(3);
        assert_eq!(bound.copy_allowed(2, 100, in_use(Some(2), 100)), Ok(()));
        assert_eq!(
            bound.copy_allowed(3, 1, InUse::default()),
            Err(CopyRefusal::BeyondReuse { copy: 3, reuse: 3 })
        );
        assert_eq!(bound.candidates(50, in_use(Some(2), 9)), 0..3);
    }

    #[test]
    fn uncounted_nodes_leave_copy_zero_only_and_say_why() {
        let bound = CopyBound::FollowNodes(NodeCount::Unknown("no watcher".into()));
        assert_eq!(bound.copy_allowed(0, 4, InUse::default()), Ok(()));
        let refused = bound.copy_allowed(1, 4, InUse::default()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "copy 1 refused: the pool follows the nodes, but they are not counted (no watcher), \
             so only copy 0 is used"
        );
        assert_eq!(bound.candidates(4, InUse::default()), 0..2);
    }

    #[test]
    fn twelve_nodes_take_pods_of_four_ports_in_three_copies() {
        let bound = follow(12);
        // Copy 0 alone excludes nobody.
        assert_eq!(bound.copy_allowed(0, 4, InUse::default()), Ok(()));
        // 4 x 1 and 4 x 2 stay under 12 nodes.
        assert_eq!(bound.copy_allowed(1, 4, in_use(Some(0), 4)), Ok(()));
        assert_eq!(bound.copy_allowed(2, 4, in_use(Some(1), 4)), Ok(()));
        let refused = bound.copy_allowed(3, 4, in_use(Some(2), 4)).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "copy 3 refused: pods of 4 ports with 3 other holders per port could be kept off 12 \
             of the pool's 12 nodes"
        );
        assert_eq!(bound.copies_allowed(4, in_use(Some(2), 4)), 3);
        assert_eq!(bound.candidates(4, in_use(Some(2), 4)), 0..4);
    }

    #[test]
    fn the_largest_pod_already_held_bounds_a_small_newcomer() {
        let bound = follow(12);
        let refused = bound.copy_allowed(2, 1, in_use(Some(1), 6)).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "copy 2 refused: pods of 6 ports (the pool's largest; this holder's have 1) with 2 \
             other holders per port could be kept off 12 of the pool's 12 nodes"
        );
        // A large newcomer in copy 0 raises the bound for the holders of copy 1 and more.
        let refused = bound.copy_allowed(0, 13, in_use(Some(1), 1)).unwrap_err();
        assert!(refused.to_string().contains("(13 x 1 = 13)"), "{refused}");
        assert_eq!(bound.copies_allowed(13, in_use(Some(1), 1)), 0);
        assert_eq!(bound.candidates(13, in_use(Some(1), 1)), 0..1);
    }

    #[test]
    fn copies_stop_at_the_last_copy_number() {
        let bound = follow(1_000_000);
        assert_eq!(bound.copies_allowed(1, InUse::default()), MAX_COPIES);
        assert_eq!(bound.copy_allowed(255, 1, in_use(Some(254), 1)), Ok(()));
        assert_eq!(
            bound.copy_allowed(256, 1, in_use(Some(255), 1)),
            Err(CopyRefusal::PastLastCopy { copy: 256 })
        );
        assert_eq!(bound.candidates(1, InUse::default()), 0..MAX_COPIES);
    }

    proptest! {
        /// The allowed copies are exactly `0..copies_allowed`, and every allowed placement
        /// keeps (largest pod) x (other holders of a port) under the nodes counted.
        #[test]
        fn allowed_copies_are_a_prefix_that_keeps_the_bound(
            nodes in 0u32..600,
            own in 0u32..40,
            largest in 0u32..40,
            highest in proptest::option::of(0u16..300),
        ) {
            let bound = follow(nodes);
            let used = in_use(highest.map(|h| h.min(255)), largest);
            let allowed = bound.copies_allowed(own, used);
            for copy in 0..=MAX_COPIES {
                let ok = bound.copy_allowed(copy, own, used).is_ok();
                prop_assert_eq!(ok, copy < allowed, "copy {}", copy);
                if ok {
                    let others = u64::from(copy.max(used.highest_copy.unwrap_or(0)));
                    let k = u64::from(own.max(largest).max(1));
                    prop_assert!(others == 0 || k * others < u64::from(nodes));
                }
            }
            let candidates = bound.candidates(own, used);
            prop_assert_eq!(candidates.start, 0);
            prop_assert!(candidates.end <= MAX_COPIES);
            prop_assert!(candidates.end >= allowed.clamp(1, MAX_COPIES));
        }

        /// More nodes never allow fewer copies.
        #[test]
        fn more_nodes_never_allow_fewer_copies(
            nodes in 0u32..600,
            more in 0u32..600,
            own in 0u32..40,
            highest in proptest::option::of(0u16..255),
        ) {
            let used = in_use(highest, own);
            prop_assert!(
                follow(nodes).copies_allowed(own, used) <= follow(nodes + more).copies_allowed(own, used)
            );
        }
    }
}

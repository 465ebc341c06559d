//! Lasting refusals: a spec, a pool or a port that makes an allocation impossible until someone
//! changes something. Unlike transport trouble, these are recorded on the PortAllocation and
//! running the same command again gives the same answer.

use crate::api::SpecError;
use crate::core::{AllocError, PortBlock, SlotKey};

use super::record::node_bound::{CopyBound, CopyRefusal};
use super::record::window_record::WindowRecord;

/// The CamelCase `reason` of the PortAllocation's conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Every desired port is held.
    Allocated,
    /// Some desired ports are not held yet: a sync has not run since the spec changed.
    Pending,
    /// `kubectl portalloc release` gave ports back on purpose.
    Released,
    PoolFull,
    PortHeld,
    PoolNotFound,
    InvalidSpec,
    InvalidPool,
    /// Any other refusal of the core (a requested port outside the pool, one port requested
    /// twice).
    Refused,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Allocated => "Allocated",
            Reason::Pending => "Pending",
            Reason::Released => "Released",
            Reason::PoolFull => "PoolFull",
            Reason::PortHeld => "PortHeld",
            Reason::PoolNotFound => "PoolNotFound",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::InvalidPool => "InvalidPool",
            Reason::Refused => "Refused",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an allocation cannot happen. Nothing is half-done in any of these cases: the decision
/// is made before anything is written.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("PortAllocation {owner}: {error}")]
    Spec { owner: String, error: SpecError },

    #[error("PortPool {pool:?} has an unusable spec: {error}")]
    PoolSpec { pool: String, error: SpecError },

    #[error(
        "PortPool {pool:?} not found (named in spec.pool of PortAllocation {owner}): create it with \
         `kubectl portalloc pool create {pool} --range A-B`, or list pools with `kubectl portalloc pool get`"
    )]
    PoolNotFound { pool: String, owner: String },

    #[error(
        "PortAllocation {owner}: port {port}{} of pool {pool:?} is already held by {holder} ({slot}): \
         request another port, or leave it unset to get a free one",
        block_note(.block)
    )]
    PortHeld {
        owner: String,
        pool: String,
        port: u16,
        /// The requested block the port is part of, when a block was requested.
        block: Option<PortBlock>,
        holder: String,
        /// `role decode, port metrics, pod index 0`
        slot: String,
    },

    #[error("PortAllocation {owner}: pool {pool:?}: {error}{holders}")]
    Core {
        owner: String,
        pool: String,
        error: Box<AllocError>,
        /// For a full pool: who holds its ports (and, with reuse, that every copy is full).
        holders: String,
    },

    #[error(
        "PortAllocation {owner} holds its ports in copy {copy} of pool {pool:?}, but the pool's \
         nodeReuse is now {reuse}: it may keep or give back ports there but take no more. Set \
         nodeReuse to {} or more again, or release it (kubectl portalloc release) and sync it \
         into one of copies 0-{}",
        .copy + 1,
        .reuse - 1
    )]
    BeyondReuse {
        owner: String,
        pool: String,
        copy: u16,
        reuse: u16,
    },

    /// A pool that follows its nodes refuses the owner new ports in a copy: its pods (or the
    /// pool's largest) could be kept off every node counted, or the nodes are not counted.
    #[error("PortAllocation {owner}: pool {pool:?}: {refusal}. {}", node_advice(.refusal))]
    NodeBound {
        owner: String,
        pool: String,
        refusal: CopyRefusal,
    },
}

fn node_advice(refusal: &CopyRefusal) -> &'static str {
    match refusal {
        CopyRefusal::NodesUncounted { .. } => {
            "Run the watcher (kubectl portalloc sync --watch, or the chart), which keeps \
             status.nodes, or let this identity list nodes"
        }
        _ => {
            "Add nodes the pool's followNodes selector matches (the watcher counts them and the \
             next resync places it), ask for fewer ports per pod, or widen the pool so that \
             fewer copies are needed"
        }
    }
}

impl Refusal {
    /// `owner` may not take new ports in a copy of `pool`, as the pool's copy bound says.
    pub fn of_copy(owner: &str, pool: &str, refusal: CopyRefusal) -> Refusal {
        match refusal {
            CopyRefusal::BeyondReuse { copy, reuse } => Refusal::BeyondReuse {
                owner: owner.into(),
                pool: pool.into(),
                copy,
                reuse,
            },
            refusal => Refusal::NodeBound {
                owner: owner.into(),
                pool: pool.into(),
                refusal,
            },
        }
    }

    /// The reason recorded on the PortAllocation's conditions.
    pub fn reason(&self) -> Reason {
        match self {
            Refusal::Spec { .. } => Reason::InvalidSpec,
            Refusal::PoolSpec { .. } => Reason::InvalidPool,
            Refusal::PoolNotFound { .. } => Reason::PoolNotFound,
            Refusal::PortHeld { .. } => Reason::PortHeld,
            Refusal::Core { error, .. }
                if matches!(
                    **error,
                    AllocError::PoolFull { .. } | AllocError::NoRun { .. }
                ) =>
            {
                Reason::PoolFull
            }
            // No copy its pods may use has room: full, for this owner.
            Refusal::NodeBound { .. } => Reason::PoolFull,
            Refusal::Core { .. } | Refusal::BeyondReuse { .. } => Reason::Refused,
        }
    }

    /// This refusal of copy 0, made when each of the `tried` copies of a pool with reuse
    /// refused: said so.
    pub fn in_every_copy(self, tried: u16, bound: &CopyBound) -> Refusal {
        if tried <= 1 {
            return self;
        }
        let note = match bound {
            CopyBound::Fixed(reuse) => format!(
                " (in copy 0; each of the pool's {} other copies, nodeReuse {reuse}, refused too)",
                tried - 1
            ),
            CopyBound::FollowNodes(_) => format!(
                " (in copy 0; each of the {} other copies its pods may use while following the \
                 pool's nodes refused too)",
                tried - 1
            ),
        };
        self.with_note(&note)
    }

    /// This refusal of the whole workload, after its pods spread over the copies did not fit
    /// either: how far they got, and the first pod that fits nowhere.
    /// `rule`: the pool's refusal of the next copy (`nodeReuse`, or the nodes it follows), when
    /// that copy had room: said, with its figures, since it is what more room alone won't fix.
    pub fn spread_too(
        self,
        placed: usize,
        pods: usize,
        unplaced: &str,
        bound: &CopyBound,
        rule: Option<&CopyRefusal>,
    ) -> Refusal {
        let more_copies = match bound {
            CopyBound::Fixed(_) => "raise its nodeReuse",
            CopyBound::FollowNodes(_) => "add nodes it follows",
        };
        let why = rule.map(|r| format!(" ({r})")).unwrap_or_default();
        self.with_note(&format!(
            "; spread pod by pod over the copies, {placed} of its {pods} pods fit, and pod \
             {unplaced} fits in none{why}: free ports in the pool, {more_copies}, or scale the \
             workload down"
        ))
    }

    /// A pool's refusal with `note` after what it says of the holders (or of the held port).
    fn with_note(self, note: &str) -> Refusal {
        match self {
            Refusal::Core {
                owner,
                pool,
                error,
                holders,
            } => Refusal::Core {
                owner,
                pool,
                error,
                holders: format!("{holders}{note}"),
            },
            Refusal::PortHeld {
                owner,
                pool,
                port,
                block,
                holder,
                slot,
            } => Refusal::PortHeld {
                owner,
                pool,
                port,
                block,
                holder,
                slot: format!("{slot}{note}"),
            },
            other => other,
        }
    }

    /// The input is wrong (as opposed to the pool being unable to serve it).
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Refusal::Spec { .. } | Refusal::PoolSpec { .. })
    }

    /// Add who is involved to a refusal of the core.
    pub fn from_core(error: AllocError, record: &WindowRecord, uid: &str, owner: &str) -> Refusal {
        let pool = record.pool_name().to_string();
        let (port, block) = match error {
            AllocError::Held { port } => (port, None),
            AllocError::BlockHeld { block, port } => (port, Some(block)),
            error @ (AllocError::PoolFull { .. } | AllocError::NoRun { .. }) => {
                return Refusal::Core {
                    owner: owner.into(),
                    pool,
                    error: Box::new(error),
                    holders: holders_summary(record),
                };
            }
            error => {
                return Refusal::Core {
                    owner: owner.into(),
                    pool,
                    error: Box::new(error),
                    holders: String::new(),
                };
            }
        };
        {
            {
                let (holder, slot) = match record.holder_of(port) {
                    Some((holder_uid, _, slot)) if holder_uid == uid => {
                        (format!("{owner} itself"), Some(slot))
                    }
                    Some((_, entry, slot)) => (entry.owner.clone(), Some(slot)),
                    None => ("an unknown holder".to_string(), None),
                };
                let slot = match slot {
                    Some(SlotKey { role, port, index }) => {
                        format!("role {role}, port {port}, pod index {index}")
                    }
                    None => "slot unknown".into(),
                };
                Refusal::PortHeld {
                    owner: owner.into(),
                    pool,
                    port,
                    block,
                    holder,
                    slot,
                }
            }
        }
    }
}

fn block_note(block: &Option<PortBlock>) -> String {
    block
        .map(|b| format!(" (in the requested block {b})"))
        .unwrap_or_default()
}

/// `. Holders: ns/a (12 ports), ns/b (8 ports) and 3 more`, largest first.
fn holders_summary(record: &WindowRecord) -> String {
    let mut holders: Vec<(&str, usize)> = record
        .holders
        .values()
        .map(|h| (h.owner.as_str(), h.holdings.port_count() as usize))
        .collect();
    if holders.is_empty() {
        return String::new();
    }
    holders.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown: Vec<String> = holders
        .iter()
        .take(5)
        .map(|(o, n)| format!("{o} ({n} ports)"))
        .collect();
    let more = holders.len().saturating_sub(5);
    let mut text = format!(". Holders: {}", shown.join(", "));
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

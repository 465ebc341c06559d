//! What a decision needs to know of a PortPool — its name, UID, spec and that spec's
//! generation — taken from the PortPool object, or from the copy every shard carries in its
//! status. The copy is what lets an allocation that lives in one shard read that shard alone.
//!
//! Copies of one pool object are ordered by `generation` (the API server bumps it on every
//! spec change), so of two copies the newer always wins and a write never carries an older
//! spec than the shard had.

use crate::api::{PortPool, PortPoolShard, PortPoolSpec, SpecError};
use crate::core::PortSet;

use super::node_bound::{CopyBound, NodeCount};
use super::windows::WindowLayout;

/// One PortPool as a decision sees it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolSnapshot {
    pub name: String,
    pub uid: String,
    pub generation: i64,
    pub spec: PortPoolSpec,
    /// With `spec.followNodes`: the nodes able to run the pool's pods, from its
    /// `status.nodes` or counted by this client (see `k8s::nodes`); `None`: not known here (a
    /// copy carried by a shard, which has no status of the pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeCount>,
}

impl PoolSnapshot {
    /// The pool object as read.
    pub fn of_pool(pool: &PortPool) -> PoolSnapshot {
        PoolSnapshot {
            name: pool.metadata.name.clone().unwrap_or_default(),
            uid: pool.metadata.uid.clone().unwrap_or_default(),
            generation: pool.metadata.generation.unwrap_or_default(),
            spec: pool.spec.clone(),
            nodes: pool
                .status
                .as_ref()
                .and_then(|status| status.nodes)
                .map(|nodes| NodeCount::Counted(u32::try_from(nodes).unwrap_or(0))),
        }
    }

    /// The copy a shard carries; `None` for a shard never written (created, then its writer
    /// stopped before the status write).
    pub fn of_shard(shard: &PortPoolShard) -> Option<PoolSnapshot> {
        let status = shard.status.as_ref()?;
        Some(PoolSnapshot {
            name: shard.spec.pool.clone(),
            uid: shard.spec.pool_uid.clone(),
            generation: status.pool_generation,
            spec: status.pool_spec.clone()?,
            nodes: None,
        })
    }

    /// The newer of this copy and `other`, when `other` is of the same pool object. The node
    /// count (status, not spec) is kept from whichever has one.
    pub fn newest(self, other: Option<PoolSnapshot>) -> PoolSnapshot {
        match other {
            Some(other) if other.uid == self.uid && other.generation > self.generation => {
                PoolSnapshot {
                    nodes: other.nodes.or(self.nodes),
                    ..other
                }
            }
            Some(other) if other.uid == self.uid && self.nodes.is_none() => PoolSnapshot {
                nodes: other.nodes,
                ..self
            },
            _ => self,
        }
    }

    /// How the pool bounds its copies: `followNodes` by the nodes counted, else `nodeReuse`.
    pub fn copy_bound(&self) -> CopyBound {
        if self.spec.follow_nodes.is_none() {
            return CopyBound::Fixed(self.spec.reuse());
        }
        CopyBound::FollowNodes(self.nodes.clone().unwrap_or_else(|| {
            NodeCount::Unknown(
                "status.nodes is empty: no watcher (sync --watch) has counted them yet".into(),
            )
        }))
    }

    pub fn ports(&self) -> Result<PortSet, SpecError> {
        self.spec.port_set()
    }

    /// Which shard records which of the pool's ports, with each shard's static ports.
    pub fn layout(&self) -> Result<WindowLayout, SpecError> {
        Ok(WindowLayout::new(
            &self.ports()?,
            self.spec.core_static_band(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortPoolShardStatus, StaticBandSetting};
    use crate::ledger::new_shard;

    fn pool(generation: i64, ranges: &str) -> PortPool {
        let mut pool = PortPool::new(
            "p",
            PortPoolSpec {
                ranges: vec![ranges.into()],
                exclude: vec![],
                protocol: Default::default(),
                static_band: StaticBandSetting::None,
                node_reuse: None,
                follow_nodes: None,
                guard: None,
                allow_overlap: false,
            },
        );
        pool.metadata.uid = Some("uid-1".into());
        pool.metadata.generation = Some(generation);
        pool
    }

    #[test]
    fn a_shard_carries_the_copy_it_was_written_under_and_the_newer_copy_wins() {
        let old = PoolSnapshot::of_pool(&pool(1, "30000-30999"));
        let mut shard = new_shard(&old, crate::ledger::ShardKey::first(117));
        assert_eq!(PoolSnapshot::of_shard(&shard), None, "never written");
        let new = PoolSnapshot::of_pool(&pool(2, "30000-31999"));
        shard.status = Some(PortPoolShardStatus {
            pool_generation: new.generation,
            pool_spec: Some(new.spec.clone()),
            ..Default::default()
        });
        let carried = PoolSnapshot::of_shard(&shard).unwrap();
        assert_eq!(carried, new);
        assert_eq!(old.clone().newest(Some(carried.clone())), new);
        assert_eq!(new.clone().newest(Some(old.clone())), new);
        // A copy of another pool object of the same name never replaces ours.
        let other = PoolSnapshot {
            uid: "uid-2".into(),
            generation: 9,
            ..carried
        };
        assert_eq!(old.clone().newest(Some(other)), old);
    }
}

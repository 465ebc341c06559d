//! The record a reader of a pool sees: the union of its shards, copy by copy, with what only the
//! shards show.

use kube::{Client, ResourceExt};

use super::shards::ShardStore;
use crate::api::{PortPool, SpecError};
use crate::k8s::error::KubeError;
use crate::ledger::{PoolRecord, PoolSnapshot, WindowRecord, record_warnings};

/// A pool as `pool describe` and `pool get` show it.
#[derive(Clone, Debug)]
pub struct PoolView {
    /// Copy 0: the whole pool without reuse.
    pub record: WindowRecord,
    /// The other copies (`nodeReuse`), ascending: every copy below the pool's `nodeReuse`
    /// (empty when it has no shard yet), and any past it that still has shards.
    pub reused: Vec<(u16, WindowRecord)>,
    /// The pool's `nodeReuse`.
    pub reuse: u16,
    /// How many shards were loaded.
    pub shards: usize,
    /// What only the shards show (shards not loaded, ports in the wrong shard, shards that
    /// carry an older spec, ...).
    pub warnings: Vec<String>,
}

impl PoolView {
    /// `Record:` of `pool describe`.
    pub fn record_kind(&self) -> String {
        match self.shards {
            1 => "1 shard".to_string(),
            n => format!("{n} shards"),
        }
    }

    /// Every copy, copy 0 first.
    pub fn copies(&self) -> impl Iterator<Item = (u16, &WindowRecord)> {
        std::iter::once((0, &self.record)).chain(self.reused.iter().map(|(c, r)| (*c, r)))
    }

    /// The copies new holders may use (below `nodeReuse`): what is free is free in these.
    pub fn usable(&self) -> impl Iterator<Item = &WindowRecord> {
        self.copies()
            .filter(|(copy, _)| *copy < self.reuse)
            .map(|(_, record)| record)
    }

    /// Ports held in all copies together.
    pub fn held(&self) -> u32 {
        self.copies().map(|(_, r)| r.state.held_count()).sum()
    }

    /// How many pods may hold ports at once: the pool's size in each of its copies.
    pub fn capacity(&self) -> u32 {
        self.record.state.size() * u32::from(self.reuse)
    }

    /// Holders in all copies together.
    pub fn holders(&self) -> usize {
        self.copies()
            .map(|(_, r)| r.holders.len() + r.opaque.len())
            .sum()
    }
}

/// Reads the pool's shards (one LIST). The inner error: the pool's spec is unusable.
pub async fn pool_view(
    client: &Client,
    pool: PortPool,
) -> Result<Result<PoolView, SpecError>, KubeError> {
    let shards = ShardStore::new(client.clone())
        .list(&pool.name_any())
        .await
        .map_err(|(e, target)| KubeError::from_kube(e, target))?;
    Ok(PoolRecord::load(PoolSnapshot::of_pool(&pool), shards).map(|record| view_of(&record)))
}

/// What readers see of a loaded record.
pub fn view_of(record: &PoolRecord) -> PoolView {
    PoolView {
        record: record.first().union_record(),
        reused: (1..record.reuse())
            .chain(record.copies.keys().copied())
            .collect::<std::collections::BTreeSet<u16>>()
            .into_iter()
            .filter(|&copy| copy > 0)
            .map(|copy| (copy, record.copy_or_empty(copy).union_record()))
            .collect(),
        reuse: record.reuse(),
        shards: record.shard_count(),
        warnings: record_warnings(record),
    }
}

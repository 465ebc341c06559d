//! The record a reader of a pool sees: the union of its shards, with what only the shards show.

use kube::{Client, ResourceExt};

use super::shards::ShardStore;
use crate::api::{PortPool, SpecError};
use crate::k8s::error::KubeError;
use crate::ledger::{CopyRecord, PoolSnapshot, WindowRecord, record_warnings};

/// A pool as `pool describe` and `pool get` show it.
#[derive(Clone, Debug)]
pub struct PoolView {
    pub record: WindowRecord,
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
    Ok(
        CopyRecord::load(PoolSnapshot::of_pool(&pool), shards).map(|sharded| PoolView {
            record: sharded.union_record(),
            shards: sharded.shards.len(),
            warnings: record_warnings(&sharded),
        }),
    )
}

//! The record a reader of a pool sees: the PortPool's own for today's format, the union of its
//! shards for a sharded pool (whose PortPool status counts are not kept current).

use kube::{Client, ResourceExt};

use super::error::KubeError;
use super::shards::ShardStore;
use crate::api::{PortPool, SpecError};
use crate::ledger::{PoolRecord, ShardedRecord, is_sharded, shard_warnings};

/// A pool as `pool describe` and `pool get` show it.
#[derive(Clone, Debug)]
pub struct PoolView {
    pub record: PoolRecord,
    /// `None`: the one-object record; `Some(n)`: sharded, `n` shards loaded.
    pub shards: Option<usize>,
    /// What only the shards show (shards not loaded, ports in the wrong shard, ...).
    pub warnings: Vec<String>,
}

impl PoolView {
    /// `Record:` of `pool describe`.
    pub fn record_kind(&self) -> String {
        match self.shards {
            None => "one object".to_string(),
            Some(n) => format!("sharded, {n} shards"),
        }
    }
}

/// Reads the shards of a sharded pool (one LIST); a pool in today's format needs no read.
/// The inner error: the pool's spec is unusable.
pub async fn pool_view(
    client: &Client,
    pool: PortPool,
) -> Result<Result<PoolView, SpecError>, KubeError> {
    if !is_sharded(&pool) {
        return Ok(PoolRecord::load(pool).map(|record| PoolView {
            record,
            shards: None,
            warnings: Vec::new(),
        }));
    }
    let shards = ShardStore::new(client.clone())
        .list(&pool.name_any())
        .await
        .map_err(|(e, target)| KubeError::from_kube(e, target))?;
    Ok(ShardedRecord::load(pool, shards).map(|sharded| PoolView {
        record: sharded.union_record(),
        shards: Some(sharded.shards.len()),
        warnings: shard_warnings(&sharded),
    }))
}

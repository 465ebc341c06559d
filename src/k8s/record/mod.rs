//! The pool record's I/O: PortPools and their PortPoolShards as stored (reads, the per-shard
//! compare-and-swap writes, pool creation, edits and deletion), the remembered copies that let
//! an allocation skip a read, and a pool's usage as readers see it.

mod cache;
mod listing;
mod pool_change;
mod pool_view;
mod pools;
mod shard_watch;
mod shards;

pub use cache::{ObjectCache, PoolCache, ShardCache, cluster_cache_dir};
pub use listing::{Listing, ListingCache};
pub use pool_change::{PoolPlan, apply_pool, plan_pool};
pub use pool_view::{NodesView, PoolView, pool_port_states, pool_view};
pub(crate) use pools::read_pool;
pub use pools::{
    Applied, DeletedPool, PoolError, carry_spec, create_or_keep_pool, create_pool, delete_pool,
    get_pool, list_pools, list_pools_matching, pool_overlaps_of, pool_ports,
};
pub use shard_watch::{ShardVersions, keep_copies_current};
pub use shards::ShardStore;

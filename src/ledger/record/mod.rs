//! The pool's record: its PortPoolShards read into one record per copy of its ports, and the
//! writes that commit a decision. See the ledger's own page ([`crate::ledger`]) for each file.

pub(super) mod copy_record;
pub(super) mod elsewhere;
pub(super) mod holdings_across_shards;
pub(super) mod known_shards;
pub mod node_bound;
pub(super) mod pool_record;
pub(super) mod pool_snapshot;
pub(super) mod record_warnings;
pub(super) mod shard_record;
pub(super) mod window_record;
pub(super) mod windows;
pub(super) mod windows_by_uid;

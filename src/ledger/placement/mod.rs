//! Placement: which window and which copy of a pool an owner's new ports go to, and where in
//! them. [`shard_choice`] decides a batch of owners over the pool's record, [`batch_steps`] in
//! steps whose writes go while the next is decided; [`home_fit`] and
//! [`window_choice`] say when an owner leaves its home window and where it goes instead;
//! [`block_end`] sorts blocks by length toward the pool's two ends; [`free_runs`] measures the
//! runs a block would cut across window edges; [`spread`] places pods over the copies of a pool
//! whose ports serve several nodes. Pure.

pub(super) mod batch_steps;
pub(super) mod block_end;
pub(super) mod free_runs;
pub(super) mod home_fit;
pub(super) mod shard_choice;
pub(super) mod spread;
pub(super) mod window_choice;

//! Client-side allocation: the [`Allocator`] and the paths that read a pool's record, decide with
//! the ledger and commit with compare-and-swap — one PortAllocation at a time (`sync`, with its
//! loop over the shards in `commit` and its path through the whole pool in `whole_pool`), many
//! at once (`batch`, its pass 2's decision overlapped with its status widenings in `widening`
//! or, step after step, with its own writes in `stepped`, and the watcher's `group_commit`),
//! the dry runs (`preview`) — plus what follows an allocation: the PortAllocation objects
//! themselves (`allocations`: apply, delete, list) and the env-file ConfigMaps (`configmaps`).

mod allocations;
mod allocator;
mod batch;
mod commit;
mod configmaps;
mod elsewhere;
mod finishing;
mod group_commit;
mod precheck;
mod preview;
mod stepped;
mod sync;
mod watched;
mod whole_pool;
mod widening;

pub(crate) use allocations::list_in_pages;
pub use allocations::{
    ApplyError, DeleteError, Deleted, apply_allocation, delete_allocation, get_allocation,
    list_allocations, list_allocations_matching,
};
pub use allocator::{AllocateError, Allocator};
pub use configmaps::{ConfigMapChange, ConfigMapError, EnvConfigMap, apply_configmap};
pub use group_commit::GroupCommit;
pub use preview::{DryRun, Intent, Preview, preview, preview_pool};
pub use sync::SyncReport;
pub use watched::{Lent, WatchedAllocations};

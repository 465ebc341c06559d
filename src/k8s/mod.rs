//! The Kubernetes layer: the client, errors, the one retry driver, and the loops that read,
//! decide (with [`crate::ledger`]) and write. Every write that protects consistency lives here:
//! the shard compare-and-swaps of allocation and repair, pool creation and deletion, and the
//! create-then-allocate of a manifest.

mod allocations;
mod allocator;
mod batch;
mod client;
mod combiner;
mod commit;
mod configmaps;
mod crds;
mod error;
mod metrics;
mod pool_cache;
mod pool_view;
mod pools;
mod preview;
mod repair;
mod resources;
mod retry;
mod shards;
mod watch;
mod webhook;
mod webhook_tls;

pub use allocations::{
    ApplyError, DeleteError, Deleted, apply_allocation, delete_allocation, get_allocation,
    list_allocations,
};
pub use allocator::{AllocateError, Allocator, SyncReport};
pub use client::{ClientOptions, Connection, connect};
pub use configmaps::{Change, ConfigMapError, EnvConfigMap, apply_configmap};
pub use crds::install_crds;
pub use error::{ApiErrorKind, KubeError, Target, error_chain};
pub use metrics::{Metrics, SyncResult};
pub use pool_view::{PoolView, pool_view};
pub use pools::{
    Applied, DeletedPool, PoolError, apply_pool, carry_spec, create_pool, delete_pool, get_pool,
    list_pools, pool_ports,
};
pub use preview::{DryRun, Intent, Preview, preview, preview_pool};
pub use repair::{FollowUp, PoolRepair, RepairError, Repairer};
pub use resources::{NAMESPACES, POOLS, Resource, SERVICES, SHARD_STATUS, SHARDS};
pub use retry::{Attempts, Exhausted, RetryCause, RetryPolicy, Stop};
pub use shards::ShardStore;
pub use watch::{Readiness, WatchOptions, check_access, watch};
pub use webhook::{PodWebhook, WEBHOOK_TIMEOUT};
pub use webhook_tls::{ClientConfig, ServingCert, WebhookTlsError, register_webhook, serving_cert};

/// The field manager name our writes are recorded under.
pub const FIELD_MANAGER: &str = "kubectl-portalloc";

/// Parameters of every create and replace: recorded under [`FIELD_MANAGER`] in `managedFields`
/// (without one the API server files our writes under "unknown").
pub(crate) fn write_params() -> kube::api::PostParams {
    kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

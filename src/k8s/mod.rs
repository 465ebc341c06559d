//! The thin Kubernetes layer: clients, reads and compare-and-swap writes. Decisions about which
//! ports to hand out live in [`crate::core`]; this layer only moves state to and from the API.

mod allocation_status;
mod allocator;
mod client;
mod crds;
mod error;
mod pool_record;
mod repair;
mod retry;

pub use allocation_status::{CONDITION_ALLOCATED, Failure, allocation_status, recorded_holdings};
pub use allocator::{AllocateError, Allocator, SyncReport, owner_of, precheck};
pub use client::{ClientOptions, connect};
pub use crds::{crds_installed, install_crds};
pub use error::{ApiErrorKind, KubeError, Op, error_chain, explain};
pub use pool_record::{Anomaly, HolderEntry, PoolRecord};
pub use repair::{
    Change, Finding, FollowUp, FreeReason, PoolRepair, RepairError, RepairPlan, Repairer, Restored,
    plan_repair,
};
pub use retry::{Attempts, RetryCause, RetryPolicy};

/// The field manager name our writes are recorded under.
pub const FIELD_MANAGER: &str = "kubectl-portalloc";

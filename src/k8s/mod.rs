//! The Kubernetes layer: reads, calls the ledger, writes. Its rooms, each using only those above:
//! - plumbing: [`client`](connect), errors ([`KubeError`]), the one retry driver ([`Attempts`]),
//!   the resources we name in messages, and CRD installation;
//! - [`record`]: the pool record's I/O (PortPools, PortPoolShards and their compare-and-swap
//!   writes, remembered copies, usage as readers see it);
//! - [`allocate`]: client-side allocation (one, many, dry runs) and what follows it (the
//!   PortAllocation objects, the env-file ConfigMaps);
//! - `repair`: rebuilding a pool's record from the live PortAllocations;
//! - [`watch`]: `sync --watch`, the same allocation driven by watches, and its metrics; with
//!   `--leader-elect`, only while this replica holds the watcher's Lease (`leader`);
//! - `events`: Kubernetes Events on what the watcher did (allocated, released, refused,
//!   repaired);
//! - [`webhook`]: the pod webhook, whole: its decisions, HTTPS endpoint, certificates and
//!   registration, kept current while it runs;
//! - [`process`]: what the long-running processes share: readiness, the probes (`/healthz`,
//!   `/readyz`, `/metrics`), signals, CPU-bound work off the async workers;
//! - [`node_agent`]: `node-agent`, keeping a node's kernel ([`crate::node`]) in step with the
//!   pools and the pods bound to the node;
//! - [`nodes`]: the Nodes a pool that follows them counts (`spec.followNodes`).
//!
//! Every write that protects consistency lives here: the shard compare-and-swaps of allocation
//! and repair, pool creation and deletion, and the create-then-allocate of a manifest.

pub mod allocate;
mod changes;
mod client;
mod crds;
mod error;
mod events;
mod granting_roles;
mod leader;
mod manifest_checks;
pub mod names;
pub mod node_agent;
pub mod node_ports;
pub mod nodes;
mod pages;
pub mod process;
pub mod record;
mod repair;
mod resources;
mod retry;
pub mod watch;
pub mod webhook;

pub use allocate::{
    AllocateError, Allocator, ApplyError, ConfigMapChange, ConfigMapError, DeleteError, Deleted,
    DryRun, EnvConfigMap, Intent, Preview, SyncReport, apply_allocation, apply_configmap,
    delete_allocation, get_allocation, list_allocations, list_allocations_matching, preview,
    preview_pool,
};
pub use changes::{Seen, changes};
pub use client::{ClientOptions, Connection, connect};
pub use crds::{install_crds, install_overlap_policy};
pub use error::{ApiErrorKind, KubeError, Target, Unreachable, error_chain, render_kube_error};
pub use events::Events;
pub use leader::{LeaderElection, LeaseRef, Lost, default_identity};
pub use manifest_checks::{missing_namespaces, missing_pools};
pub use process::{Metrics, SyncResult};
pub use record::{
    Applied, DeletedPool, NodesView, PoolError, PoolPlan, PoolView, ShardStore, apply_pool,
    carry_spec, create_or_keep_pool, create_pool, delete_pool, get_pool, list_pools,
    list_pools_matching, plan_pool, pool_overlaps_of, pool_ports, pool_view,
};
pub use repair::{FollowUp, PoolRepair, RepairError, Repairer};
pub use resources::{NAMESPACES, POOLS, Resource, SERVICES, SHARD_STATUS, SHARDS};
pub use retry::{Attempts, Exhausted, RetryCause, RetryPolicy, Stop};
pub use watch::{
    Replica, WatchOptions, WatcherProcess, WatcherSettings, WatcherStartError, check_access,
    check_leader_access, watch, watch_as,
};
pub use webhook::{
    CertificateError, ClientConfig, PodWebhook, ServingCert, StartError, WEBHOOK_TIMEOUT,
    WebhookCa, WebhookOptions, WebhookServer, WebhookTlsError, WebhookUrl, register_webhook,
    repair_registration, serving_cert, start_webhook, webhook_ca,
};

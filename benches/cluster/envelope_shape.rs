//! Cell 2s's shape, shared by its parts (`envelope`, `envelope_burst`): the workload, the
//! namespaces and pools of its two sets, and what "Ready" means to it.

use portalloc::api::PortAllocation;

/// Pods per PortAllocation (one role).
pub const REPLICAS: u32 = 10;
/// PodScoped ports per pod.
pub const PORTS_PER_POD: u32 = 5;
/// Copies of each pool: 28 are needed for 750,000 holdings in 27,000 ports.
pub const NODE_REUSE: i32 = 32;
/// Clients creating PortAllocations and pods at once.
pub const CREATORS: usize = 16;

/// The PortAllocations of set A (one `sync --all -A`) and of set B (the watcher), each in a
/// namespace and a pool of that name.
pub const SET_A: &str = "envelope-a";
pub const SET_B: &str = "envelope-b";
/// Where the watcher keeps its webhook's CA Secret.
pub const SYSTEM: &str = "envelope-system";

/// Where the watcher of set B logs (each admission's `took_ms` is read from it).
pub fn watcher_log() -> std::path::PathBuf {
    std::env::temp_dir().join("2s-watcher.log")
}

/// Synced for its current spec, and Ready.
pub fn is_ready(pa: &PortAllocation) -> bool {
    pa.status.as_ref().is_some_and(|s| {
        s.observed_generation == pa.metadata.generation
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

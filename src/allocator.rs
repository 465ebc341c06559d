//! The process's memory allocator on Linux: jemalloc, handing freed pages back at once.
//!
//! The watcher reads a pool's whole record every round: thousands of shards decoded into small
//! strings and maps, then dropped. glibc's malloc keeps what such churn frees: after 4,500
//! PortAllocations synced from empty, `malloc_stats` said 254 MB taken from the system for 54 MB
//! in use, and the peak (VmHWM) was 259-266 MiB. jemalloc returning dirty pages at once
//! (`dirty_decay_ms:0`) peaked at 171-183 MiB in the same run (docs/running.md, "Memory").
//!
//! Capping glibc's arenas at one per worker (`mallopt(M_ARENA_MAX)`) had brought the envelope's
//! peak from 1,286 to 825-1,001 MiB; jemalloc makes that cap moot. `_RJEM_MALLOC_CONF` in the
//! environment still overrides the settings below.

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Read by jemalloc at its start (the crate's build prefixes jemalloc's symbols with `_rjem_`).
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8] = b"dirty_decay_ms:0,muzzy_decay_ms:0\0";

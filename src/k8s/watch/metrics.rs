//! What the in-cluster watcher tells Prometheus (`GET /metrics` on its probe address), in the
//! Prometheus text format, names and units by Prometheus' conventions (base units, `_total`
//! on counters), checked by `promtool check metrics` in the tests.
//!
//! Counters and the sync histogram are bumped as syncs happen; the pool gauges and the count
//! of PortAllocations by phase are refreshed every [`REFRESH`] from the pools' shards (one
//! LIST per pool) and the watcher's own cache of PortAllocations (no request).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::{Api, Client, ResourceExt};

use crate::api::{PortAllocation, PortPool};
use crate::core::Band;
use crate::k8s::record::pool_view;
use crate::ledger::CONDITION_STALLED;

/// How often the pool and PortAllocation gauges are read again.
pub const REFRESH: Duration = Duration::from_secs(10);

/// Upper bounds (seconds) of the sync latency histogram: a one-shard sync takes tens of
/// milliseconds, a conflict-heavy one seconds.
const SYNC_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How a sync ended, the `result` label of `portalloc_syncs_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SyncResult {
    /// Ports were allocated or released.
    Changed,
    /// The record already matched the spec (a status or ConfigMap may still have been written).
    Unchanged,
    /// A lasting refusal (pool full, port held, invalid spec), recorded on the object.
    Refused,
    /// Transport trouble or conflicts outlasting the retries; retried soon.
    Error,
}

impl SyncResult {
    fn label(self) -> &'static str {
        match self {
            SyncResult::Changed => "changed",
            SyncResult::Unchanged => "unchanged",
            SyncResult::Refused => "refused",
            SyncResult::Error => "error",
        }
    }
}

/// A band gauge's name, help, and how to read it.
type BandFamily = (&'static str, &'static str, fn(&BandGauges) -> u32);

/// One band of one pool, as last read.
#[derive(Clone, Debug, PartialEq)]
struct BandGauges {
    size: u32,
    allocated: u32,
    largest_free_run: u32,
}

/// A latency histogram over [`SYNC_BUCKETS`].
#[derive(Default)]
struct Histogram {
    buckets: [u64; SYNC_BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, took: Duration) {
        let seconds = took.as_secs_f64();
        for (count, bound) in self.buckets.iter_mut().zip(SYNC_BUCKETS) {
            if seconds <= bound {
                *count += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str) {
        for (count, bound) in self.buckets.iter().zip(SYNC_BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Default)]
struct Values {
    syncs: BTreeMap<SyncResult, u64>,
    sync_seconds: Histogram,
    admissions: BTreeMap<&'static str, u64>,
    admission_seconds: Histogram,
    conflicts: u64,
    retries: u64,
    watch_restarts: BTreeMap<&'static str, u64>,
    pool_refresh_errors: u64,
    /// (pool, band) -> gauges.
    bands: BTreeMap<(String, &'static str), BandGauges>,
    /// (phase, reason) -> PortAllocations.
    allocations: BTreeMap<(String, String), u64>,
}

/// The watcher's metrics; clones share them.
#[derive(Clone, Default)]
pub struct Metrics(Arc<Mutex<Values>>);

impl Metrics {
    fn with<T>(&self, f: impl FnOnce(&mut Values) -> T) -> T {
        f(&mut self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// One sync: how it ended, how long it took, and its conflicts and attempts.
    pub fn record_sync(&self, result: SyncResult, took: Duration, conflicts: u32, attempts: u32) {
        self.with(|v| {
            *v.syncs.entry(result).or_default() += 1;
            v.sync_seconds.observe(took);
            v.conflicts += u64::from(conflicts);
            v.retries += u64::from(attempts.saturating_sub(1));
        });
    }

    /// One answer of the pod webhook: `allowed`, `denied`, `invalid` (not a pod review) or
    /// `error`.
    pub fn record_admission(&self, result: &'static str, took: Duration) {
        self.with(|v| {
            *v.admissions.entry(result).or_default() += 1;
            v.admission_seconds.observe(took);
        });
    }

    /// A watch stream that failed and starts over (`watch` names which).
    pub fn record_watch_restart(&self, watch: &'static str) {
        self.with(|v| *v.watch_restarts.entry(watch).or_default() += 1);
    }

    /// Count PortAllocations by phase and, for a stalled one, the reason it is stalled.
    pub fn set_allocations<'a>(&self, allocations: impl IntoIterator<Item = &'a PortAllocation>) {
        let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
        for pa in allocations {
            let status = pa.status.as_ref();
            let phase = status
                .and_then(|s| s.phase)
                .map_or("Pending".to_string(), |p| p.to_string());
            let reason = status
                .and_then(|s| {
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == CONDITION_STALLED && c.status == "True")
                })
                .map_or(String::new(), |c| c.reason.clone());
            *counts.entry((phase, reason)).or_default() += 1;
        }
        self.with(|v| v.allocations = counts);
    }

    /// Read every pool's shards and set its band gauges; pools gone since are dropped.
    pub async fn refresh_pools(&self, client: &Client) {
        let pools = match Api::<PortPool>::all(client.clone())
            .list(&Default::default())
            .await
        {
            Ok(pools) => pools.items,
            Err(e) => {
                tracing::debug!("metrics: listing pools: {e}");
                self.with(|v| v.pool_refresh_errors += 1);
                return;
            }
        };
        let mut bands = BTreeMap::new();
        let mut errors = 0;
        for pool in pools {
            let name = pool.name_any();
            let Ok(Ok(view)) = pool_view(client, pool).await else {
                errors += 1;
                continue;
            };
            let state = &view.record.state;
            for (band, label) in [(Band::Static, "static"), (Band::Dynamic, "dynamic")] {
                let usage = state.usage(band);
                let gauges = BandGauges {
                    size: usage.size,
                    allocated: usage.used,
                    largest_free_run: state.largest_free_run(band),
                };
                bands.insert((name.clone(), label), gauges);
            }
        }
        self.with(|v| {
            v.bands = bands;
            v.pool_refresh_errors += errors;
        });
    }

    /// The text exposition format, version 0.0.4.
    pub fn render(&self) -> String {
        self.with(|v| {
            let mut out = String::new();
            let band_gauges: [BandFamily; 4] = [
                ("portalloc_pool_ports", "Ports in the pool's band, after exclusions.", |g| g.size),
                ("portalloc_pool_allocated_ports", "Ports of the band held by PortAllocations.", |g| g.allocated),
                ("portalloc_pool_free_ports", "Ports of the band free to allocate.", |g| g.size - g.allocated),
                (
                    "portalloc_pool_largest_free_run_ports",
                    "The longest run of contiguous free ports in the band: the largest block it can still give.",
                    |g| g.largest_free_run,
                ),
            ];
            for (name, help, value) in band_gauges {
                family(&mut out, name, "gauge", help);
                for ((pool, band), gauges) in &v.bands {
                    let (pool, value) = (escape(pool), value(gauges));
                    let _ = writeln!(out, "{name}{{pool=\"{pool}\",band=\"{band}\"}} {value}");
                }
            }
            let name = family(&mut out, "portalloc_allocations",
                "gauge",
                "PortAllocations in view, by phase and by the reason of a Stalled condition (empty when not stalled).",
            );
            for ((phase, reason), count) in &v.allocations {
                let _ = writeln!(out, "{name}{{phase=\"{phase}\",reason=\"{}\"}} {count}", escape(reason));
            }
            let name = family(&mut out, "portalloc_syncs_total", "counter", "Syncs of PortAllocations by the watcher, by result.");
            for result in [SyncResult::Changed, SyncResult::Unchanged, SyncResult::Refused, SyncResult::Error] {
                let count = v.syncs.get(&result).copied().unwrap_or(0);
                let _ = writeln!(out, "{name}{{result=\"{}\"}} {count}", result.label());
            }
            let name = family(&mut out, "portalloc_sync_duration_seconds",
                "histogram",
                "How long one sync took, from its first read to its last write.",
            );
            v.sync_seconds.render(&mut out, name);
            let name = family(
                &mut out,
                "portalloc_admissions_total",
                "counter",
                "Answers of the pod webhook, by result (allowed, denied, invalid, error).",
            );
            for result in ["allowed", "denied", "invalid", "error"] {
                let count = v.admissions.get(result).copied().unwrap_or(0);
                let _ = writeln!(out, "{name}{{result=\"{result}\"}} {count}");
            }
            let name = family(
                &mut out,
                "portalloc_admission_duration_seconds",
                "histogram",
                "How long the pod webhook took to answer, a sync of a new PortAllocation included.",
            );
            v.admission_seconds.render(&mut out, name);
            let name = family(&mut out, "portalloc_cas_conflicts_total",
                "counter",
                "Writes refused with 409 Conflict (someone wrote the shard or object first), each followed by a new read.",
            );
            let _ = writeln!(out, "{name} {}", v.conflicts);
            let name = family(&mut out, "portalloc_sync_retries_total", "counter", "Attempts beyond the first, over all syncs.");
            let _ = writeln!(out, "{name} {}", v.retries);
            let name = family(&mut out, "portalloc_watch_restarts_total", "counter", "Watch streams that failed and started over, by watch.");
            for watch in ["allocations", "deletions"] {
                let count = v.watch_restarts.get(watch).copied().unwrap_or(0);
                let _ = writeln!(out, "{name}{{watch=\"{watch}\"}} {count}");
            }
            let name = family(&mut out, "portalloc_pool_refresh_errors_total",
                "counter",
                "Pools whose shards could not be read for these metrics.",
            );
            let _ = writeln!(out, "{name} {}", v.pool_refresh_errors);
            out
        })
    }
}

/// The `# HELP` and `# TYPE` lines of a metric family; returns its name for the samples.
fn family<'a>(out: &mut String, name: &'a str, kind: &str, help: &str) -> &'a str {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    name
}

/// A label value as the text format wants it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_the_histogram_add_up() {
        let metrics = Metrics::default();
        metrics.record_sync(SyncResult::Changed, Duration::from_millis(20), 2, 3);
        metrics.record_sync(SyncResult::Unchanged, Duration::from_millis(3), 0, 1);
        metrics.record_sync(SyncResult::Refused, Duration::from_secs(40), 0, 1);
        metrics.record_watch_restart("deletions");
        let text = metrics.render();
        for line in [
            "portalloc_syncs_total{result=\"changed\"} 1",
            "portalloc_syncs_total{result=\"error\"} 0",
            "portalloc_sync_duration_seconds_bucket{le=\"0.005\"} 1",
            "portalloc_sync_duration_seconds_bucket{le=\"0.025\"} 2",
            "portalloc_sync_duration_seconds_bucket{le=\"30\"} 2",
            "portalloc_sync_duration_seconds_bucket{le=\"+Inf\"} 3",
            "portalloc_sync_duration_seconds_count 3",
            "portalloc_cas_conflicts_total 2",
            "portalloc_sync_retries_total 2",
            "portalloc_watch_restarts_total{watch=\"deletions\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

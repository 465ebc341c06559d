//! What the long-running processes tell Prometheus (`GET /metrics` on the probe address): the
//! watcher's syncs and gauges, the pod webhook's answers, the node agent's guarded binds; metric
//! families of the `prometheus` crate in a registry of their own, written by its TextEncoder
//! (the text format 0.0.4), names and units by Prometheus' conventions (base units, `_total` on
//! counters), checked by `promtool check metrics` in the tests.
//!
//! Counters and the histograms are bumped as syncs and admissions happen; the pool gauges and the
//! PortAllocations by phase (and each stalled one by name) are refreshed every [`REFRESH`] from
//! the pools' shards ([`pool_usage`](crate::k8s::watch::pool_usage), one LIST per pool) and
//! the watcher's own cache of PortAllocations (no request).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::ResourceExt;
use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::api::PortAllocation;
use crate::core::Band;
use crate::k8s::watch::pool_usage::{Count, CountedPool};
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
    const ALL: [SyncResult; 4] = [
        SyncResult::Changed,
        SyncResult::Unchanged,
        SyncResult::Refused,
        SyncResult::Error,
    ];

    fn label(self) -> &'static str {
        match self {
            SyncResult::Changed => "changed",
            SyncResult::Unchanged => "unchanged",
            SyncResult::Refused => "refused",
            SyncResult::Error => "error",
        }
    }
}

/// A gauge family whose series are all replaced at each refresh: a series not set again is
/// removed, so it is present exactly while what it counts exists.
struct Replaced {
    family: IntGaugeVec,
    shown: Mutex<BTreeSet<Vec<String>>>,
}

impl Replaced {
    fn new(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Replaced {
        let family = IntGaugeVec::new(Opts::new(name, help), labels).expect(WELL_FORMED);
        registry
            .register(Box::new(family.clone()))
            .expect(WELL_FORMED);
        Replaced {
            family,
            shown: Mutex::default(),
        }
    }

    /// Set every series of `values` (label values in the family's label order), remove the rest.
    fn replace(&self, values: BTreeMap<Vec<String>, i64>) {
        let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        for (labels, value) in &values {
            self.family.with_label_values(&strs(labels)).set(*value);
        }
        for gone in shown.iter().filter(|labels| !values.contains_key(*labels)) {
            // Already absent is fine: nothing else removes series of this family.
            let _ = self.family.remove_label_values(&strs(gone));
        }
        *shown = values.into_keys().collect();
    }
}

fn strs(labels: &[String]) -> Vec<&str> {
    labels.iter().map(String::as_str).collect()
}

/// Registering fixed, distinct, well-formed families cannot fail (the unit tests register them).
const WELL_FORMED: &str = "metric families are distinct and well formed";

/// Makes each family and registers it in the watcher's own registry.
struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn register<M: Collector + Clone + 'static>(&self, metric: M) -> M {
        self.0
            .register(Box::new(metric.clone()))
            .expect(WELL_FORMED);
        metric
    }

    /// A gauge family by pool and band (static or dynamic).
    fn band(&self, name: &str, help: &str) -> Replaced {
        Replaced::new(self.0, name, help, &["pool", "band"])
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::new(name, help).expect(WELL_FORMED))
    }

    /// Counters by label start at 0 for every value, so a rate() sees the first increment.
    fn counters(&self, name: &str, help: &str, label: &str, values: &[&str]) -> IntCounterVec {
        let family = IntCounterVec::new(Opts::new(name, help), &[label]).expect(WELL_FORMED);
        for value in values {
            family.with_label_values(&[*value]);
        }
        self.register(family)
    }

    fn histogram(&self, name: &str, help: &str) -> Histogram {
        let opts = HistogramOpts::new(name, help).buckets(SYNC_BUCKETS.to_vec());
        self.register(Histogram::with_opts(opts).expect(WELL_FORMED))
    }
}

/// The gauges the watcher's work keeps, refreshed every [`REFRESH`]: a replica that stops
/// doing that work drops them all.
struct WorkGauges {
    pool_ports: Replaced,
    pool_allocated: Replaced,
    pool_free: Replaced,
    pool_largest_free_run: Replaced,
    pool_overlap: Replaced,
    allocations: Replaced,
    stalled: Replaced,
}

impl WorkGauges {
    fn register(r: &Registrar) -> WorkGauges {
        WorkGauges {
            pool_ports: r.band(
                "portalloc_pool_ports",
                "Ports in the pool's band, after exclusions.",
            ),
            pool_allocated: r.band(
                "portalloc_pool_allocated_ports",
                "Ports of the band held by PortAllocations.",
            ),
            pool_free: r.band(
                "portalloc_pool_free_ports",
                "Ports of the band free to allocate.",
            ),
            pool_largest_free_run: r.band(
                "portalloc_pool_largest_free_run_ports",
                "The longest run of contiguous free ports in the band: the largest block it can still give.",
            ),
            // A series only while two pools overlap: the cardinality is that of the problems.
            pool_overlap: Replaced::new(
                r.0,
                "portalloc_pool_overlap_ports",
                "Ports the pool's ranges share with another pool of its protocol (other) without both allowing it (spec.allowOverlap): each pool may hand such a port to a workload of its own. No series while none does.",
                &["pool", "other"],
            ),
            allocations: Replaced::new(
                r.0,
                "portalloc_allocations",
                "PortAllocations in view, by phase and by the reason of a Stalled condition (empty when not stalled).",
                &["phase", "reason"],
            ),
            // The cardinality is that of the problems: a series only while an object is stalled.
            stalled: Replaced::new(
                r.0,
                "portalloc_allocation_stalled",
                "1 for each PortAllocation whose Stalled condition is True, by its namespace, name and the condition's reason; no series for one that is not stalled.",
                &["namespace", "name", "reason"],
            ),
        }
    }

    fn all(&self) -> [&Replaced; 7] {
        [
            &self.pool_ports,
            &self.pool_allocated,
            &self.pool_free,
            &self.pool_largest_free_run,
            &self.pool_overlap,
            &self.allocations,
            &self.stalled,
        ]
    }
}

/// Counters and histograms, bumped as syncs, admissions, watch restarts and guarded binds
/// happen.
struct Activity {
    syncs: IntCounterVec,
    sync_seconds: Histogram,
    admissions: IntCounterVec,
    admission_seconds: Histogram,
    conflicts: IntCounter,
    retries: IntCounter,
    watch_restarts: IntCounterVec,
    pool_refresh_errors: IntCounter,
    guard_binds: IntCounterVec,
    events_dropped: IntCounter,
}

impl Activity {
    fn register(r: &Registrar) -> Activity {
        Activity {
            syncs: r.counters(
                "portalloc_syncs_total",
                "Syncs of PortAllocations by the watcher, by result.",
                "result",
                &SyncResult::ALL.map(SyncResult::label),
            ),
            sync_seconds: r.histogram(
                "portalloc_sync_duration_seconds",
                "How long one sync took, from its first read to its last write.",
            ),
            admissions: r.counters(
                "portalloc_admissions_total",
                "Answers of the pod webhook, by result (allowed, denied, invalid, error).",
                "result",
                &["allowed", "denied", "invalid", "error"],
            ),
            admission_seconds: r.histogram(
                "portalloc_admission_duration_seconds",
                "How long the pod webhook took to answer, a sync of a new PortAllocation included.",
            ),
            conflicts: r.counter(
                "portalloc_cas_conflicts_total",
                "Writes refused with 409 Conflict (someone wrote the shard or object first), each followed by a new read.",
            ),
            retries: r.counter(
                "portalloc_sync_retries_total",
                "Attempts beyond the first, over all syncs.",
            ),
            watch_restarts: r.counters(
                "portalloc_watch_restarts_total",
                "Watch streams that failed and started over, by watch.",
                "watch",
                &["allocations", "deletions"],
            ),
            pool_refresh_errors: r.counter(
                "portalloc_pool_refresh_errors_total",
                "Pools whose shards could not be read for these metrics.",
            ),
            events_dropped: r.counter(
                "portalloc_events_dropped_total",
                "Events not sent because as many as the watcher keeps were already waiting.",
            ),
            // Pools and verdicts appear as binds are seen: no series made up front.
            guard_binds: r.register(
                IntCounterVec::new(
                    Opts::new(
                        "portalloc_node_guard_binds_total",
                        "Binds of guarded pool ports by pods that do not hold them, seen by the node agent: refused (Enforce), audited (Audit), or taken before the agent saw the pod.",
                    ),
                    &["pool", "verdict"],
                )
                .expect(WELL_FORMED),
            ),
        }
    }
}

struct Families {
    registry: Registry,
    work: WorkGauges,
    activity: Activity,
    leader: IntGauge,
}

impl Families {
    fn new() -> Families {
        let registry = Registry::new();
        let r = Registrar(&registry);
        let work = WorkGauges::register(&r);
        let activity = Activity::register(&r);
        let leader = r.register(
            IntGauge::new(
                "portalloc_leader",
                "1 while this replica does the watcher's work (syncs, repair, usage count): it holds the Lease (--leader-elect), or runs without election; 0 while it only serves the webhook.",
            )
            .expect(WELL_FORMED),
        );
        Families {
            registry,
            work,
            activity,
            leader,
        }
    }
}

/// The watcher's metrics; clones share them.
#[derive(Clone)]
pub struct Metrics(Arc<Families>);

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics(Arc::new(Families::new()))
    }
}

impl Metrics {
    /// One sync: how it ended, how long it took, and its conflicts and attempts.
    pub fn record_sync(&self, result: SyncResult, took: Duration, conflicts: u32, attempts: u32) {
        let m = &self.0.activity;
        m.syncs.with_label_values(&[result.label()]).inc();
        m.sync_seconds.observe(took.as_secs_f64());
        m.conflicts.inc_by(u64::from(conflicts));
        m.retries.inc_by(u64::from(attempts.saturating_sub(1)));
    }

    /// One answer of the pod webhook: `allowed`, `denied`, `invalid` (not a pod review) or
    /// `error`.
    pub fn record_admission(&self, result: &'static str, took: Duration) {
        let m = &self.0.activity;
        m.admissions.with_label_values(&[result]).inc();
        m.admission_seconds.observe(took.as_secs_f64());
    }

    /// `count` binds of a port of `pool` judged `verdict` by the node agent's guard.
    pub fn record_guard_bind(&self, pool: &str, verdict: &str, count: u64) {
        self.0
            .activity
            .guard_binds
            .with_label_values(&[pool, verdict])
            .inc_by(count);
    }

    /// A watch stream that failed and starts over (`watch` names which).
    pub fn record_watch_restart(&self, watch: &'static str) {
        self.0
            .activity
            .watch_restarts
            .with_label_values(&[watch])
            .inc();
    }

    /// Count PortAllocations by phase and, for a stalled one, the reason it is stalled; and name
    /// each stalled one.
    pub fn set_allocations<'a>(&self, allocations: impl IntoIterator<Item = &'a PortAllocation>) {
        let mut counts: BTreeMap<Vec<String>, i64> = BTreeMap::new();
        let mut stalled = BTreeMap::new();
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
                .map(|c| c.reason.clone());
            if let Some(reason) = &reason {
                let object = vec![pa.namespace().unwrap_or_default(), pa.name_any()];
                stalled.insert([object, vec![reason.clone()]].concat(), 1);
            }
            *counts
                .entry(vec![phase, reason.unwrap_or_default()])
                .or_default() += 1;
        }
        self.0.work.allocations.replace(counts);
        self.0.work.stalled.replace(stalled);
    }

    /// Set the band gauges of every pool counted (pools gone since are dropped), and count
    /// those that could not be read.
    pub fn set_pools(&self, count: &Count) {
        let m = &self.0.work;
        let (mut size, mut allocated, mut free, mut run) = Default::default();
        for CountedPool { pool, view } in &count.pools {
            // With nodeReuse every usable copy counts: the pool holds its size once per copy.
            for (band, label) in [(Band::Static, "static"), (Band::Dynamic, "dynamic")] {
                let key = vec![pool.name_any(), label.to_string()];
                let set = |map: &mut BTreeMap<_, _>, value: u32| {
                    map.insert(key.clone(), i64::from(value));
                };
                let usable = || view.usable().map(|r| &r.state);
                set(&mut size, usable().map(|s| s.usage(band).size).sum());
                let used = view.copies().map(|(_, r)| r.state.usage(band).used);
                set(&mut allocated, used.sum());
                set(&mut free, usable().map(|s| s.usage(band).free()).sum());
                let longest = usable().map(|s| s.largest_free_run(band)).max();
                set(&mut run, longest.unwrap_or(0));
            }
        }
        m.pool_ports.replace(size);
        m.pool_allocated.replace(allocated);
        m.pool_free.replace(free);
        m.pool_largest_free_run.replace(run);
        m.pool_overlap.replace(
            count
                .overlaps
                .iter()
                .map(|o| {
                    (
                        vec![o.pool.clone(), o.other.clone()],
                        i64::from(o.shared.len()),
                    )
                })
                .collect(),
        );
        self.0.activity.pool_refresh_errors.inc_by(count.unreadable);
    }

    /// Whether this replica does the watcher's work now. One that stops drops the gauges that
    /// work kept (pools, PortAllocations by phase, stalled ones), so a scrape never mixes its
    /// stale figures with the new leader's.
    pub fn set_leader(&self, leading: bool) {
        self.0.leader.set(i64::from(leading));
        if !leading {
            for family in self.0.work.all() {
                family.replace(BTreeMap::new());
            }
        }
    }

    /// The pools could not be listed: the gauges keep their last values.
    pub fn record_pool_list_error(&self) {
        self.0.activity.pool_refresh_errors.inc();
    }

    /// An Event was dropped: too many were waiting to be sent.
    pub fn record_event_dropped(&self) {
        self.0.activity.events_dropped.inc();
    }

    /// The text exposition format, version 0.0.4.
    pub fn render(&self) -> String {
        let families = self.0.registry.gather();
        // Only fails on a family the registry would not have gathered (a histogram without
        // buckets, an empty name): none of ours.
        TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_else(|e| format!("# encoding the metrics failed: {e}\n"))
    }
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
    fn a_replica_that_stops_leading_drops_the_gauges_its_work_kept() {
        let metrics = Metrics::default();
        metrics.set_leader(true);
        metrics.set_allocations([&allocation("llm", "big", Some("PoolFull"))]);
        let text = metrics.render();
        assert!(text.lines().any(|l| l == "portalloc_leader 1"), "{text}");
        assert!(text.contains("portalloc_allocation_stalled{"), "{text}");
        metrics.set_leader(false);
        let text = metrics.render();
        assert!(text.lines().any(|l| l == "portalloc_leader 0"), "{text}");
        assert!(!text.contains("portalloc_allocation_stalled{"), "{text}");
        assert!(!text.contains("portalloc_allocations{"), "{text}");
    }

    fn allocation(namespace: &str, name: &str, stalled: Option<&str>) -> PortAllocation {
        let conditions: Vec<_> = stalled
            .map(|reason| {
                serde_json::json!({"type": CONDITION_STALLED, "status": "True", "reason": reason,
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})
            })
            .into_iter()
            .collect();
        let phase = if stalled.is_some() {
            "Failed"
        } else {
            "Allocated"
        };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "portalloc.dev/v1alpha1", "kind": "PortAllocation",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"pool": "gpu", "roles": []},
            "status": {"phase": phase, "conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn a_stalled_object_has_a_series_only_while_it_is_stalled() {
        let metrics = Metrics::default();
        let series =
            r#"portalloc_allocation_stalled{name="big",namespace="llm",reason="PoolFull"} 1"#;
        let big = allocation("llm", "big", Some("PoolFull"));
        let ok = allocation("llm", "ok", None);
        metrics.set_allocations([&big, &ok]);
        let text = metrics.render();
        assert!(text.lines().any(|l| l == series), "{text}");
        assert!(!text.contains(r#"name="ok""#), "{text}");
        assert!(
            text.lines()
                .any(|l| l == r#"portalloc_allocations{phase="Failed",reason="PoolFull"} 1"#),
            "{text}"
        );

        // Now held under another reason: the old series goes, the new one comes.
        let held = allocation("llm", "big", Some("PortHeld"));
        metrics.set_allocations([&held, &ok]);
        let text = metrics.render();
        assert!(!text.contains("PoolFull"), "{text}");
        assert!(
            text.contains(r#"name="big",namespace="llm",reason="PortHeld"} 1"#),
            "{text}"
        );

        // Fixed: no series at all, and no sample of the family.
        let fixed = allocation("llm", "big", None);
        metrics.set_allocations([&fixed, &ok]);
        let text = metrics.render();
        assert!(!text.contains("portalloc_allocation_stalled{"), "{text}");
        assert!(
            text.lines()
                .any(|l| l == r#"portalloc_allocations{phase="Allocated",reason=""} 2"#),
            "{text}"
        );
    }
}

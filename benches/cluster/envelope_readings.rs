//! Cell 2s's readings of the watcher process: its memory from /proc, and its `/metrics` text
//! (a family's sum, the admission histogram's buckets and what they bound).

use std::collections::BTreeMap;

use crate::dash;

/// (VmHWM, VmRSS) of a process, in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// The sum of a metric family's samples in a Prometheus text (0 when absent).
pub fn metric(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `portalloc_admission_duration_seconds`: cumulative bucket counts by bound, sum and count.
pub struct Histogram {
    buckets: BTreeMap<String, f64>,
    sum: f64,
    count: f64,
}

pub fn histogram(text: &str) -> Histogram {
    let family = "portalloc_admission_duration_seconds";
    let mut buckets = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&format!("{family}_bucket{{")) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Some(le) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("le=\""))
            .map(|l| l.trim_end_matches('"').to_string())
        else {
            continue;
        };
        *buckets.entry(le).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    Histogram {
        buckets,
        sum: metric(text, &format!("{family}_sum")),
        count: metric(text, &format!("{family}_count")),
    }
}

/// (p50 bound, p99 bound, mean ms, answers) of the admissions between two scrapes.
pub fn histogram_figures(before: &Histogram, after: &Histogram) -> (String, String, f64, u64) {
    let count = after.count - before.count;
    let mean_ms = (after.sum - before.sum) * 1e3 / count.max(1.0);
    let mut bounds: Vec<(f64, String, f64)> = after
        .buckets
        .iter()
        .map(|(le, n)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            let grew = n - before.buckets.get(le).copied().unwrap_or(0.0);
            (bound, le.clone(), grew)
        })
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let bound_at = |q: f64| {
        let rank = (q * count).ceil().max(1.0);
        bounds
            .iter()
            .find(|(_, _, n)| *n >= rank)
            .map_or_else(dash, |(b, le, _)| {
                if b.is_finite() {
                    format!("{:.0} ms", b * 1e3)
                } else {
                    le.clone()
                }
            })
    };
    (
        bound_at(0.50),
        bound_at(0.99),
        mean_ms,
        count.round() as u64,
    )
}

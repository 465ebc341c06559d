//! 2s, its last row: with set B's record in place (15,000 PortAllocations, 750,000 holdings), a
//! burst of labelled hostNetwork pods created by 16 clients through the watcher's webhook, and
//! in the same burst as many unlabelled pods, which the webhook's objectSelector leaves to the
//! API server alone: what a pod create costs here without us. The two kinds take turns, so both
//! meet the same server (one burst after the other met the watcher's last writes in the first
//! only).
//!
//! Figures: each create's latency as the client sees it (API server + webhook), and the
//! webhook's own time per admission, exactly from its log (`took_ms`) and as bucket bounds from
//! its `portalloc_admission_duration_seconds` histogram.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::ensure;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use portalloc::api::PortAllocation;

use crate::envelope_readings::{histogram, histogram_figures, memory_kib, metric};
use crate::envelope_shape::{CREATORS, PORTS_PER_POD, REPLICAS, SET_B, is_ready, watcher_log};
use crate::{Row, metrics, workload, yes_no};

/// One burst of `burst` labelled and `burst` unlabelled pods, taking turns.
pub async fn burst_row(
    admin: &Client,
    burst: usize,
    clients: &[Client],
    watcher: &crate::webhook::Webhook,
) -> anyhow::Result<Row> {
    let api_b: Api<PortAllocation> = Api::namespaced(admin.clone(), SET_B);
    let mut owners: Vec<String> = workload::list_all(&api_b)
        .await?
        .iter()
        .filter(|pa| is_ready(pa))
        .map(|pa| pa.name_any())
        .collect();
    owners.sort();
    owners.truncate(burst / REPLICAS as usize);
    ensure!(!owners.is_empty(), "no Ready PortAllocation for the burst");
    let labelled: Vec<Pod> = owners
        .iter()
        .flat_map(|owner| (0..REPLICAS).map(move |r| pod(owner, r, true)))
        .collect::<anyhow::Result<_>>()?;
    let count = labelled.len();
    let unlabelled: Vec<Pod> = (0..count)
        .map(|i| pod("plain", i as u32, false))
        .collect::<anyhow::Result<_>>()?;

    let histogram_before = histogram(&watcher.get("/metrics").unwrap_or_default());
    let log_before = admissions_logged(&watcher_log()).len();
    let server_before = metrics::fetch(admin).await.unwrap_or_default();
    let (ours, plain) = create_all(clients, labelled, unlabelled).await;
    let server_after = metrics::fetch(admin).await.unwrap_or_default();
    let metrics_after = watcher.get("/metrics").unwrap_or_default();
    let took = admissions_logged(&watcher_log()).split_off(log_before);

    let histogram_after = histogram(&metrics_after);
    let memory_end = memory_kib(watcher.pid());
    let (p50_bound, p99_bound, mean_ms, admitted) =
        histogram_figures(&histogram_before, &histogram_after);
    let (p50, p99) = (ours.percentile_ms(50.0), ours.percentile_ms(99.0));
    let (plain_p50, plain_p99) = (plain.percentile_ms(50.0), plain.percentile_ms(99.0));
    let (took_p50, took_p99) = (percentile(&took, 50.0), percentile(&took, 99.0));
    let call_ms = webhook_call_mean_ms(&server_before, &server_after);
    let (mean, plain_mean) = (ours.mean_ms(), plain.mean_ms());
    let failed = |cell: &workload::Cell| match cell.failures.first() {
        Some(first) => format!("; **{} failed** (first: {first})", cell.failures.len()),
        None => String::new(),
    };
    Ok(Row {
        id: "2s",
        what: format!(
            "webhook admission during a burst of {count} labelled hostNetwork pods ({} \
             PortAllocations × {REPLICAS}) created by {CREATORS} clients with that record in \
             place: the webhook's own time per admission (its log's `took_ms`; its \
             `portalloc_admission_duration_seconds` bucket bounds), and create latency as the \
             client sees it (API server + webhook); beside it, as many unlabelled pods (no \
             webhook call) in the same burst, the two kinds taking turns",
            owners.len()
        ),
        ours: format!(
            "webhook: {} admissions, p50 {took_p50} ms, **p99 {took_p99} ms** (histogram: \
             {admitted} answers, mean {mean_ms:.1} ms, p50 ≤ {p50_bound}, p99 ≤ {p99_bound}); \
             client p50 {p50:.1} ms, p99 {p99:.1} ms, mean {mean:.1} ms{}; the API server's \
             webhook call (its `apiserver_admission_webhook_admission_duration_seconds`) mean \
             {call_ms:.1} ms; {:.0} pods/s of both kinds; watcher VmHWM afterwards {:.0} MiB",
            took.len(),
            failed(&ours),
            (ours.ops + plain.ops) as f64 / ours.wall.as_secs_f64(),
            memory_end.0 as f64 / 1024.0,
        ),
        anchor: format!(
            "unlabelled pods: client p50 {plain_p50:.1} ms, p99 {plain_p99:.1} ms, mean \
             {plain_mean:.1} ms{}",
            failed(&plain),
        ),
        ratio: format!("{:.2}× at p99", p99 / plain_p99),
        target: "admission p99 < 50 ms".into(),
        met: yes_no(ours.failures.is_empty() && took.len() == count && took_p99 < 50),
    })
}

/// Create `labelled` and `unlabelled` in turns, with one client each of `clients` at a time: the
/// labelled ones' figures, then the unlabelled ones'. A labelled pod must come back with its
/// port variables.
async fn create_all(
    clients: &[Client],
    labelled: Vec<Pod>,
    unlabelled: Vec<Pod>,
) -> (workload::Cell, workload::Cell) {
    let kinds = [(labelled, PORTS_PER_POD as usize), (unlabelled, 0)];
    let pods: Vec<(Pod, usize)> = interleave(kinds);
    let count = pods.len();
    let pods = Arc::new(pods);
    let apis: Arc<Vec<Api<Pod>>> = Arc::new(
        clients
            .iter()
            .map(|c| Api::namespaced(c.clone(), SET_B))
            .collect(),
    );
    let by_kind: Arc<Mutex<[workload::Cell; 2]>> = Arc::default();
    let kinds = by_kind.clone();
    let both = workload::drive(CREATORS, count, move |worker, item| {
        let (apis, pods, kinds) = (apis.clone(), pods.clone(), kinds.clone());
        async move {
            let (pod, ports) = &pods[item];
            let started = Instant::now();
            let created = apis[worker].create(&PostParams::default(), pod).await;
            let kind = usize::from(*ports == 0);
            let created = match created {
                Ok(created) => created,
                Err(e) => {
                    let failure = format!("{}: {e}", pod.name_any());
                    lock(&kinds)[kind].failures.push(failure.clone());
                    anyhow::bail!(failure);
                }
            };
            let latency = started.elapsed();
            let injected = created
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.env.iter().flatten())
                .filter(|e| e.name.ends_with("_PORT"))
                .count();
            if injected < *ports {
                let failure = format!(
                    "pod {} admitted with {injected} port variables",
                    created.name_any()
                );
                lock(&kinds)[kind].failures.push(failure.clone());
                anyhow::bail!(failure);
            }
            let mut cells = lock(&kinds);
            cells[kind].ops += 1;
            cells[kind].latencies.push(latency);
            Ok(workload::Sample {
                latency,
                ports: injected as u64,
                attempts: 1,
                conflicts: 0,
            })
        }
    })
    .await;
    let [mut labelled, mut unlabelled] = std::mem::take(&mut *lock(&by_kind));
    labelled.wall = both.wall;
    unlabelled.wall = both.wall;
    (labelled, unlabelled)
}

/// One of each kind in turn (the longer list's rest last).
fn interleave<T>(kinds: [(Vec<Pod>, T); 2]) -> Vec<(Pod, T)>
where
    T: Copy,
{
    let [(first, a), (second, b)] = kinds;
    let mut first = first.into_iter();
    let mut second = second.into_iter();
    let mut out = Vec::new();
    loop {
        match (first.next(), second.next()) {
            (None, None) => return out,
            (x, y) => {
                out.extend(x.map(|pod| (pod, a)));
                out.extend(y.map(|pod| (pod, b)));
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The API server's mean time per call to the webhook between two scrapes of its metrics, in
/// ms: with the client's means beside it, what of a labelled create is the call itself.
fn webhook_call_mean_ms(before: &str, after: &str) -> f64 {
    let family = "apiserver_admission_webhook_admission_duration_seconds";
    let grew = |suffix: &str| {
        let name = format!("{family}_{suffix}");
        metric(after, &name) - metric(before, &name)
    };
    grew("sum") * 1e3 / grew("count").max(1.0)
}

/// Every admission's `took_ms` the watcher has logged so far, in order.
fn admissions_logged(log: &Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains(" admission "))
        .filter_map(|line| line.split("took_ms=").nth(1)?.split_whitespace().next())
        .filter_map(|ms| ms.parse().ok())
        .collect()
}

/// The nearest-rank percentile of `values` (0 when there are none).
fn percentile(values: &[u64], p: f64) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted
        .get(rank.min(sorted.len()).wrapping_sub(1))
        .copied()
        .unwrap_or(0)
}

/// Pod `{owner}-{r}`: labelled for PortAllocation `owner` (role `worker`), or not at all.
fn pod(owner: &str, r: u32, labelled: bool) -> anyhow::Result<Pod> {
    let labels = if labelled {
        serde_json::json!({
            portalloc::api::POD_ALLOCATION_LABEL: owner,
            portalloc::api::POD_ROLE_LABEL: "worker",
        })
    } else {
        serde_json::json!({})
    };
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{owner}-{r}"), "labels": labels},
        "spec": {
            "hostNetwork": true,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))?)
}

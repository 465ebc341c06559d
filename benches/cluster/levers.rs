//! 2j: the fine-grained compare-and-swap lever, measured on a stand-in record before any CRD
//! change: one ConfigMap holding a port bitmap in 64 blocks (`b00`..`b63`, 64 ports each) and one
//! key per holder, padded to the size of a 1,000-holder pool record. Two ways to take a port:
//!
//! - whole-object compare-and-swap (what the allocator does today): PUT the object with the
//!   resourceVersion of the copy decided against; any other write in between is a 409;
//! - JSON Patch with a `test` of just the block touched: `test` the block's old value, `replace`
//!   it, `add` the holder key. The API server applies a patch inside its own retry loop, so two
//!   writers of different blocks never see a conflict; only a stale block fails the `test`.
//!
//! Both keep the last object returned (no read before a write) and back off the same way, so
//! only the lever differs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, PostParams};
use rand::Rng;

use crate::workload::{self, Cell, Sample};
use crate::{Row, dash};

const BLOCKS: u16 = 64;
const FIRST_PORT: u16 = 40_000;
/// Filler entries, ~100 bytes each: the object weighs what a 1,000-holder pool record does.
const FILLER: usize = 1_000;

#[derive(Clone, Copy, PartialEq)]
enum Lever {
    WholeObject,
    JsonPatchTest,
}

pub async fn measure(clients: &[Client], ns: &str, per_round: usize) -> anyhow::Result<Vec<Row>> {
    workload::create_namespace(&clients[0], ns).await?;
    let mut rows = Vec::new();
    for concurrency in [1usize, 16] {
        let mut cells = Vec::new();
        for lever in [Lever::WholeObject, Lever::JsonPatchTest] {
            let name = format!(
                "record-{}-{concurrency}",
                if lever == Lever::WholeObject {
                    "cas"
                } else {
                    "patch"
                }
            );
            create_record(&clients[0], ns, &name).await?;
            let cell = run(&clients[..concurrency], ns, &name, lever, per_round).await;
            if let Some(first) = cell.failures.first() {
                bail!("{name}: {} failed, first: {first}", cell.failures.len());
            }
            check_record(&clients[0], ns, &name, per_round).await?;
            cells.push(cell);
        }
        let (cas, patch) = (&cells[0], &cells[1]);
        rows.push(Row {
            id: "2j",
            what: format!(
                "lever: JSON Patch `test` of one 64-port block vs whole-object CAS, one ~0.1 MB \
                 record (ConfigMap stand-in), {concurrency} client{}, {per_round} one-port takes: \
                 ports/s (p50 / p99), client-side retries",
                if concurrency == 1 { "" } else { "s" }
            ),
            ours: format!(
                "patch: {:.0} ports/s ({:.1} / {:.1} ms), {} retries",
                patch.ports_per_second(),
                patch.percentile_ms(50.0),
                patch.percentile_ms(99.0),
                patch.conflicts
            ),
            anchor: format!(
                "whole-object CAS: {:.0} ports/s ({:.1} / {:.1} ms), {} retries",
                cas.ports_per_second(),
                cas.percentile_ms(50.0),
                cas.percentile_ms(99.0),
                cas.conflicts
            ),
            ratio: format!("{:.2}", patch.ports_per_second() / cas.ports_per_second()),
            target: dash(),
            met: dash(),
        });
    }
    Ok(rows)
}

async fn create_record(client: &Client, ns: &str, name: &str) -> anyhow::Result<()> {
    let mut data = BTreeMap::new();
    for k in 0..BLOCKS {
        data.insert(format!("b{k:02}"), format!("{:016x}", 0u64));
    }
    for i in 0..FILLER {
        data.insert(
            format!("f-{i:08x}-7c1e-4f2a-9b3d-{:012x}", i * 7919),
            format!(
                "team-{:02}/inference-job-{i:05} worker.p0={}",
                i % 50,
                1 + i
            ),
        );
    }
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await?;
    Ok(())
}

/// Every take landed exactly once: as many bits set as holder keys added.
async fn check_record(client: &Client, ns: &str, name: &str, takes: usize) -> anyhow::Result<()> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await?;
    let data = cm.data.unwrap_or_default();
    let bits: u32 = (0..BLOCKS)
        .map(|k| u64::from_str_radix(&data[&format!("b{k:02}")], 16).map_or(0, |b| b.count_ones()))
        .sum();
    let holders = data.keys().filter(|k| k.starts_with("h-")).count();
    anyhow::ensure!(
        bits as usize == takes && holders == takes,
        "{name}: {bits} ports taken, {holders} holders, {takes} takes"
    );
    Ok(())
}

async fn run(clients: &[Client], ns: &str, name: &str, lever: Lever, count: usize) -> Cell {
    let copies: Arc<Vec<Mutex<Option<ConfigMap>>>> =
        Arc::new(clients.iter().map(|_| Mutex::new(None)).collect());
    let clients: Arc<Vec<Client>> = Arc::new(clients.to_vec());
    let (ns, name) = (ns.to_string(), name.to_string());
    workload::drive(clients.len(), count, move |worker, item| {
        let (clients, copies) = (clients.clone(), copies.clone());
        let (ns, name) = (ns.clone(), name.clone());
        async move {
            let client = &clients[worker];
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            let started = Instant::now();
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                let copy = copies[worker].lock().unwrap().take();
                let cm = match copy {
                    Some(cm) => cm,
                    None => api.get(&name).await?,
                };
                let (block, old, new) = choose(&cm)?;
                let holder = format!("h-{worker}-{item}");
                let entry = format!("{ns}/job-{item} worker.p0={}", port_of(block, old ^ new));
                let result = match lever {
                    Lever::WholeObject => {
                        let mut updated = cm.clone();
                        let data = updated.data.get_or_insert_with(Default::default);
                        data.insert(format!("b{block:02}"), format!("{new:016x}"));
                        data.insert(holder, entry);
                        api.replace(&name, &PostParams::default(), &updated).await
                    }
                    Lever::JsonPatchTest => {
                        let path = format!("/data/b{block:02}");
                        let patch = serde_json::json!([
                            {"op": "test", "path": path, "value": format!("{old:016x}")},
                            {"op": "replace", "path": path, "value": format!("{new:016x}")},
                            {"op": "add", "path": format!("/data/{holder}"), "value": entry},
                        ]);
                        let request = http::Request::patch(format!(
                            "/api/v1/namespaces/{ns}/configmaps/{name}"
                        ))
                        .header("Content-Type", "application/json-patch+json")
                        .body(serde_json::to_vec(&patch)?)?;
                        client.request::<ConfigMap>(request).await
                    }
                };
                match result {
                    Ok(written) => {
                        *copies[worker].lock().unwrap() = Some(written);
                        return Ok(Sample {
                            latency: started.elapsed(),
                            ports: 1,
                            attempts,
                            conflicts: attempts - 1,
                        });
                    }
                    // 409: the object changed; 422 (or 500 on some versions): the test failed.
                    Err(kube::Error::Api(status))
                        if matches!(status.code, 409 | 422 | 500) && attempts < 100 =>
                    {
                        let ceiling = 10u64 << attempts.min(7);
                        let delay = rand::rng().random_range(0..=ceiling.min(1000));
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    })
    .await
}

/// A random block with a free port in the copy, its old bitmap and the one with a port taken.
fn choose(cm: &ConfigMap) -> anyhow::Result<(u16, u64, u64)> {
    let data = cm.data.clone().unwrap_or_default();
    let mut rng = rand::rng();
    let start = rng.random_range(0..BLOCKS);
    for step in 0..BLOCKS {
        let block = (start + step) % BLOCKS;
        let old = u64::from_str_radix(&data[&format!("b{block:02}")], 16)?;
        if old != u64::MAX {
            let free: Vec<u32> = (0..64).filter(|b| old & (1 << b) == 0).collect();
            let bit = free[rng.random_range(0..free.len())];
            return Ok((block, old, old | (1 << bit)));
        }
    }
    bail!("record full")
}

fn port_of(block: u16, bit: u64) -> u16 {
    FIRST_PORT + block * 64 + bit.trailing_zeros() as u16
}

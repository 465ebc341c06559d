//! Cells 2b/2c: ports/s and p50/p99 latency with 1, 4 and 16 concurrent clients, ours beside
//! NodePort Services with the same ports and concurrency.

use anyhow::ensure;
use kube::Client;

use crate::controlplane::ControlPlane;
use crate::report::{dash, yes_no};
use crate::workload::Cell;
use crate::{Row, Scale, metrics, workload};

pub(crate) async fn throughput(
    plane: &ControlPlane,
    admin: &Client,
    scale: &Scale,
) -> anyhow::Result<Vec<Row>> {
    let (ns, svc_ns) = ("throughput", "services");
    workload::create_namespace(admin, ns).await?;
    workload::create_namespace(admin, svc_ns).await?;
    let max_clients = *scale.concurrency.iter().max().unwrap();
    let clients = plane.clients(max_clients).await?;

    // Warm-up, not measured: connections, caches, the first objects of each kind.
    workload::create_pool(admin, "warm-up", "40000-42767").await?;
    let warm = workload::run_ours(&clients[..4], ns, "warm-up", "warm", 16, 1).await;
    ensure!(warm.failures.is_empty(), "warm-up: {:?}", warm.failures);
    let warm = workload::run_services(&clients[..4], svc_ns, "warm", 16, 1).await;
    ensure!(warm.failures.is_empty(), "warm-up: {:?}", warm.failures);
    workload::delete_services(&clients, svc_ns).await?;

    let mut rows = Vec::new();
    let mut scaling = Vec::new();
    let server_before = metrics::scrape_durations(admin).await?;
    for &ports in &scale.sizes {
        let mut per_concurrency = Vec::new();
        for &concurrency in &scale.concurrency {
            let mut ours = Cell::default();
            let mut theirs = Cell::default();
            for round in 0..scale.rounds {
                let tag = format!("p{ports}-c{concurrency}-r{round}");
                // A fresh pool the size of the NodePort range, so both start each round empty.
                workload::create_pool(admin, &tag, "40000-42767").await?;
                let clients = &clients[..concurrency];
                ours.absorb(
                    workload::run_ours(clients, ns, &tag, &tag, scale.per_round, ports).await,
                );
                theirs.absorb(
                    workload::run_services(clients, svc_ns, &tag, scale.per_round, ports).await,
                );
                workload::delete_services(clients, svc_ns).await?;
            }
            eprintln!(
                "  {ports}-port, {concurrency} clients: ours {:.0} ports/s, NodePort {:.0} ports/s",
                ours.ports_per_second(),
                theirs.ports_per_second()
            );
            let ratio = ours.ports_per_second() / theirs.ports_per_second();
            let targeted = ports == 8 && concurrency == 16;
            rows.push(Row {
                id: "2b/2c",
                what: format!(
                    "{ports}-port allocations, {concurrency} concurrent client{}: ports/s (p50 / p99 per allocation)",
                    if concurrency == 1 { "" } else { "s" }
                ),
                ours: format!(
                    "{:.0} ports/s ({:.1} / {:.1} ms); {} conflicts, {} retries in {} allocations{}",
                    ours.ports_per_second(),
                    ours.percentile_ms(50.0),
                    ours.percentile_ms(99.0),
                    ours.conflicts,
                    ours.retries(),
                    ours.ops,
                    failures(&ours)
                ),
                anchor: format!(
                    "{:.0} ports/s ({:.1} / {:.1} ms) in {} Services{}",
                    theirs.ports_per_second(),
                    theirs.percentile_ms(50.0),
                    theirs.percentile_ms(99.0),
                    theirs.ops,
                    failures(&theirs)
                ),
                ratio: format!("{ratio:.2}"),
                target: if targeted { "≥ 1.0".into() } else { dash() },
                met: if targeted { yes_no(ratio >= 1.0) } else { dash() },
            });
            per_concurrency.push((concurrency, ours, theirs));
        }
        scaling.push((ports, per_concurrency));
    }

    // Where the time goes: the API server's own time per request over all the cells above.
    let server_after = metrics::scrape_durations(admin).await?;
    let mean = |verb, group, resource, subresource| {
        let (ms, count) = metrics::mean_duration_ms(
            &server_before,
            &server_after,
            verb,
            group,
            resource,
            subresource,
        );
        format!(
            "{verb} {resource}{}{subresource} {ms:.1} ms (×{count})",
            if subresource.is_empty() { "" } else { "/" }
        )
    };
    let group = "portalloc.dev";
    rows.push(Row {
        id: "2b/2c",
        what: "API server time per request during the cells above (mean of its \
               `apiserver_request_duration_seconds`; 409s included)"
            .into(),
        ours: [
            mean("POST", group, "portallocations", ""),
            mean("GET", group, "portpoolshards", ""),
            mean("PUT", group, "portpoolshards", "status"),
            mean("LIST", group, "portpoolshards", ""),
            mean("PUT", group, "portallocations", "status"),
        ]
        .join(", "),
        anchor: mean("POST", "", "services", ""),
        ratio: dash(),
        target: dash(),
        met: dash(),
    });

    // Does contention on one pool object cost more than half the single-client throughput?
    let mut ours_text = Vec::new();
    let mut theirs_text = Vec::new();
    let mut holds = false;
    for (ports, cells) in &scaling {
        let one = cells.first().map(|c| c.1.ports_per_second()).unwrap_or(0.0);
        let most = cells.last().map(|c| c.1.ports_per_second()).unwrap_or(0.0);
        let one_k = cells.first().map(|c| c.2.ports_per_second()).unwrap_or(0.0);
        let most_k = cells.last().map(|c| c.2.ports_per_second()).unwrap_or(0.0);
        holds |= most < one / 2.0;
        ours_text.push(format!("{ports}-port {:.2}", most / one));
        theirs_text.push(format!("{ports}-port {:.2}", most_k / one_k));
    }
    // PORTALLOC_BENCH_SHARDS=1 measures the shard lever whatever the condition says.
    if holds || std::env::var("PORTALLOC_BENCH_SHARDS").is_ok_and(|v| v == "1") {
        let most = *scale.concurrency.iter().max().unwrap();
        for (ports, cells) in &scaling {
            let single = &cells.first().expect("cells").1;
            let anchor_most = &cells.last().expect("cells").2;
            for &shards in &scale.shards {
                let mut sharded = Cell::default();
                for round in 0..scale.rounds {
                    let tag = format!("p{ports}-s{shards}-r{round}");
                    let pools = shard_pools(admin, &tag, 40000, 42767, shards).await?;
                    sharded.absorb(
                        workload::run_sharded(
                            &clients[..most],
                            ns,
                            &pools,
                            &tag,
                            scale.per_round,
                            *ports,
                        )
                        .await,
                    );
                }
                eprintln!(
                    "  {ports}-port, {most} clients, {shards} shards: ours {:.0} ports/s",
                    sharded.ports_per_second()
                );
                let ratio = sharded.ports_per_second() / anchor_most.ports_per_second();
                let targeted = *ports == 8;
                rows.push(Row {
                    id: "2b/2c",
                    what: format!(
                        "{ports}-port allocations, {most} clients, pool split in {shards} shards \
                         (sub-ranges; shard by name hash, next shard when full)"
                    ),
                    ours: format!(
                        "{:.0} ports/s ({:.1} / {:.1} ms); {} conflicts, {} retries in {} allocations{}; \
                         {:.2}× the unsharded 1-client figure",
                        sharded.ports_per_second(),
                        sharded.percentile_ms(50.0),
                        sharded.percentile_ms(99.0),
                        sharded.conflicts,
                        sharded.retries(),
                        sharded.ops,
                        failures(&sharded),
                        sharded.ports_per_second() / single.ports_per_second()
                    ),
                    anchor: format!(
                        "{:.0} ports/s (NodePort, {most} clients, above)",
                        anchor_most.ports_per_second()
                    ),
                    ratio: format!("{ratio:.2}"),
                    target: if targeted { "≥ 1.0".into() } else { dash() },
                    met: if targeted { yes_no(ratio >= 1.0) } else { dash() },
                });
            }
        }
    }
    rows.push(Row {
        id: "2b/2c",
        what: format!(
            "throughput at {} clients ÷ at 1 client (shard the pool only if < 0.5)",
            scale.concurrency[2]
        ),
        ours: ours_text.join(", "),
        anchor: theirs_text.join(", "),
        ratio: dash(),
        target: "≥ 0.5".into(),
        met: if holds {
            "**no**: shard condition holds".into()
        } else {
            "yes: condition does not hold, no shards".into()
        },
    });
    Ok(rows)
}

/// `shards` PortPools over consecutive, disjoint sub-ranges of `first..=last`.
async fn shard_pools(
    admin: &Client,
    tag: &str,
    first: u32,
    last: u32,
    shards: u32,
) -> anyhow::Result<Vec<String>> {
    let size = last - first + 1;
    let mut pools = Vec::new();
    for k in 0..shards {
        let from = first + size * k / shards;
        let to = first + size * (k + 1) / shards - 1;
        let name = format!("{tag}-shard{k}");
        workload::create_pool(admin, &name, &format!("{from}-{to}")).await?;
        pools.push(name);
    }
    Ok(pools)
}

fn failures(cell: &Cell) -> String {
    match cell.failures.first() {
        None => String::new(),
        Some(first) => format!("; **{} failed** (first: {first})", cell.failures.len()),
    }
}

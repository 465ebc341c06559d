//! Cell 2a: API requests per `create -f` and per `sync` (of an allocated object and of a
//! freshly applied one), counted by the API server's own `apiserver_request_total`.

use std::time::Duration;

use anyhow::ensure;
use kube::Client;
use kube::api::{Api, PostParams};

use portalloc::api::PortAllocation;
use portalloc::k8s::Allocator;
use portalloc::ledger::recorded_holdings;

use crate::controlplane::ControlPlane;
use crate::report::{dash, yes_no};
use crate::{Row, Scale, cli, metrics, workload};

pub(crate) async fn request_counts(
    plane: &ControlPlane,
    admin: &Client,
    scale: &Scale,
) -> anyhow::Result<Vec<Row>> {
    let (ns, pool) = ("requests", "requests");
    workload::create_namespace(admin, ns).await?;
    workload::create_pool(admin, pool, "20000-29999").await?;
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), ns);
    let dir = tempfile::tempdir()?;
    let kubeconfig = &plane.kubeconfig;
    let mut measured: [Vec<(u32, u64, String)>; 3] = Default::default();
    // The first command of a machine (an empty cache): it reads the pool's spec and the shard.
    let cold_cache = tempfile::tempdir()?;
    let cold_file = dir.path().join("cold.yaml");
    std::fs::write(
        &cold_file,
        serde_yaml::to_string(&workload::allocation("cold", ns, pool, 1, 1))?,
    )?;
    let cold_file = cold_file.to_string_lossy().into_owned();
    let cold_dir = cold_cache.path().to_string_lossy().into_owned();
    let cold = count_requests(admin, || {
        cli::run(
            kubeconfig,
            &["create", "-f", &cold_file, "--cache-dir", &cold_dir],
        )
    })
    .await?;
    // The rest share one cache directory, as one user's commands do.
    let warm_cache = tempfile::tempdir()?;
    let warm_dir = warm_cache.path().to_string_lossy().into_owned();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--cache-dir", warm_dir.as_str()]);
        cli::run(kubeconfig, &all)
    };
    run(&["sync", "cold", "-n", ns]);
    for &ports in &scale.request_ports {
        // `create -f` of a new object: the path users run.
        let name = format!("create-{ports}");
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            serde_yaml::to_string(&workload::allocation(&name, ns, pool, ports, 1))?,
        )?;
        let file = file.to_string_lossy().into_owned();
        let (count, breakdown) = count_requests(admin, || run(&["create", "-f", &file])).await?;
        measured[0].push((ports, count, breakdown));

        // `sync` of that object, already allocated: nothing to write.
        let (count, breakdown) = count_requests(admin, || run(&["sync", &name, "-n", ns])).await?;
        measured[1].push((ports, count, breakdown));

        // `sync` of an object applied by someone else (kubectl apply, Argo CD): allocate it.
        let fresh = format!("fresh-{ports}");
        api.create(
            &PostParams::default(),
            &workload::allocation(&fresh, ns, pool, ports, 1),
        )
        .await?;
        let (count, breakdown) = count_requests(admin, || run(&["sync", &fresh, "-n", ns])).await?;
        measured[2].push((ports, count, breakdown));
        let held = api
            .get(&fresh)
            .await?
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default()
            .len();
        ensure!(held == ports as usize, "{fresh} holds {held} ports");
    }
    // The same `create -f` into a 2,000-port pool (eight windows): 512 ports span windows.
    let small = "requests-2k";
    workload::create_pool(admin, small, "40000-41999").await?;
    let mut small_pool = Vec::new();
    for &ports in &scale.request_ports {
        let name = format!("create-2k-{ports}");
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            serde_yaml::to_string(&workload::allocation(&name, ns, small, ports, 1))?,
        )?;
        let file = file.to_string_lossy().into_owned();
        let (count, breakdown) = count_requests(admin, || run(&["create", "-f", &file])).await?;
        let shards = api
            .get(&name)
            .await?
            .status
            .map_or(0, |status| status.shards.len());
        small_pool.push((ports, count, breakdown, shards));
    }
    // A long-lived Allocator (the watcher's, a throughput client's): create then sync, one after
    // another, deciding against the pool its last write returned, and (before) reading it first.
    let mut in_process = Vec::new();
    for remember in [false, true] {
        let allocator = Allocator::new(admin.clone()).remember_shards(remember);
        // Long-lived: it has met every shard of the pool (40 here) before the counted ones.
        for i in 0..80 {
            let pa = workload::allocation(&format!("lib-{remember}-warm-{i}"), ns, pool, 1, 1);
            workload::allocate(&allocator, &api, pa).await?;
        }
        let n = 20u64;
        let before = metrics::scrape(admin).await?;
        for i in 0..n {
            let pa = workload::allocation(&format!("lib-{remember}-{i}"), ns, pool, 1, 1);
            workload::allocate(&allocator, &api, pa).await?;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (count, breakdown) = metrics::delta(&before, &metrics::scrape(admin).await?);
        in_process.push((remember, count as f64 / n as f64, breakdown, n));
    }
    let labels = [
        "`kubectl portalloc create -f` (new object)",
        "`kubectl portalloc sync NAME`, already allocated",
        "`kubectl portalloc sync NAME`, freshly applied",
    ];
    let mut rows: Vec<Row> = in_process
        .iter()
        .map(|(remember, per, breakdown, n)| Row {
            id: "2a",
            what: format!(
                "API requests per allocation (create + sync, 1 port) by one long-lived Allocator, {n} in a row, {}",
                if *remember {
                    "after 80 others, deciding against the shard its last write returned"
                } else {
                    "reading the pool first (before)"
                }
            ),
            ours: format!("{per:.2} ({breakdown})"),
            anchor: dash(),
            ratio: dash(),
            target: "≤ 3".into(),
            met: yes_no(*per <= 3.0),
        })
        .collect();
    rows.push(Row {
        id: "2a",
        what: "API requests per `kubectl portalloc create -f` (new object, 1 port), empty cache directory".into(),
        ours: format!("{} ({})", cold.0, cold.1),
        anchor: dash(),
        ratio: dash(),
        target: "—".into(),
        met: dash(),
    });
    let counts: Vec<String> = small_pool
        .iter()
        .map(|(_, c, _, _)| c.to_string())
        .collect();
    let spans: Vec<String> = small_pool
        .iter()
        .map(|(_, _, _, n)| n.to_string())
        .collect();
    let mut breakdowns: Vec<&str> = small_pool.iter().map(|(_, _, b, _)| b.as_str()).collect();
    breakdowns.dedup();
    rows.push(Row {
        id: "2a",
        what: format!(
            "API requests per `kubectl portalloc create -f` into a 2,000-port pool, {} ports (shards written: {})",
            scale.request_ports.map(|p| p.to_string()).join(" / "),
            spans.join(" / ")
        ),
        ours: format!("{} ({})", counts.join(" / "), breakdowns.join("; ")),
        anchor: dash(),
        ratio: dash(),
        // A read of the shard or shards, the create, the status, and per shard written its
        // write and the share of the reads and of the status write that names it first.
        target: "≤ 2 + 2 per shard written".into(),
        met: yes_no(
            small_pool
                .iter()
                .all(|(_, count, _, shards)| *count <= 2 + 2 * *shards as u64),
        ),
    });
    let targets = [4, 2, 3];
    rows.extend(labels.iter().zip(measured).zip(targets).map(|((label, results), target)| {
        let sizes: Vec<String> = results.iter().map(|(p, _, _)| p.to_string()).collect();
        let counts: Vec<String> = results.iter().map(|(_, c, _)| c.to_string()).collect();
        let mut breakdowns: Vec<&str> = results.iter().map(|(_, _, b)| b.as_str()).collect();
        breakdowns.dedup();
        Row {
            id: "2a",
            what: format!(
                "API requests per {label}, {} ports, the cache directory kept from the command before",
                sizes.join(" / ")
            ),
            ours: format!("{} ({})", counts.join(" / "), breakdowns.join("; ")),
            anchor: dash(),
            ratio: dash(),
            target: format!("≤ {target} (1 port)"),
            met: yes_no(results.first().is_some_and(|(_, c, _)| *c <= target)),
        }
    }));
    Ok(rows)
}

/// Runs one CLI command and counts the requests it made from the server's own counters.
async fn count_requests(
    admin: &Client,
    run: impl FnOnce() -> std::process::Output,
) -> anyhow::Result<(u64, String)> {
    let before = metrics::scrape(admin).await?;
    let output = run();
    ensure!(
        output.status.success(),
        "kubectl-portalloc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The counter is bumped as the handler returns, possibly just after the response is sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = metrics::scrape(admin).await?;
    Ok(metrics::delta(&before, &after))
}

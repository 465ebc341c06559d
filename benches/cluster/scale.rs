//! 2l: 16 `kubectl portalloc create -f` processes at once, 6 creates each, process start
//! included (what a CI job fanning out deployments does), with the kept copies in one shared
//! cache directory (one machine, one user) and with none.
//!
//! 2m: `kubectl portalloc sync --all -A` of N freshly applied one-port PortAllocations into one
//! 1-65535 pool, for N = 25,000 and 65,535: wall time, shard writes, failures. Every write is one
//! shard's (≤ 256 entries), so no request can outgrow what etcd takes. Each sync ends in one
//! status write per PortAllocation; the same number of bare status writes (the objects as
//! synced, `observedGeneration` changed so each is a real write), by 16 and by 64 clients, is
//! the server's floor for that part.

use std::process::Stdio;
use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use anyhow::ensure;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use portalloc::api::PortAllocation;

use crate::controlplane::ControlPlane;
use crate::{Row, cli, group_commit, workload, yes_no};

const PROCESSES: usize = 16;

/// The binary under test: `PORTALLOC_BENCH_BIN` (an older build, for a before/after), else the
/// one cargo built beside this benchmark.
pub fn binary() -> String {
    std::env::var("PORTALLOC_BENCH_BIN").unwrap_or_else(|_| cli::BIN.to_string())
}

pub async fn cli_race(
    plane: &ControlPlane,
    admin: &Client,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let per_process = if quick { 2 } else { 6 };
    let mut rows = Vec::new();
    // An older build has no cache directory to keep or not.
    let older = std::env::var_os("PORTALLOC_BENCH_BIN").is_some();
    let variants: &[(&str, bool)] = if older {
        &[("older", false)]
    } else {
        &[("cache", true), ("nocache", false)]
    };
    for &(tag, shared_cache) in variants {
        let (ns, pool) = (format!("cli-race-{tag}"), format!("cli-race-{tag}"));
        workload::create_namespace(admin, &ns).await?;
        workload::create_pool(admin, &pool, "20000-29999").await?;
        let cache = tempfile::tempdir()?;
        let dir = tempfile::tempdir()?;
        let mut files = Vec::new();
        for p in 0..PROCESSES {
            for i in 0..per_process {
                let path = dir.path().join(format!("{p}-{i}.yaml"));
                let pa = workload::allocation(&format!("job-{p}-{i}"), &ns, &pool, 1, 1);
                std::fs::write(&path, serde_yaml::to_string(&pa)?)?;
                files.push((p, path));
            }
        }
        let cache_dir = if shared_cache {
            cache.path().to_string_lossy().into_owned()
        } else {
            String::new()
        };
        let started = Instant::now();
        let workers: Vec<_> = (0..PROCESSES)
            .map(|p| {
                let mine: Vec<_> = files
                    .iter()
                    .filter(|(q, _)| *q == p)
                    .map(|(_, f)| f.clone())
                    .collect();
                let (kubeconfig, ns, cache_dir) =
                    (plane.kubeconfig.clone(), ns.clone(), cache_dir.clone());
                let cache_args: Vec<String> = if older {
                    Vec::new()
                } else {
                    vec!["--cache-dir".into(), cache_dir]
                };
                std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
                    let mut took = Vec::new();
                    for file in mine {
                        let started = Instant::now();
                        let output = std::process::Command::new(binary())
                            .args(["create", "-f", file.to_str().unwrap(), "-n", &ns])
                            .args(&cache_args)
                            .env("KUBECONFIG", &kubeconfig)
                            .env("NO_COLOR", "1")
                            .stdin(Stdio::null())
                            .output()?;
                        took.push(started.elapsed());
                        ensure!(
                            output.status.success(),
                            "create: {}",
                            String::from_utf8_lossy(&output.stderr)
                        );
                    }
                    Ok(took)
                })
            })
            .collect();
        let mut latencies = Vec::new();
        for worker in workers {
            latencies.extend(worker.join().expect("worker thread")?);
        }
        let wall = started.elapsed();
        group_commit::ensure_allocated(admin, &ns, PROCESSES * per_process).await?;
        let cell = workload::Cell {
            ops: latencies.len() as u64,
            ports: latencies.len() as u64,
            wall,
            latencies,
            ..Default::default()
        };
        let (p50, p99) = (cell.percentile_ms(50.0), cell.percentile_ms(99.0));
        rows.push(Row {
            id: "2l",
            what: format!(
                "{PROCESSES} concurrent `kubectl portalloc create -f` processes x {per_process} \
                 new 1-port objects, process start included, {}",
                if older {
                    format!("the build at {}", binary())
                } else if shared_cache {
                    "copies kept in one shared cache directory".to_string()
                } else {
                    "no cache (`--cache-dir ''`)".to_string()
                }
            ),
            ours: format!(
                "p50 {p50:.0} ms, p99 {p99:.0} ms; {:.1} creates/s",
                cell.ops as f64 / wall.as_secs_f64()
            ),
            anchor: crate::dash(),
            ratio: crate::dash(),
            target: "p99 ≤ 1.0 s".into(),
            met: yes_no(p99 <= 1000.0),
        });
    }
    Ok(rows)
}

pub async fn sync_all_at_scale(
    plane: &ControlPlane,
    admin: &Client,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let counts: &[usize] = if quick { &[300] } else { &[25_000, 65_535] };
    let clients = plane.clients(16).await?;
    let mut rows = Vec::new();
    for &count in counts {
        let (ns, pool) = (format!("scale-{count}"), format!("scale-{count}"));
        workload::create_namespace(admin, &ns).await?;
        workload::create_pool(admin, &pool, "1-65535").await?;
        let applying = Instant::now();
        group_commit::apply(&clients, &ns, &pool, count).await?;
        let applied = applying.elapsed();
        let started = Instant::now();
        let output = std::process::Command::new(binary())
            .args(["sync", "--all", "-n", &ns, "-v", "2"])
            .env("KUBECONFIG", &plane.kubeconfig)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()?;
        let wall = started.elapsed();
        // The admin client's connections sat idle through the sync; the server may have closed
        // them, and a request sent on one just closed fails: start afresh.
        let admin = &plane.client().await?;
        let log = String::from_utf8_lossy(&output.stderr);
        let shard_writes = log
            .lines()
            .filter(|l| {
                l.contains("PUT /apis/portalloc.dev/v1alpha1/portpoolshards/")
                    && (l.contains("/status ") || l.contains("/status?"))
            })
            .count();
        let conflicts = log
            .lines()
            .filter(|l| l.contains("/portpoolshards/") && l.contains(" 409 "))
            .count();
        let failed = log
            .lines()
            .find(|l| l.contains("could not be synced"))
            .unwrap_or_default()
            .to_string();
        ensure!(output.status.success(), "sync --all of {count}: {failed}");
        std::fs::write(
            format!("{}/2m-{count}.log", std::env::temp_dir().display()),
            log.as_bytes(),
        )?;
        group_commit::ensure_allocated(admin, &ns, count).await?;
        let mut floors = Vec::new();
        for writers in [16, 64] {
            floors.push((
                writers,
                status_floor(&clients, admin, &ns, writers, None).await?,
            ));
        }
        let floor = floors
            .iter()
            .map(|(w, d)| format!("{w} clients {:.1} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ");
        // Left in place: deleting 65,535 objects takes longer than the measurement, and this
        // cell runs on its own control plane's last minutes.
        rows.push(Row {
            id: "2m",
            what: format!(
                "`kubectl portalloc sync --all` of {count} freshly applied 1-port PortAllocations \
                 into one 1-65535 pool (applied in {:.0} s by 16 clients)",
                applied.as_secs_f64()
            ),
            ours: format!(
                "{:.1} s, 0 failures; {shard_writes} shard writes, {conflicts} conflicts; \
                 floor, {count} bare status writes: {floor}",
                wall.as_secs_f64()
            ),
            anchor: crate::dash(),
            ratio: crate::dash(),
            target: if count == 25_000 {
                "0 failures, 0 conflicts, ≤ 60 s".into()
            } else {
                "0 failures, 0 conflicts".into()
            },
            met: yes_no(conflicts == 0 && (count != 25_000 || wall.as_secs() <= 60)),
        });
    }
    Ok(rows)
}

/// The time `writers` clients take to write every PortAllocation's status in `ns` once more
/// (the first `limit` of them, when given), with nothing else to do: what the API server gives
/// for the sync's last step.
pub async fn status_floor(
    clients: &[Client],
    admin: &Client,
    ns: &str,
    writers: usize,
    limit: Option<usize>,
) -> anyhow::Result<Duration> {
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), ns);
    let mut objects = workload::list_all(&api).await?;
    objects.truncate(limit.unwrap_or(objects.len()));
    let count = objects.len();
    let objects = Arc::new(Mutex::new(objects));
    let apis: Arc<Vec<Api<PortAllocation>>> = Arc::new(
        (0..writers)
            .map(|w| Api::namespaced(clients[w % clients.len()].clone(), ns))
            .collect(),
    );
    let cell = workload::drive(writers, count, move |worker, _| {
        let (apis, objects) = (apis.clone(), objects.clone());
        async move {
            let mut pa = objects.lock().unwrap().pop().expect("one object per item");
            let status = pa.status.get_or_insert_with(Default::default);
            status.observed_generation = Some(status.observed_generation.unwrap_or(0) + 1_000);
            let name = pa.name_any();
            apis[worker]
                .replace_status(&name, &PostParams::default(), &pa)
                .await?;
            Ok(workload::Sample::untimed())
        }
    })
    .await;
    ensure!(
        cell.failures.is_empty(),
        "status floor: {:?}",
        cell.failures
    );
    Ok(cell.wall)
}

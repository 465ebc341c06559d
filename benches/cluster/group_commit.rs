//! 2h: the GitOps sync: `kubectl portalloc sync --all -A` of N freshly applied PortAllocations
//! into one pool (group commit: one pool write for all of them), beside the same N synced one
//! compare-and-swap at a time (what `sync --all` did before) and beside creating N NodePort
//! Services.
//!
//! Runs first, while the cluster holds no other PortAllocation, so `-A` sees exactly these; they
//! are deleted afterwards so the later cells see an empty cluster as before.

use std::time::{Duration, Instant};

use anyhow::ensure;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use portalloc::api::PortAllocation;
use portalloc::k8s::Allocator;
use portalloc::ledger::recorded_holdings;

use crate::controlplane::ControlPlane;
use crate::{Row, cli, metrics, workload, yes_no};

/// NodePort Services per round: the local service CIDR is a /24, so each round is deleted
/// before the next (deletes not timed).
const SERVICES_PER_ROUND: usize = 200;

pub async fn group_commit(
    plane: &ControlPlane,
    admin: &Client,
    count: usize,
) -> anyhow::Result<Vec<Row>> {
    let clients = plane.clients(16).await?;
    let (ns, pool) = ("gitops", "gitops");
    workload::create_namespace(admin, ns).await?;
    workload::create_pool(admin, pool, "10000-19999").await?;
    apply(&clients, ns, pool, count).await?;

    // Ours, as users run it: the CLI, one process, with its request log.
    let before = metrics::scrape(admin).await?;
    let started = Instant::now();
    let output = cli::run(&plane.kubeconfig, &["sync", "--all", "-A", "-v", "2"]);
    let wall = started.elapsed();
    ensure!(
        output.status.success(),
        "sync --all -A: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = metrics::scrape(admin).await?;
    let (requests, breakdown) = metrics::delta(&before, &after);
    let log = String::from_utf8_lossy(&output.stderr);
    // A sharded pool's writes are those of its shards (`<pool>-<window>`).
    let put = format!("PUT /apis/portalloc.dev/v1alpha1/portpools/{pool}/status ");
    let shard_put = format!("PUT /apis/portalloc.dev/v1alpha1/portpoolshards/{pool}-");
    let pool_writes = log
        .lines()
        .filter(|l| {
            l.contains(&put)
                || (l.contains(&shard_put) && (l.contains("/status ") || l.contains("/status?")))
        })
        .count();
    ensure_allocated(admin, ns, count).await?;

    // Before group commit: the same objects synced one compare-and-swap at a time, in process.
    let (old_ns, old_pool) = ("gitops-one-by-one", "gitops-one-by-one");
    workload::create_namespace(admin, old_ns).await?;
    workload::create_pool(admin, old_pool, "10000-19999").await?;
    apply(&clients, old_ns, old_pool, count).await?;
    let allocator = Allocator::new(admin.clone());
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), old_ns);
    let started = Instant::now();
    let mut old_conflicts = 0;
    for pa in api.list(&ListParams::default()).await?.items {
        old_conflicts += allocator.sync(pa).await?.conflicts;
    }
    let one_by_one = started.elapsed();
    ensure_allocated(admin, old_ns, count).await?;

    // The anchor: N NodePort Services, created by 1 and by 16 clients.
    let svc_ns = "gitops-services";
    workload::create_namespace(admin, svc_ns).await?;
    let mut anchor = Vec::new();
    for concurrency in [1, 16] {
        let mut created = Duration::ZERO;
        let mut done = 0;
        let mut round = 0;
        while done < count {
            let n = SERVICES_PER_ROUND.min(count - done);
            let tag = format!("gitops-c{concurrency}-r{round}");
            let cell = workload::run_services(&clients[..concurrency], svc_ns, &tag, n, 1).await;
            ensure!(cell.failures.is_empty(), "services: {:?}", cell.failures);
            created += cell.wall;
            workload::delete_services(&clients, svc_ns).await?;
            done += n;
            round += 1;
        }
        anchor.push((concurrency, created));
    }

    for namespace in [ns, old_ns] {
        Api::<PortAllocation>::namespaced(admin.clone(), namespace)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await?;
    }

    let fastest = anchor.iter().map(|(_, d)| *d).min().unwrap_or_default();
    let ratio = wall.as_secs_f64() / fastest.as_secs_f64();
    Ok(vec![Row {
        id: "2h",
        what: format!(
            "`kubectl portalloc sync --all -A -v 2` of {count} freshly applied 1-port PortAllocations \
             into one pool: wall time, pool writes (request log), all requests"
        ),
        ours: format!(
            "{:.2} s; {pool_writes} pool write{}; {requests} requests ({breakdown}). Before \
             (one compare-and-swap each, in process): {:.2} s, {count} pool writes, {old_conflicts} conflicts",
            wall.as_secs_f64(),
            if pool_writes == 1 { "" } else { "s" },
            one_by_one.as_secs_f64()
        ),
        anchor: anchor
            .iter()
            .map(|(c, d)| {
                format!(
                    "{count} NodePort Services, {c} client{}: {:.2} s",
                    if *c == 1 { "" } else { "s" },
                    d.as_secs_f64()
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        ratio: format!("{ratio:.2} (of the faster)"),
        target: "one write per touched shard (40), ratio < 1".into(),
        met: yes_no(pool_writes <= 40 && ratio < 1.0),
    }])
}

/// `count` new PortAllocations, as `kubectl apply` leaves them (16 concurrent creates).
pub async fn apply(clients: &[Client], ns: &str, pool: &str, count: usize) -> anyhow::Result<()> {
    let apis: std::sync::Arc<Vec<Api<PortAllocation>>> = std::sync::Arc::new(
        clients
            .iter()
            .map(|c| Api::namespaced(c.clone(), ns))
            .collect(),
    );
    let (ns, pool) = (ns.to_string(), pool.to_string());
    let cell = workload::drive(clients.len(), count, move |worker, item| {
        let apis = apis.clone();
        let pa = workload::allocation(&format!("app-{item:04}"), &ns, &pool, 1, 1);
        async move {
            apis[worker].create(&Default::default(), &pa).await?;
            Ok(workload::Sample::untimed())
        }
    })
    .await;
    ensure!(cell.failures.is_empty(), "apply: {:?}", cell.failures);
    Ok(())
}

pub async fn ensure_allocated(admin: &Client, ns: &str, count: usize) -> anyhow::Result<()> {
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), ns);
    let mut ports: Vec<u16> = workload::list_all(&api)
        .await?
        .iter()
        .flat_map(|pa| {
            pa.status
                .as_ref()
                .map(recorded_holdings)
                .unwrap_or_default()
                .ports()
                .collect::<Vec<_>>()
        })
        .collect();
    let held = ports.len();
    ports.sort_unstable();
    ports.dedup();
    ensure!(
        held == count && ports.len() == count,
        "{ns}: {held} ports recorded, {} distinct, for {count} PortAllocations",
        ports.len()
    );
    Ok(())
}

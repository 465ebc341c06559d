//! The operations measured against the API server, and a driver that runs them from N clients
//! at once: our allocation (create a PortAllocation, then `Allocator::sync`) and the anchor,
//! creating a `type: NodePort` Service (kube-apiserver allocates its node ports).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Namespace, Service, ServicePort, ServiceSpec};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};

use portalloc::api::{
    PortAllocation, PortAllocationSpec, PortPool, PortPoolSpec, PortRequest, PortScope, Role,
    StaticBandSetting,
};
use portalloc::k8s::Allocator;
use portalloc::ledger::Reason;

/// One finished operation.
pub struct Sample {
    pub latency: Duration,
    pub ports: u64,
    pub attempts: u32,
    pub conflicts: u32,
}

impl Sample {
    /// One operation done once, whose own time is not looked at (setup, or a cell's wall time).
    pub fn untimed() -> Sample {
        Sample {
            latency: Duration::ZERO,
            ports: 0,
            attempts: 1,
            conflicts: 0,
        }
    }
}

/// Many operations from one run of the driver (or several, absorbed).
#[derive(Default)]
pub struct Cell {
    pub ops: u64,
    pub ports: u64,
    pub wall: Duration,
    pub latencies: Vec<Duration>,
    pub attempts: u64,
    pub conflicts: u64,
    pub failures: Vec<String>,
}

impl Cell {
    pub fn absorb(&mut self, other: Cell) {
        self.ops += other.ops;
        self.ports += other.ports;
        self.wall += other.wall;
        self.latencies.extend(other.latencies);
        self.attempts += other.attempts;
        self.conflicts += other.conflicts;
        self.failures.extend(other.failures);
    }

    pub fn ports_per_second(&self) -> f64 {
        self.ports as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Nearest-rank percentile of the per-operation latencies, in milliseconds.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
        sorted[rank.min(sorted.len()) - 1].as_secs_f64() * 1e3
    }

    /// The mean latency in ms (NaN when there is none).
    pub fn mean_ms(&self) -> f64 {
        let total: Duration = self.latencies.iter().sum();
        total.as_secs_f64() * 1e3 / self.latencies.len() as f64
    }

    /// Retried attempts: every attempt after the first of each operation.
    pub fn retries(&self) -> u64 {
        self.attempts.saturating_sub(self.ops)
    }
}

/// Runs `count` operations from `workers` concurrent workers; worker `w` runs `op(w, i)` for
/// each item `i` it claims, one after another. Wall time is from start to the last completion.
pub async fn drive<F, Fut>(workers: usize, count: usize, op: F) -> Cell
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<Sample>> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let (op, next) = (op.clone(), next.clone());
            tokio::spawn(async move {
                let mut results = Vec::new();
                loop {
                    let item = next.fetch_add(1, Ordering::Relaxed);
                    if item >= count {
                        break results;
                    }
                    results.push(op(worker, item).await);
                }
            })
        })
        .collect();
    let mut cell = Cell::default();
    for task in tasks {
        for result in task.await.expect("worker task panicked") {
            match result {
                Ok(sample) => {
                    cell.ops += 1;
                    cell.ports += sample.ports;
                    cell.latencies.push(sample.latency);
                    cell.attempts += u64::from(sample.attempts);
                    cell.conflicts += u64::from(sample.conflicts);
                }
                Err(e) => cell.failures.push(format!("{e:#}")),
            }
        }
    }
    cell.wall = started.elapsed();
    cell
}

pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("create namespace {name}"))?;
    Ok(())
}

/// Every object `api` lists, in pages: one list of 65,535 objects outlasts the API server's
/// request timeout.
pub async fn list_all<K>(api: &Api<K>) -> anyhow::Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut objects = Vec::new();
    let mut params = kube::api::ListParams::default().limit(2_000);
    loop {
        let page = api.list(&params).await?;
        objects.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(objects),
        }
    }
}

/// A pool as `kubectl portalloc pool create` makes it: the PortPool and every window's shard.
pub async fn create_pool(client: &Client, name: &str, range: &str) -> anyhow::Result<()> {
    let pool = PortPool::new(
        name,
        PortPoolSpec {
            ranges: vec![range.into()],
            exclude: vec![],
            protocol: Default::default(),
            static_band: StaticBandSetting::Auto,
            node_reuse: None,
            follow_nodes: None,
            guard: None,
            allow_overlap: false,
        },
    );
    portalloc::k8s::create_pool(client, pool, true)
        .await
        .with_context(|| format!("create PortPool {name}"))?;
    Ok(())
}

/// The pool's record as the allocator sees it: its shards joined into one.
pub async fn window_record(
    client: &Client,
    pool: &PortPool,
) -> anyhow::Result<portalloc::ledger::WindowRecord> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let shards = portalloc::k8s::ShardStore::new(client.clone())
        .list(&name)
        .await
        .map_err(|(e, _)| e)?;
    let copy = portalloc::ledger::PoolSnapshot::of_pool(pool);
    Ok(portalloc::ledger::CopyRecord::load(copy, shards)?.union_record())
}

/// One role `worker` of `replicas` pods, each with `ports_per_pod` PodScoped ports `p0..`.
pub fn allocation(
    name: &str,
    namespace: &str,
    pool: &str,
    replicas: u32,
    ports_per_pod: u32,
) -> PortAllocation {
    let mut pa = PortAllocation::new(
        name,
        PortAllocationSpec {
            pool: pool.into(),
            roles: vec![Role {
                name: "worker".into(),
                replicas: replicas as i32,
                ports: (0..ports_per_pod)
                    .map(|p| PortRequest {
                        name: format!("p{p}"),
                        scope: PortScope::PodScoped,
                        env: format!("P{p}_PORT"),
                        port: None,
                        ..Default::default()
                    })
                    .collect(),
                references: vec![],
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    pa.metadata.namespace = Some(namespace.into());
    pa
}

/// What `kubectl portalloc create` does for a new object, through the library: create the
/// PortAllocation, then allocate (read the pool, one compare-and-swap of its status, write the
/// PortAllocation's status; on 409 re-read and retry).
pub async fn allocate(
    allocator: &Allocator,
    api: &Api<PortAllocation>,
    pa: PortAllocation,
) -> anyhow::Result<Sample> {
    let started = Instant::now();
    let created = api.create(&PostParams::default(), &pa).await?;
    let report = allocator.sync(created).await?;
    Ok(Sample {
        latency: started.elapsed(),
        ports: report.holdings.len() as u64,
        attempts: report.attempts,
        conflicts: report.conflicts,
    })
}

/// Our side of one cell: `count` new PortAllocations of `ports` ports (one pod) in `pool`.
pub async fn run_ours(
    clients: &[Client],
    namespace: &str,
    pool: &str,
    prefix: &str,
    count: usize,
    ports: u32,
) -> Cell {
    let workers: Arc<Vec<(Allocator, Api<PortAllocation>)>> = Arc::new(
        clients
            .iter()
            .map(|c| {
                (
                    Allocator::new(c.clone()),
                    Api::namespaced(c.clone(), namespace),
                )
            })
            .collect(),
    );
    let (namespace, pool, prefix) = (namespace.to_string(), pool.to_string(), prefix.to_string());
    drive(clients.len(), count, move |worker, item| {
        let workers = workers.clone();
        let pa = allocation(&format!("{prefix}-{item}"), &namespace, &pool, 1, ports);
        async move {
            let (allocator, api) = &workers[worker];
            allocate(allocator, api, pa).await
        }
    })
    .await
}

/// A `type: NodePort` Service with `ports` ports; the API server picks a node port for each.
pub fn node_port_service(name: &str, ports: u32) -> Service {
    Service {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("NodePort".into()),
            ports: Some(
                (0..ports)
                    .map(|p| ServicePort {
                        name: Some(format!("p{p}")),
                        port: 8000 + p as i32,
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The anchor's side of one cell: `count` NodePort Services of `ports` ports each.
pub async fn run_services(
    clients: &[Client],
    namespace: &str,
    prefix: &str,
    count: usize,
    ports: u32,
) -> Cell {
    let apis: Arc<Vec<Api<Service>>> = Arc::new(
        clients
            .iter()
            .map(|c| Api::namespaced(c.clone(), namespace))
            .collect(),
    );
    let prefix = prefix.to_string();
    drive(clients.len(), count, move |worker, item| {
        let apis = apis.clone();
        let service = node_port_service(&format!("{prefix}-{item}"), ports);
        async move {
            let started = Instant::now();
            let created = apis[worker]
                .create(&PostParams::default(), &service)
                .await?;
            let latency = started.elapsed();
            let assigned = created
                .spec
                .and_then(|s| s.ports)
                .unwrap_or_default()
                .iter()
                .filter(|p| p.node_port.is_some())
                .count() as u64;
            if assigned != u64::from(ports) {
                bail!("service {} got {assigned} of {ports} node ports", item);
            }
            Ok(Sample {
                latency,
                ports: assigned,
                attempts: 1,
                conflicts: 0,
            })
        }
    })
    .await
}

/// Deletes every Service in `namespace` (one by one: Services have no deletecollection), which
/// frees their node ports and cluster IPs for the next round.
pub async fn delete_services(clients: &[Client], namespace: &str) -> anyhow::Result<()> {
    let api: Api<Service> = Api::namespaced(clients[0].clone(), namespace);
    let names: Vec<String> = api
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    let names = Arc::new(names);
    let apis: Arc<Vec<Api<Service>>> = Arc::new(
        clients
            .iter()
            .map(|c| Api::namespaced(c.clone(), namespace))
            .collect(),
    );
    let cell = drive(clients.len(), names.len(), move |worker, item| {
        let (apis, names) = (apis.clone(), names.clone());
        async move {
            apis[worker]
                .delete(&names[item], &DeleteParams::default())
                .await?;
            Ok(Sample::untimed())
        }
    })
    .await;
    if let Some(failure) = cell.failures.first() {
        bail!("deleting Services: {failure}");
    }
    Ok(())
}

/// FNV-1a: a stable hash, so a name always maps to the same shard.
fn shard_of(name: &str, shards: usize) -> usize {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % shards as u64) as usize
}

/// Like `run_ours`, but the pool is subdivided: `pools` are PortPools over disjoint sub-ranges of
/// it. Each PortAllocation goes to the shard its name hashes to; if that shard is full, the
/// object is deleted and created again in the next shard, and so on.
pub async fn run_sharded(
    clients: &[Client],
    namespace: &str,
    pools: &[String],
    prefix: &str,
    count: usize,
    ports: u32,
) -> Cell {
    let workers: Arc<Vec<(Allocator, Api<PortAllocation>)>> = Arc::new(
        clients
            .iter()
            .map(|c| {
                (
                    Allocator::new(c.clone()),
                    Api::namespaced(c.clone(), namespace),
                )
            })
            .collect(),
    );
    let pools = Arc::new(pools.to_vec());
    let (namespace, prefix) = (namespace.to_string(), prefix.to_string());
    drive(clients.len(), count, move |worker, item| {
        let (workers, pools, namespace) = (workers.clone(), pools.clone(), namespace.clone());
        let name = format!("{prefix}-{item}");
        async move {
            let (allocator, api) = &workers[worker];
            let started = Instant::now();
            let first = shard_of(&name, pools.len());
            // A full shard costs one attempt (sync's error does not say how many conflicts).
            let mut attempts = 0;
            for k in 0..pools.len() {
                let pool = &pools[(first + k) % pools.len()];
                let pa = allocation(&name, &namespace, pool, 1, ports);
                let created = api.create(&PostParams::default(), &pa).await?;
                match allocator.sync(created).await {
                    Ok(report) => {
                        return Ok(Sample {
                            latency: started.elapsed(),
                            ports: report.holdings.len() as u64,
                            attempts: attempts + report.attempts,
                            conflicts: report.conflicts,
                        });
                    }
                    Err(e) if e.refusal().is_some_and(|r| r.reason() == Reason::PoolFull) => {
                        attempts += 1;
                        api.delete(&name, &DeleteParams::default()).await?;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            bail!("{name}: every shard is full")
        }
    })
    .await
}

//! 2r: a GPU fleet placed by the real kube-scheduler, with a pool that reuses its ports across
//! nodes (issue 28, goal 3). How many pods stay Pending for their ports while a node has the
//! GPUs they ask for?
//!
//! Per seed, on a control plane of its own (so the scheduler sees only this fleet): 32 Node
//! objects of 8 GPUs kept as kubelets would (`tests/common/nodes.rs`), kube-scheduler and
//! kube-controller-manager built from the pinned Kubernetes module (`tests/common/controllers.rs`;
//! the scheduler scores nodes MostAllocated on GPUs), the pod webhook process
//! (`tests/common/webhook.rs`). PortAllocations of 1-4 pods of 1, 2, 4 or 8 GPUs with 3-6
//! PodScoped ports each (`fleet_workload.rs`) are created in random order until 95 % of the GPUs
//! are asked for, each with its StatefulSet of hostNetwork pods; the StatefulSet controller makes
//! the pods, the webhook allocates at the first pod's admission, injects the env and declares the
//! ports, the scheduler places them. The pool has a third of the ports the pods hold, `nodeReuse:
//! 4`. Once every pod is bound or refused and nothing changes for a while, `fleet_count.rs`
//! counts. The first seed's fleet runs once more with `nodeReuse: 1` and a pool of every port
//! the pods hold: the baseline, where no two pods share a port.
//!
//! Quick mode: 4 nodes, one seed, no baseline. Without kube-scheduler and kube-controller-manager (they
//! could not be built or started) the cell says so and is skipped.
//!
//! To study other settings: `PORTALLOC_BENCH_FLEET_REUSE=N` (default 4) and
//! `PORTALLOC_BENCH_FLEET_SHARE=D` (the pool has 1/D of the held ports; default 3) change the
//! measured pool, `PORTALLOC_BENCH_FLEET_SCORING=LeastAllocated` the scheduler's scoring of GPUs
//! (default MostAllocated), `PORTALLOC_BENCH_FLEET_DUMP=1` prints every pod's node, copy and ports.

use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

use crate::controllers::{Controllers, ControllersOptions, controllers_bin_dir};
use crate::controlplane::{ControlPlane, install_crds};
use crate::fleet_count::{Figures, PodView, count};
use crate::fleet_workload::{self as drawn, Fleet, GPUS_PER_NODE};
use crate::nodes::{NodeShape, Nodes};
use crate::webhook::start_webhook;
use crate::{Row, dash, workload, yes_no};
use portalloc::api::{PortAllocation, PortPool};
use portalloc::ledger::recorded_holdings;

const NAMESPACE: &str = "fleet";
const POOL: &str = "fleet";
const FIRST_PORT: u32 = 20000;
const WEBHOOK_NAMESPACE: &str = "portalloc-system";

/// What is measured: the pool's `nodeReuse`, the pool's share of the held ports (1/divisor),
/// and the scheduler's scoring strategy for GPUs.
struct Settings {
    reuse: u32,
    divisor: u32,
    scoring: String,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let number = |name: &str, default: u32| -> anyhow::Result<u32> {
            match std::env::var(name) {
                Ok(v) => v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=256).contains(n))
                    .with_context(|| format!("{name}={v}: expected a number from 1 to 256")),
                Err(_) => Ok(default),
            }
        };
        Ok(Settings {
            reuse: number("PORTALLOC_BENCH_FLEET_REUSE", 4)?,
            divisor: number("PORTALLOC_BENCH_FLEET_SHARE", 3)?,
            scoring: std::env::var("PORTALLOC_BENCH_FLEET_SCORING")
                .unwrap_or_else(|_| "MostAllocated".into()),
        })
    }
}

/// How long pods may take to be made and decided; how long nothing may change before we count
/// (the scheduler's longest retry backoff is 10 s).
fn timeouts(quick: bool) -> (Duration, Duration) {
    if quick {
        (Duration::from_secs(180), Duration::from_secs(4))
    } else {
        (Duration::from_secs(900), Duration::from_secs(12))
    }
}

pub async fn measure(quick: bool) -> anyhow::Result<Vec<Row>> {
    let nodes = if quick { 4 } else { 32 };
    let seeds: u64 = match std::env::var("PORTALLOC_BENCH_SEEDS") {
        Ok(n) => n.parse::<u64>()?.clamp(1, 8),
        Err(_) if quick => 1,
        Err(_) => 3,
    };
    let settings = Settings::from_env()?;
    if let Err(e) = controllers_bin_dir() {
        eprintln!("2r skipped: {e:#}");
        return Ok(vec![skipped(&e)]);
    }
    let mut rows = Vec::new();
    let mut missed = 0;
    let mut baseline = None;
    for seed in 1..=seeds {
        let fleet = Fleet::draw(seed, nodes);
        let size = fleet.pool_size(settings.divisor, settings.reuse);
        let label = format!("s{seed}");
        let placed = match place(&fleet, &settings, size, &label, quick).await? {
            Ok(placed) => placed,
            Err(skip) => return Ok(vec![skipped(&skip)]),
        };
        missed += placed.0.pending_for_ports.len();
        rows.push(row(&fleet, &settings, size, &placed));
        // The baseline is for the full run: quick mode only checks that the cell still works.
        if seed == 1 && !quick {
            let one = Settings {
                reuse: 1,
                divisor: 1,
                scoring: settings.scoring.clone(),
            };
            let size = fleet.pool_size(1, 1);
            if let Ok(placed) = place(&fleet, &one, size, "base", quick).await? {
                baseline = Some(row(&fleet, &one, size, &placed));
            }
        }
    }
    rows.extend(baseline);
    rows.push(Row {
        id: "2r",
        what: format!(
            "fleet: pods Pending for ports while a node has their GPUs, over {seeds} seed(s), \
             nodeReuse {}, pool 1/{} of the held ports",
            settings.reuse, settings.divisor
        ),
        ours: missed.to_string(),
        anchor: dash(),
        ratio: dash(),
        target: "0".into(),
        met: yes_no(missed == 0),
    });
    Ok(rows)
}

fn skipped(e: &anyhow::Error) -> Row {
    Row {
        id: "2r",
        what: "fleet placed by kube-scheduler".into(),
        ours: format!(
            "skipped: kube-scheduler and kube-controller-manager are not available ({})",
            format!("{e:#}").lines().next().unwrap_or_default()
        ),
        anchor: dash(),
        ratio: dash(),
        target: dash(),
        met: dash(),
    }
}

fn row(fleet: &Fleet, settings: &Settings, size: u32, placed: &(Figures, Duration)) -> Row {
    let (f, took) = placed;
    let held = fleet.held_ports();
    let share = held.div_ceil(settings.divisor);
    let grown = if size > share {
        format!(", grown from {share} so that each PortAllocation fits in one copy")
    } else {
        String::new()
    };
    let what = if settings.reuse == 1 && settings.divisor == 1 {
        format!(
            "fleet baseline: seed {}'s fleet again, nodeReuse 1 and a pool of {size} ports (every \
             port the pods hold: no two pods share one)",
            fleet.seed
        )
    } else {
        format!(
            "fleet, seed {}: {} nodes × {GPUS_PER_NODE} GPUs, {} PortAllocations ({} pods) of 1-4 \
             pods of 1/2/4/8 GPUs with 3-6 PodScoped ports, hostNetwork StatefulSets through the \
             webhook, kube-scheduler ({} on GPUs); {} of {} GPUs asked; pool of {size} ports for \
             the {held} the pods hold (1/{}{grown}), nodeReuse {}",
            fleet.seed,
            fleet.nodes,
            fleet.groups.len(),
            fleet.pods(),
            settings.scoring,
            fleet.asked_gpus(),
            fleet.gpus(),
            settings.divisor,
            settings.reuse,
        )
    };
    Row {
        id: "2r",
        what,
        ours: format!(
            "**{}** Pending for ports; {} Pending for GPUs only; {}/{} bound ({} GPUs left free); \
             copies in use {} of {}; a pod kept off ≤ {} nodes by other holders of its ports \
             (bound k × (N−1) = {} for that pod); a pod shares ports with ≤ {} others (mean {:.1}); \
             {:.0} s",
            f.pending_for_ports.len(),
            f.pending_for_gpus,
            f.bound,
            f.pods,
            f.free_gpus,
            f.copies_in_use,
            f.reuse,
            f.kept_off.0,
            f.kept_off.2,
            f.sharing_max,
            f.sharing_mean,
            took.as_secs_f64()
        ),
        anchor: dash(),
        ratio: dash(),
        target: "0 Pending for ports".into(),
        met: yes_no(f.pending_for_ports.is_empty()),
    }
}

/// The webhook process, killed when this goes.
struct Webhook(Child);

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Place `fleet` on a control plane of its own with a pool of `size` ports and the settings.
/// `Ok(Err(_))`: the controllers could not be started (the cell is skipped).
async fn place(
    fleet: &Fleet,
    settings: &Settings,
    size: u32,
    label: &str,
    quick: bool,
) -> anyhow::Result<Result<(Figures, Duration), anyhow::Error>> {
    eprintln!(
        "2r {label}: {} nodes, {} PortAllocations, {} pods, {} of {} GPUs, pool {size} ports, \
         nodeReuse {}",
        fleet.nodes,
        fleet.groups.len(),
        fleet.pods(),
        fleet.asked_gpus(),
        fleet.gpus(),
        settings.reuse
    );
    let reuse = settings.reuse;
    // Dropped in reverse: the webhook, the heartbeat, the controllers, then the control plane.
    let plane = ControlPlane::up(&format!("bench-fleet-{label}"))?;
    install_crds(&plane.kubeconfig)?;
    let kubeconfig = plane
        .kubeconfig
        .to_str()
        .context("kubeconfig path is not UTF-8")?;
    let config = tempfile::NamedTempFile::new()?;
    std::fs::write(
        config.path(),
        drawn::scheduler_config(kubeconfig, &settings.scoring),
    )?;
    let options = ControllersOptions {
        scheduler_args: vec![format!("--config={}", config.path().display())],
        ..ControllersOptions::default()
    };
    let _controllers = match Controllers::start_with(&plane.kubeconfig, &options) {
        Ok(controllers) => controllers,
        Err(e) => return Ok(Err(e)),
    };
    let client = plane.client().await?;
    let shape = NodeShape::gpu_server();
    let nodes = Nodes::register(&client, &plane.kubeconfig, "gpu", fleet.nodes, &shape).await?;
    workload::create_namespace(&client, WEBHOOK_NAMESPACE).await?;
    let _webhook = Webhook(start_webhook(&plane.kubeconfig, &client, WEBHOOK_NAMESPACE).await?);
    workload::create_namespace(&client, NAMESPACE).await?;
    let pool: PortPool = serde_json::from_value(drawn::pool(POOL, FIRST_PORT, size, reuse))?;
    portalloc::k8s::create_pool(&client, pool, true)
        .await
        .context("create the fleet's PortPool")?;

    let started = Instant::now();
    let allocations: Api<PortAllocation> = Api::namespaced(client.clone(), NAMESPACE);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    for group in &fleet.groups {
        let pa: PortAllocation = serde_json::from_value(drawn::allocation(group, POOL))?;
        allocations
            .create(&PostParams::default(), &pa)
            .await
            .with_context(|| format!("create PortAllocation {}", group.name))?;
        let set: StatefulSet = serde_json::from_value(drawn::stateful_set(group))?;
        sets.create(&PostParams::default(), &set)
            .await
            .with_context(|| format!("create StatefulSet {}", group.name))?;
    }
    let pods = settle(&client, fleet, quick).await?;
    let took = started.elapsed();
    // Without its ports declared a pod is kept off no node: the count would mean nothing.
    let ports: BTreeMap<&str, u32> = fleet
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.ports))
        .collect();
    if let Some(pod) = pods
        .iter()
        .find(|p| ports.get(p.group.as_str()).copied() != Some(p.ports.len() as u32))
    {
        bail!(
            "fleet seed {}: pod {} declares {} host ports, its PortAllocation {} gives it {:?}: \
             the pod webhook did not declare them",
            fleet.seed,
            pod.name,
            pod.ports.len(),
            pod.group,
            ports.get(pod.group.as_str())
        );
    }

    let copies: BTreeMap<String, u16> = allocations
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|pa| {
            pa.status
                .as_ref()
                .is_some_and(|s| !recorded_holdings(s).is_empty())
        })
        .map(|pa| (pa.metadata.name.clone().unwrap_or_default(), pa.pool_copy()))
        .collect();
    let gpus: BTreeMap<String, u32> = nodes
        .names()
        .map(|n| (n.to_string(), GPUS_PER_NODE))
        .collect();
    let figures = count(&pods, &copies, &gpus, reuse as u16);
    if !figures.collisions.is_empty() {
        bail!(
            "fleet seed {}: two pods declare one port on one node (kube-scheduler's NodePorts \
             filter should prevent it): {}",
            fleet.seed,
            figures.collisions.join("; ")
        );
    }
    eprintln!(
        "2r {label}: {} bound, {} Pending for ports, {} for GPUs only, {} GPUs free, copies {}/{}, \
         kept off ≤ {} nodes ({}, bound {}), sharing ≤ {} (mean {:.1}), {:.0} s",
        figures.bound,
        figures.pending_for_ports.len(),
        figures.pending_for_gpus,
        figures.free_gpus,
        figures.copies_in_use,
        reuse,
        figures.kept_off.0,
        figures.kept_off.1,
        figures.kept_off.2,
        figures.sharing_max,
        figures.sharing_mean,
        took.as_secs_f64()
    );
    for line in &figures.why {
        eprintln!("  pending for ports: {line}");
    }
    if std::env::var_os("PORTALLOC_BENCH_FLEET_DUMP").is_some() {
        dump(&pods, &copies);
    }
    Ok(Ok((figures, took)))
}

/// Every pod with its node (or why not), GPUs, copy and ports: to study a placement.
fn dump(pods: &[PodView], copies: &BTreeMap<String, u16>) {
    for pod in pods {
        let ports: Vec<String> = pod.ports.iter().map(u16::to_string).collect();
        eprintln!(
            "  pod {} gpus {} copy {} node {} ports {}",
            pod.name,
            pod.gpus,
            copies.get(&pod.group).copied().unwrap_or(0),
            pod.node.as_deref().unwrap_or("-"),
            ports.join(",")
        );
    }
}

/// A pod's name, node and the scheduler's refusal.
type Decided = (String, Option<String>, Option<String>);

/// Until every pod of the fleet exists and is bound or refused by the scheduler, and none of
/// that has changed for the settle time; the pods as they are then.
async fn settle(client: &Client, fleet: &Fleet, quick: bool) -> anyhow::Result<Vec<PodView>> {
    let (timeout, quiet) = timeouts(quick);
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let expected = fleet.pods() as usize;
    let started = Instant::now();
    // Each pod's node and refusal, and since when they are so.
    let mut last: Option<(Vec<Decided>, Instant)> = None;
    loop {
        let mut pods: Vec<PodView> = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(PodView::of)
            .collect();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        let decided = pods.iter().filter(|p| p.decided()).count();
        if pods.len() == expected && decided == expected {
            let state: Vec<_> = pods
                .iter()
                .map(|p| (p.name.clone(), p.node.clone(), p.refused.clone()))
                .collect();
            match &last {
                Some((seen, since)) if *seen == state => {
                    if since.elapsed() >= quiet {
                        return Ok(pods);
                    }
                }
                _ => last = Some((state, Instant::now())),
            }
        } else {
            last = None;
        }
        if started.elapsed() > timeout {
            let refused = pending_allocations(client).await.unwrap_or_default();
            bail!(
                "fleet seed {}: after {} s, {} of {expected} pods made, {decided} bound or refused \
                 by the scheduler{refused}",
                fleet.seed,
                timeout.as_secs(),
                pods.len()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// PortAllocations that hold no port yet (refused by the pool, or never synced), for an error.
async fn pending_allocations(client: &Client) -> anyhow::Result<String> {
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), NAMESPACE);
    let missing: Vec<String> = api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|pa| {
            pa.status
                .as_ref()
                .is_none_or(|s| recorded_holdings(s).is_empty())
        })
        .map(|pa| {
            let why = pa
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.status == "False"))
                .map(|c| format!(": {}", c.message))
                .unwrap_or_default();
            format!("{}{why}", pa.metadata.name.clone().unwrap_or_default())
        })
        .collect();
    Ok(if missing.is_empty() {
        String::new()
    } else {
        format!("; PortAllocations holding no port: {}", missing.join("; "))
    })
}

//! 2g: what a burst of PortAllocations applied at once (as a GitOps sync does) costs the
//! in-cluster watcher: the time from the first create until every one is Ready.

use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use portalloc::api::PortAllocation;
use portalloc::k8s::process::Readiness;
use portalloc::k8s::{Allocator, WatchOptions};

use crate::workload;

/// Seconds until `count` PortAllocations created back to back are all Ready under a watcher
/// running in this process, and how long the creates alone took.
pub async fn watcher_burst(admin: &Client, count: usize) -> anyhow::Result<(Duration, Duration)> {
    let ns = "burst";
    workload::create_namespace(admin, ns).await?;
    workload::create_pool(admin, "burst", "40000-49999").await?;
    let readiness = Readiness::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let watcher = tokio::spawn(portalloc::k8s::watch(
        admin.clone(),
        Allocator::new(admin.clone()),
        WatchOptions {
            namespace: Some(ns.into()),
            resync: Duration::from_secs(300),
            concurrency: 4,
            pool_metrics: false,
        },
        readiness.clone(),
        portalloc::k8s::Metrics::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    while !readiness.is_ready() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), ns);
    let started = Instant::now();
    for i in 0..count {
        let pa = workload::allocation(&format!("burst-{i}"), ns, "burst", 1, 1);
        api.create(&PostParams::default(), &pa).await?;
    }
    let created = started.elapsed();
    loop {
        let ready = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|pa| {
                pa.status.as_ref().is_some_and(|s| {
                    s.observed_generation == pa.metadata.generation
                        && s.conditions
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                })
            })
            .count();
        if ready == count {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "only {ready} of {count} Ready after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_ready = started.elapsed();
    let _ = stop.send(());
    watcher.await?;
    Ok((all_ready, created))
}

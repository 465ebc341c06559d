//! The watcher's reconciles of one pool that are in flight together share one write per changed
//! shard (group commit), in process and namespace-scoped, on the shared cluster.

use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use portalloc::api::PortAllocation;
use portalloc::k8s::process::Readiness;
use portalloc::k8s::{Allocator, WatchOptions};

use crate::pool_cache::{recording_client, taken};
use crate::support::invariants::assert_consistent;
use crate::support::{self, simple_allocation};

const OBJECTS: usize = 40;

#[tokio::test]
async fn reconciles_in_flight_together_share_one_pool_write() {
    let admin = support::client().await;
    let ns = support::namespace(&admin, "watch-batch").await;
    let pool = support::unique_name("watch-batch");
    support::create_pool(&pool, "36300-36499");
    // Applied before the watcher starts: its first list hands it all of them at once.
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), &ns);
    for i in 0..OBJECTS {
        let yaml = simple_allocation(&format!("app-{i:02}"), &pool, "web", 2, &["http"]);
        let pa: PortAllocation = serde_yaml::from_str(&yaml).unwrap();
        api.create(&PostParams::default(), &pa).await.unwrap();
    }
    let (client, log) = recording_client().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let watcher = tokio::spawn(portalloc::k8s::watch(
        client.clone(),
        Allocator::new(client),
        WatchOptions {
            namespace: Some(ns.clone()),
            resync: Duration::from_secs(300),
            concurrency: 8,
            pool_metrics: false,
        },
        Readiness::default(),
        portalloc::k8s::Metrics::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let started = Instant::now();
    loop {
        let ready = api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|pa| {
                pa.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
            })
            .count();
        if ready == OBJECTS {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{ready} of {OBJECTS} Ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    watcher.await.unwrap();

    let held = assert_consistent(&admin, &pool).await;
    assert_eq!(held.len(), OBJECTS);
    assert!(held.values().all(|h| h.len() == 2));
    let requests = taken(&log, &pool);
    let writes = requests.iter().filter(|r| *r == "PUT shard/status").count();
    // One at a time this is 40 writes; eight reconciles at once share them.
    assert!(
        (1..=OBJECTS / 2).contains(&writes),
        "{writes} shard writes for {OBJECTS} objects: {requests:?}"
    );
    eprintln!("watch-batch: {writes} shard writes for {OBJECTS} objects");
}

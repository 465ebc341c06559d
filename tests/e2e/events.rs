//! The watcher's Kubernetes Events, on a control plane of its own, as the ServiceAccount
//! deploy/watcher.yaml ships: an allocation is an `Allocated` Event on its PortAllocation; one
//! that cannot fit (pool full) a `Refused` Warning with the reason and message its status
//! carries, and resynced again and again it stays one Event whose series count grows (and one
//! `PoolFull` Event on the pool); a deletion `Released`; a repair `Repaired` on the pool. An
//! identity without the Events rights works the same and says so at debug level only.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use portalloc::api::PortAllocation;

use crate::leader_election::{SYSTEM, cluster_with_watcher_account, is_ready};
use crate::support::allocation;
use crate::support::apply::apply_value;
use crate::support::events::events_about;
use crate::support::poll::until;
use crate::support::service_account::{service_account_kubeconfig, watcher_role_without};
use crate::support::watcher_process::WatcherProcess;

/// The Events in `namespace` about `name` (of any kind) with this reason.
async fn events(client: &Client, namespace: &str, name: &str, reason: &str) -> Vec<Event> {
    events_about(client, namespace, name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

fn series_count(event: &Event) -> i32 {
    event.series.as_ref().map_or(1, |s| s.count)
}

/// The watcher's ClusterRole from deploy/watcher.yaml without its Events rule, bound to
/// ServiceAccount `name`.
async fn watcher_role_without_events(client: &Client, name: &str) {
    for object in watcher_role_without("events", name, SYSTEM) {
        apply_value(client, object, None).await;
    }
}

#[tokio::test]
async fn the_watcher_says_what_it_did_and_a_refusal_at_every_resync_is_one_series() {
    let dir = tempfile::tempdir().unwrap();
    let Some((cluster, client, kubeconfig)) =
        cluster_with_watcher_account("events", dir.path()).await
    else {
        return;
    };
    assert!(
        cluster
            .run(&["pool", "create", "small", "--range", "30200-30203"])
            .ok()
    );
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), "apps");
    let args = ["-A", "--resync", "2s", "--leader-elect", "-v", "1"];
    let watcher = WatcherProcess::start_as_pod(&kubeconfig, SYSTEM, "events-a", &args, dir.path());
    until("events-a leads", Duration::from_secs(30), || async {
        watcher.leading()
    })
    .await;

    // Allocated.
    api.create(&PostParams::default(), &allocation("fits", "small", 2))
        .await
        .unwrap();
    until("fits Ready", Duration::from_secs(30), || {
        is_ready(&api, "fits")
    })
    .await;
    let fits = api.get("fits").await.unwrap();
    until("an Allocated Event", Duration::from_secs(10), || async {
        !events(&client, "apps", "fits", "Allocated")
            .await
            .is_empty()
    })
    .await;
    let allocated = events(&client, "apps", "fits", "Allocated").await;
    assert_eq!(allocated.len(), 1, "{allocated:?}");
    let event = &allocated[0];
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some("portalloc-watcher")
    );
    assert_eq!(event.reporting_instance.as_deref(), Some("events-a"));
    assert_eq!(
        event.regarding.as_ref().unwrap().uid,
        fits.metadata.uid.clone()
    );
    assert_eq!(
        event.note.as_deref(),
        Some("allocated 2 ports from PortPool small; it holds 2 of the 2 its spec asks for")
    );

    // Refused, resync after resync (every 2 s): one Event, its series counting.
    api.create(&PostParams::default(), &allocation("too-big", "small", 8))
        .await
        .unwrap();
    until("a Refused Event", Duration::from_secs(30), || async {
        !events(&client, "apps", "too-big", "Refused")
            .await
            .is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(9)).await;
    let refused = events(&client, "apps", "too-big", "Refused").await;
    assert_eq!(
        refused.len(),
        1,
        "one Event, not one per resync: {refused:?}"
    );
    let event = &refused[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(series_count(event) >= 3, "{event:?}");
    let status = api.get("too-big").await.unwrap().status.unwrap();
    let stalled = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled" && c.status == "True")
        .expect("a Stalled condition");
    assert_eq!(stalled.reason, "PoolFull");
    assert_eq!(
        event.note.as_deref(),
        Some(format!("{}: {}", stalled.reason, stalled.message).as_str())
    );
    // The pool's story too: one PoolFull Event on PortPool small (in namespace default), the
    // refused PortAllocation as its related object.
    let on_pool = events(&client, "default", "small", "PoolFull").await;
    assert_eq!(on_pool.len(), 1, "{on_pool:?}");
    assert_eq!(
        on_pool[0].regarding.as_ref().unwrap().kind.as_deref(),
        Some("PortPool")
    );
    assert_eq!(
        on_pool[0].related.as_ref().unwrap().name.as_deref(),
        Some("too-big")
    );
    assert!(series_count(&on_pool[0]) >= 2, "{:?}", on_pool[0]);
    eprintln!(
        "events: too-big refused at every 2 s resync: 1 Event, series count {} ({} on the pool)",
        series_count(event),
        series_count(&on_pool[0])
    );

    // Released: a deletion frees the ports.
    api.delete("fits", &DeleteParams::default()).await.unwrap();
    until("a Released Event", Duration::from_secs(30), || async {
        !events(&client, "apps", "fits", "Released").await.is_empty()
    })
    .await;

    // Repaired: a PortAllocation synced and deleted while no watcher runs leaves its entry; the
    // next watcher's repair pass frees it and says so on the pool.
    watcher.signal_term();
    assert_eq!(watcher.wait(), Some(0));
    api.create(&PostParams::default(), &allocation("leaky", "small", 2))
        .await
        .unwrap();
    let synced = cluster.run(&["sync", "leaky", "-n", "apps"]);
    assert!(synced.ok(), "{synced}");
    api.delete("leaky", &DeleteParams::default()).await.unwrap();
    let watcher = WatcherProcess::start_as_pod(&kubeconfig, SYSTEM, "events-b", &args, dir.path());
    until("a Repaired Event", Duration::from_secs(40), || async {
        !events(&client, "default", "small", "Repaired")
            .await
            .is_empty()
    })
    .await;
    let repaired = events(&client, "default", "small", "Repaired").await;
    let note = repaired[0].note.clone().unwrap_or_default();
    assert!(
        note.starts_with("repair freed 2 ports") && note.contains("apps/leaky"),
        "{note}"
    );

    // What `kubectl describe` shows.
    let describe = std::process::Command::new("kubectl")
        .args(["describe", "portallocation", "too-big", "-n", "apps"])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .output();
    if let Ok(output) = describe {
        let text = String::from_utf8_lossy(&output.stdout);
        let excerpt = text.find("Events:").map_or("", |at| &text[at..]);
        eprintln!("events: kubectl describe palloc too-big -n apps:\n{excerpt}");
        assert!(excerpt.contains("Refused"), "{text}");
    }
    watcher.signal_term();
    assert_eq!(watcher.wait(), Some(0));

    // No right to write Events: the watcher allocates all the same, and says so at debug
    // level only (-v 2), never as a warning.
    watcher_role_without_events(&client, "no-events").await;
    let quiet = dir.path().join("no-events.kubeconfig");
    let admin = cluster.kubeconfig.clone();
    service_account_kubeconfig(&client, &admin, SYSTEM, "no-events", &quiet).await;
    let mute = WatcherProcess::start_as_pod(&quiet, SYSTEM, "mute", &["-A", "-v", "2"], dir.path());
    api.create(&PostParams::default(), &allocation("unheard", "small", 1))
        .await
        .unwrap();
    until("unheard Ready", Duration::from_secs(30), || {
        is_ready(&api, "unheard")
    })
    .await;
    until("the debug line", Duration::from_secs(10), || async {
        mute.log()
            .contains("no Event Allocated on PortAllocation apps/unheard")
    })
    .await;
    let log = mute.log();
    for line in log.lines().filter(|l| l.contains("Event")) {
        assert!(line.starts_with("DEBUG"), "{line}");
    }
    assert!(
        events(&client, "apps", "unheard", "Allocated")
            .await
            .is_empty()
    );
    mute.signal_term();
    assert_eq!(mute.wait(), Some(0), "{log}");
}

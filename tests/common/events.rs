//! The Kubernetes Events (events.k8s.io/v1) the watcher writes, as a test reads them back.

use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::Api;

/// The Events in `namespace` regarding an object named `name` (of any kind).
pub async fn events_about(client: &Client, namespace: &str, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

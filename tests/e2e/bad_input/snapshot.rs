//! What "changes nothing" is checked against: the identity and version of every object a case
//! could touch.

use std::collections::BTreeMap;

use kube::api::Api;
use kube::{Client, ResourceExt};
use portalloc::api::{PortAllocation, PortPool, PortPoolShard};

/// `<kind>/<namespace>/<name>` -> (uid, resourceVersion).
pub type Snapshot = BTreeMap<String, (String, String)>;

/// Every pool and shard named with `prefix`, and every PortAllocation in `ns` or in such a pool.
pub async fn snapshot(client: &Client, prefix: &str, ns: &str) -> Snapshot {
    let mut objects = BTreeMap::new();
    for pool in Api::<PortPool>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.name_any().starts_with(prefix))
    {
        objects.insert(
            format!("portpool/{}", pool.name_any()),
            (pool.uid().unwrap(), pool.resource_version().unwrap()),
        );
    }
    for shard in Api::<PortPoolShard>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.pool.starts_with(prefix))
    {
        objects.insert(
            format!("portpoolshard/{}", shard.name_any()),
            (shard.uid().unwrap(), shard.resource_version().unwrap()),
        );
    }
    for pa in Api::<PortAllocation>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|pa| pa.namespace().as_deref() == Some(ns) || pa.spec.pool.starts_with(prefix))
    {
        objects.insert(
            format!(
                "portallocation/{}/{}",
                pa.namespace().unwrap(),
                pa.name_any()
            ),
            (pa.uid().unwrap(), pa.resource_version().unwrap()),
        );
    }
    objects
}

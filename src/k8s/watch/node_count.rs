//! The nodes each pool that follows them counts (`spec.followNodes`), kept on its status
//! (`status.nodes`, `status.nodesCountedAt`) by the watcher of every namespace, while it leads.
//!
//! Nodes are watched as metadata only (names and labels; no status, which changes every few
//! seconds on every node). After any change of a node, and every [`RECOUNT`] for pools created
//! or edited meanwhile, the pools are listed and each follow-nodes pool whose count differs is
//! written: a compare-and-swap on the pool as listed (status subresource), so a pool changed
//! meanwhile (its spec, the usage count) is counted again at the next turn.

use crate::k8s::error::error_chain;
use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};

use crate::api::{PortPool, PortPoolStatus};
use crate::k8s::error::KubeError;
use crate::k8s::nodes::{counts, node_selector};
use crate::k8s::resources::POOL_STATUS;

/// How long changes of nodes are gathered before a count (a node pool scaling up by fifty
/// makes one count, not fifty).
const SETTLE: Duration = Duration::from_secs(1);
/// How often the pools are counted again without a change of nodes: a pool created or set to
/// follow the nodes meanwhile gets its first count within this.
pub const RECOUNT: Duration = Duration::from_secs(10);

/// Keep every follow-nodes pool's node count until `stop`.
pub async fn keep_node_counts(client: Client, mut stop: tokio::sync::watch::Receiver<bool>) {
    // Metadata-only requests (an `Api` of `PartialObjectMeta`).
    let api: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
    let (reader, writer) = reflector::store::<PartialObjectMeta<Node>>();
    let mut nodes = Box::pin(reflector::reflector(
        writer,
        watcher::watcher(api, watcher::Config::default()).default_backoff(),
    ));
    let mut ticker = tokio::time::interval(SETTLE);
    let mut listed = false;
    let mut changed = true;
    let mut last_count = tokio::time::Instant::now();
    let mut warned = false;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            event = nodes.next() => match event {
                None => return,
                Some(Ok(Event::InitDone)) => {
                    listed = true;
                    changed = true;
                }
                Some(Ok(Event::Apply(_) | Event::Delete(_))) => changed = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    if !warned {
                        tracing::warn!(
                            "watching nodes for the pools that follow them: {} (the watcher's \
                             identity needs get, list and watch on nodes; until then an \
                             allocation counts them itself where it may)",
                            error_chain(&e)
                        );
                        warned = true;
                    }
                }
            },
            _ = ticker.tick() => {
                let due = changed || last_count.elapsed() >= RECOUNT;
                if listed && due {
                    changed = !count_once(&client, &reader).await;
                    last_count = tokio::time::Instant::now();
                }
            }
        }
    }
}

/// One count of every pool against the nodes in `store`; `false` when a write must be tried
/// again (a conflict, or the pools could not be listed).
async fn count_once(client: &Client, store: &Store<PartialObjectMeta<Node>>) -> bool {
    let api: Api<PortPool> = Api::all(client.clone());
    let pools = match api.list(&Default::default()).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::debug!(
                "counting nodes for the pools: listing pools: {}",
                error_chain(&e)
            );
            return false;
        }
    };
    let labels: Vec<BTreeMap<String, String>> = store
        .state()
        .iter()
        .map(|node| node.labels().clone())
        .collect();
    let now = Timestamp::now();
    let mut done = true;
    for pool in pools {
        let count = match &pool.spec.follow_nodes {
            None => None,
            Some(follow) => match node_selector(follow) {
                Ok(selector) => Some(labels.iter().filter(|l| counts(&selector, l)).count()),
                Err(error) => {
                    tracing::warn!("PortPool {}: {error}", pool.name_any());
                    continue;
                }
            },
        };
        let count = count.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        let Some(status) = node_status_to_write(&pool, count, now) else {
            continue;
        };
        let name = pool.name_any();
        let mut written = PortPool::new(&name, pool.spec.clone());
        written.metadata.resource_version = pool.resource_version();
        written.status = Some(status);
        match api
            .replace_status(&name, &crate::k8s::client::write_params(), &written)
            .await
        {
            Ok(_) => match count {
                Some(nodes) => tracing::info!(pool = %name, nodes, "counted the pool's nodes"),
                None => tracing::info!(pool = %name, "the pool no longer follows nodes"),
            },
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                tracing::debug!("PortPool {name} changed since it was listed: counted again");
                done = false;
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => {
                let error = KubeError::from_kube(e, POOL_STATUS.on("update", &name, None));
                tracing::warn!("keeping the node count of PortPool {name}: {error}");
                done = false;
            }
        }
    }
    done
}

/// The status to write for `pool` when `nodes` match its selector now (`None`: it does not
/// follow the nodes), or `None` when its status already says so. A pool that stopped
/// following the nodes loses its count.
pub fn node_status_to_write(
    pool: &PortPool,
    nodes: Option<u32>,
    now: Timestamp,
) -> Option<PortPoolStatus> {
    let current = pool.status.clone().unwrap_or_default();
    let nodes = nodes.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
    if current.nodes == nodes {
        return None;
    }
    Some(PortPoolStatus {
        nodes,
        nodes_counted_at: nodes.map(|_| Time(now)),
        ..current
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::FollowNodes;
    use crate::ledger::fixtures::pool_of;

    #[test]
    fn a_count_is_written_when_it_changes_and_only_for_pools_that_follow_the_nodes() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut pool = pool_of(&["30000-30099"], &[]);
        assert_eq!(node_status_to_write(&pool, None, now), None, "no reuse");

        pool.spec.follow_nodes = Some(FollowNodes::default());
        pool.status = Some(PortPoolStatus {
            size: 100,
            ..Default::default()
        });
        let first = node_status_to_write(&pool, Some(12), now).expect("a first count");
        assert_eq!(first.nodes, Some(12));
        assert_eq!(first.nodes_counted_at, Some(Time(now)));
        assert_eq!(first.size, 100, "the rest of the status is kept");

        pool.status = Some(first);
        assert_eq!(node_status_to_write(&pool, Some(12), now), None);
        let grown = node_status_to_write(&pool, Some(14), now).expect("two more nodes");
        assert_eq!(grown.nodes, Some(14));

        // No longer following: the count goes.
        pool.spec.follow_nodes = None;
        let cleared = node_status_to_write(&pool, None, now).expect("cleared");
        assert_eq!((cleared.nodes, cleared.nodes_counted_at), (None, None));
    }
}

//! The Nodes a pool that follows them counts (`spec.followNodes`): those its node selector
//! matches, every node without one. Read as metadata only (names and labels are all a count
//! needs). The watcher keeps the count on the pool's status ([`super::watch::node_count`]);
//! where none does, an allocation counts them itself here, once per read of the pool.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::{Selector, SelectorExt};

use super::error::{ApiErrorKind, KubeError};
use super::pages::PAGE;
use super::resources::NODES;
use crate::api::FollowNodes;
use crate::ledger::{NodeCount, PoolSnapshot};

/// The selector of `follow` (every node when it has none), or why it is unusable.
pub fn node_selector(follow: &FollowNodes) -> Result<Selector, String> {
    match &follow.node_selector {
        None => Ok(Selector::default()),
        Some(selector) => Selector::try_from(selector.clone())
            .map_err(|e| format!("spec.followNodes.nodeSelector is not a valid selector: {e}")),
    }
}

/// `kind=gpu,zone in (a,b)`, or `every node`.
pub fn selector_text(follow: &FollowNodes) -> String {
    match node_selector(follow) {
        Ok(selector) if selector.selects_all() => "every node".to_string(),
        Ok(selector) => selector.to_string(),
        Err(error) => error,
    }
}

/// Whether a node with `labels` counts for `selector`.
pub fn counts(selector: &Selector, labels: &BTreeMap<String, String>) -> bool {
    selector.matches(labels)
}

/// How many Nodes `follow` matches: one list of their metadata, in pages, selected by the
/// server.
pub async fn count_nodes(client: &Client, follow: &FollowNodes) -> Result<u32, KubeError> {
    let selector = node_selector(follow).map_err(KubeError::config)?;
    let api: Api<Node> = Api::all(client.clone());
    let mut params = ListParams::default().limit(PAGE);
    if !selector.selects_all() {
        params = params.labels_from(&selector);
    }
    let mut count: u32 = 0;
    loop {
        let page = api
            .list_metadata(&params)
            .await
            .map_err(|e| KubeError::from_kube(e, NODES.all("list", None)))?;
        count = count.saturating_add(u32::try_from(page.items.len()).unwrap_or(u32::MAX));
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(count),
        }
    }
}

/// For a pool that follows the nodes but whose status has no count (no watcher keeps it):
/// count them now, or say why that could not be done (copy 0 only, then). Nothing is written:
/// the count serves this decision alone.
pub async fn count_if_unknown(client: &Client, snapshot: &mut PoolSnapshot) {
    let Some(follow) = &snapshot.spec.follow_nodes else {
        return;
    };
    if snapshot.nodes.is_some() {
        return;
    }
    snapshot.nodes = Some(match count_nodes(client, follow).await {
        Ok(nodes) => {
            tracing::info!(
                pool = %snapshot.name,
                nodes,
                "no watcher has counted the pool's nodes (status.nodes is empty): counted them here"
            );
            NodeCount::Counted(nodes)
        }
        Err(error) => {
            let why = match error.kind() {
                ApiErrorKind::Forbidden => {
                    "status.nodes is empty (no watcher counts them) and this \
                     identity may not list nodes (Forbidden: list nodes)"
                        .to_string()
                }
                _ => format!("status.nodes is empty and counting them failed: {error}"),
            };
            // Said where it matters, in the refusal of a copy past 0; a watcher without the
            // right would otherwise repeat it at every count of the pools.
            tracing::debug!(pool = %snapshot.name, "{why}");
            NodeCount::Unknown(why)
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_selector_counts_the_nodes_it_matches_and_none_counts_all() {
        let all = FollowNodes::default();
        assert_eq!(selector_text(&all), "every node");
        assert!(counts(&node_selector(&all).unwrap(), &labels(&[])));

        let gpu = FollowNodes {
            node_selector: Some(LabelSelector {
                match_labels: Some(labels(&[("pool", "gpu")])),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "zone".into(),
                    operator: "In".into(),
                    values: Some(vec!["a".into(), "b".into()]),
                }]),
            }),
        };
        let selector = node_selector(&gpu).unwrap();
        assert_eq!(selector_text(&gpu), "pool=gpu,zone in (a,b)");
        assert!(counts(
            &selector,
            &labels(&[("pool", "gpu"), ("zone", "b")])
        ));
        assert!(!counts(
            &selector,
            &labels(&[("pool", "gpu"), ("zone", "c")])
        ));
        assert!(!counts(&selector, &labels(&[("zone", "a")])));

        let bad = FollowNodes {
            node_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "zone".into(),
                    operator: "Near".into(),
                    values: None,
                }]),
            }),
        };
        assert!(node_selector(&bad).unwrap_err().contains("nodeSelector"));
    }
}

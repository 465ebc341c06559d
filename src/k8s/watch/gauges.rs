//! The watcher's gauges, refreshed every [`metrics::REFRESH`] while it leads: PortAllocations
//! by phase, and every pool counted from its shards (for `/metrics` and its status' usage).

use kube::Client;
use kube::runtime::reflector::Store;

use super::{access, metrics, pool_usage};
use crate::api::PortAllocation;
use crate::k8s::watch::metrics::Metrics;

/// Keep the gauges current: PortAllocations by phase from the controller's cache and, with
/// `pool_metrics` or for a `cluster_wide` watcher that may write pools' status, every pool
/// counted from its shards, for its gauges and its status' usage summary.
pub(super) async fn refresh_gauges(
    client: Client,
    store: Store<PortAllocation>,
    metrics: Metrics,
    (pool_metrics, cluster_wide): (bool, bool),
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let keep_usage = cluster_wide && access::may_keep_usage(&client).await;
    let mut ticker = tokio::time::interval(metrics::REFRESH);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticker.tick() => {
                metrics.set_allocations(store.state().iter().map(|pa| pa.as_ref()));
                if !pool_metrics && !keep_usage {
                    continue;
                }
                match pool_usage::count_pools(&client).await {
                    Ok(count) => {
                        metrics.set_pools(&count);
                        if keep_usage {
                            pool_usage::keep_usage(&client, &count).await;
                        }
                    }
                    Err(e) => {
                        tracing::debug!("counting pools: listing them: {e}");
                        metrics.record_pool_list_error();
                    }
                }
            }
        }
    }
}

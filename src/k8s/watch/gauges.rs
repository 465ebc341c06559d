//! The watcher's gauges, refreshed every [`metrics::REFRESH`] (longer for
//! pools so large that counting them takes over a second) while it leads: PortAllocations
//! by phase, and every pool counted from its shards (for `/metrics` and its status' usage).

use crate::k8s::error::error_chain;
use kube::Client;
use kube::runtime::reflector::Store;

use super::{access, pool_usage};
use crate::api::PortAllocation;
use crate::k8s::process::metrics::{self, Metrics};

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
    let mut wait = std::time::Duration::ZERO;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let started = std::time::Instant::now();
        metrics.set_allocations(store.state().iter().map(|pa| pa.as_ref()));
        if pool_metrics || keep_usage {
            match pool_usage::count_pools(&client).await {
                Ok(count) => {
                    metrics.set_pools(&count);
                    if keep_usage {
                        pool_usage::keep_usage(&client, &count).await;
                    }
                }
                Err(e) => {
                    tracing::debug!("counting pools: listing them: {}", error_chain(&e));
                    metrics.record_pool_list_error();
                }
            }
        }
        wait = next_refresh(started.elapsed());
    }
}

/// A count takes a LIST of every shard and a decoding of every holding: ~2 s for a pool of
/// 750,000 holdings, beside the watcher's syncs and the webhook's answers on the same cores and
/// API server. So the next count waits [`metrics::REFRESH`], or [`WAITS_PER_COUNT`] times as
/// long as this one took when that is longer: counting keeps to a tenth of the time.
fn next_refresh(took: std::time::Duration) -> std::time::Duration {
    metrics::REFRESH.max(took * WAITS_PER_COUNT)
}

/// See [`next_refresh`].
const WAITS_PER_COUNT: u32 = 9;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{metrics, next_refresh};

    #[test]
    fn a_quick_count_comes_round_every_refresh_a_slow_one_at_a_tenth_of_the_time() {
        assert_eq!(next_refresh(Duration::from_millis(40)), metrics::REFRESH);
        assert_eq!(
            next_refresh(Duration::from_secs(2)),
            Duration::from_secs(18)
        );
    }
}

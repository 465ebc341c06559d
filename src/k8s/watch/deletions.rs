//! The watcher's deletion watch: a deleted PortAllocation's entries freed at once, and the
//! repair pass after every (re)list and every resync, for deletions a gap in the watch hid.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher::Event;

use crate::api::PortAllocation;
use crate::k8s::allocate::Allocator;
use crate::k8s::error::error_chain;
use crate::k8s::events::Events;
use crate::k8s::process::Metrics;
use crate::k8s::repair::Repairer;
use crate::ledger::{RepairPlan, owner_of};

/// Free the entries of deleted PortAllocations; with a repairer, also repair after every
/// (re)list, since deletions during a gap in the watch are not reported, and every `resync`.
pub(super) async fn free_deleted(
    api: Api<PortAllocation>,
    allocator: Allocator,
    (repairer, events): (Option<Repairer>, Events),
    resync: Duration,
    metrics: Metrics,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut deletions = super::watcher(api).boxed();
    let mut ticker = tokio::time::interval(resync);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticker.tick() => repair(repairer.as_ref(), &events).await,
            event = deletions.try_next() => match event {
                Ok(Some(Event::Delete(pa))) => free(&allocator, &pa, &events).await,
                Ok(Some(Event::InitDone)) => repair(repairer.as_ref(), &events).await,
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(e) => {
                    metrics.record_watch_restart("deletions");
                    tracing::warn!("watching deletions: {}", error_chain(&e));
                }
            },
        }
    }
}

async fn free(allocator: &Allocator, pa: &PortAllocation, events: &Events) {
    let owner = owner_of(pa);
    let uid = pa.uid().unwrap_or_default();
    match allocator
        .release_holder(&pa.spec.pool, &uid, &owner, pa.status.as_ref())
        .await
    {
        Ok(freed) => {
            tracing::info!(allocation = %owner, pool = %pa.spec.pool, freed, "deleted: ports freed");
            events.deleted(pa, freed).await;
        }
        Err(e) => tracing::warn!(
            allocation = %owner,
            "deleted, but its ports could not be freed yet (the next repair pass frees them): {}",
            error_chain(&e)
        ),
    }
}

async fn repair(repairer: Option<&Repairer>, events: &Events) {
    let Some(repairer) = repairer else {
        return;
    };
    let mut written: Vec<RepairPlan> = Vec::new();
    let outcome = repairer
        .repair(None, true, |repair| {
            if repair.applied {
                tracing::info!(
                    pool = %repair.plan.pool,
                    changes = repair.plan.changes.len(),
                    "repaired: {}",
                    repair
                        .plan
                        .changes
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                );
                written.push(repair.plan);
            }
        })
        .await;
    for plan in &written {
        events.repaired(plan).await;
    }
    if let Err(e) = outcome {
        tracing::warn!(
            "repair pass failed (tried again at the next resync): {}",
            error_chain(&e)
        );
    }
}

//! Kubernetes Events on what the watcher does (`kubectl describe palloc`, `kubectl events`),
//! published through kube-runtime's recorder (events.k8s.io/v1): the words are
//! [`crate::ledger::event_notice`]'s, and so is why a notice repeated at every resync stays one
//! Event whose series count grows (the recorder patches it rather than creating another).
//!
//! Best effort: an Event that cannot be written never fails what it reports. An identity that
//! may not write Events (a user running the plugin, a watcher bound to an older ClusterRole) is
//! said at debug level only; any other failure at info level, naming the object.

use crate::k8s::error::error_chain;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};

use crate::api::{PortAllocation, PortPool};
use crate::k8s::allocate::SyncReport;
use crate::ledger::event_notice::{self, EntryOwner, Notice};
use crate::ledger::{Refusal, RepairPlan, owner_of};

/// The `reportingController` of the watcher's Events (the `From` column).
pub const REPORTING_CONTROLLER: &str = "portalloc-watcher";

/// How long a pool's UID is remembered for its Events (`kubectl describe` finds an object's
/// Events by UID). A pool deleted and created again meanwhile gets a few Events it does not show.
const POOL_UID_TTL: Duration = Duration::from_secs(300);

/// Publishes the watcher's Events; clones share the recorder and so its series.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    client: Client,
    /// Pools get Events too (they are cluster-scoped: theirs go to namespace `default`).
    on_pools: bool,
    pool_uids: Arc<Mutex<HashMap<String, (String, Instant)>>>,
}

impl Events {
    /// Events reported by `instance` (this replica's name). `on_pools`: for a watcher of every
    /// namespace; one confined to a namespace says nothing on pools.
    pub fn new(client: Client, instance: &str, on_pools: bool) -> Self {
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(instance.to_string()),
        };
        Events {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            on_pools,
            pool_uids: Arc::default(),
        }
    }

    /// A sync that took or gave back ports (nothing when it changed none).
    pub async fn synced(&self, pa: &PortAllocation, report: &SyncReport) {
        let held = report.holdings.port_count() as usize;
        let desired = pa.spec.desired_port_count();
        let generation = report.allocation.metadata.generation;
        let regarding = allocation_ref(pa);
        if report.allocated > 0 {
            let notice =
                event_notice::allocated(&report.pool, generation, report.allocated, held, desired);
            self.publish(&notice, &regarding, None).await;
        }
        if report.released > 0 {
            let notice =
                event_notice::released(&report.pool, generation, report.released, held, desired);
            self.publish(&notice, &regarding, None).await;
        }
    }

    /// A lasting refusal, on the PortAllocation and, when it is the pool's story, on the pool.
    pub async fn refused(&self, pa: &PortAllocation, refusal: &Refusal) {
        let regarding = allocation_ref(pa);
        let notice = event_notice::refused(pa.metadata.generation, refusal);
        self.publish(&notice, &regarding, None).await;
        let Some((pool, notice)) = event_notice::pool_refused(&owner_of(pa), refusal) else {
            return;
        };
        if let Some(pool) = self.pool_ref(&pool).await {
            self.publish(&notice, &pool, Some(regarding)).await;
        }
    }

    /// A deleted PortAllocation's entry freed.
    pub async fn deleted(&self, pa: &PortAllocation, freed: usize) {
        if freed == 0 {
            return;
        }
        let notice = event_notice::freed_after_deletion(&pa.spec.pool, freed);
        self.publish(&notice, &allocation_ref(pa), None).await;
    }

    /// A repair written to a pool: on the pool, and on each live PortAllocation it changed.
    pub async fn repaired(&self, plan: &RepairPlan) {
        if self.on_pools {
            let pool = pool_ref(&plan.pool, &plan.pool_uid);
            self.publish(&event_notice::pool_repaired(plan), &pool, None)
                .await;
        }
        for (owner, notice) in event_notice::allocations_repaired(plan) {
            self.publish(&notice, &entry_ref(&owner), None).await;
        }
    }

    async fn publish(
        &self,
        notice: &Notice,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
    ) {
        let event = Event {
            type_: if notice.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: notice.reason.into(),
            note: Some(notice.note.clone()),
            action: notice.action.clone(),
            secondary: related,
        };
        let object = || {
            let kind = regarding.kind.as_deref().unwrap_or_default();
            match (&regarding.namespace, &regarding.name) {
                (Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
                (None, Some(name)) => format!("{kind} {name}"),
                _ => kind.to_string(),
            }
        };
        match self.recorder.publish(&event, regarding).await {
            Ok(()) => {}
            Err(kube::Error::Api(status)) if status.is_forbidden() => tracing::debug!(
                "no Event {} on {}: this identity may not create events.k8s.io Events there \
                 (the chart's ClusterRole portalloc-watcher grants it): {}",
                notice.reason,
                object(),
                status.message
            ),
            Err(e) => tracing::info!(
                "could not record Event {} on {} (its status and this log say the same): {}",
                notice.reason,
                object(),
                error_chain(&e)
            ),
        }
    }

    /// The pool's reference, with its UID (read once per [`POOL_UID_TTL`]); `None` when pools
    /// get no Events, or it cannot be read.
    async fn pool_ref(&self, pool: &str) -> Option<ObjectReference> {
        if !self.on_pools {
            return None;
        }
        let known = {
            let uids = self.pool_uids.lock().unwrap_or_else(|p| p.into_inner());
            uids.get(pool)
                .filter(|(_, at)| at.elapsed() < POOL_UID_TTL)
                .map(|(uid, _)| uid.clone())
        };
        let uid = match known {
            Some(uid) => uid,
            None => {
                let read = Api::<PortPool>::all(self.client.clone())
                    .get_opt(pool)
                    .await;
                let uid = match read {
                    Ok(Some(object)) => object.uid()?,
                    Ok(None) => return None,
                    Err(e) => {
                        tracing::debug!(
                            "no Event on PortPool {pool}: reading its UID: {}",
                            error_chain(&e)
                        );
                        return None;
                    }
                };
                let mut uids = self.pool_uids.lock().unwrap_or_else(|p| p.into_inner());
                uids.insert(pool.to_string(), (uid.clone(), Instant::now()));
                uid
            }
        };
        Some(pool_ref(pool, &uid))
    }
}

/// A reference without a resourceVersion: the recorder keys a series on the whole reference,
/// and a version would make every resync a new series.
fn allocation_ref(pa: &PortAllocation) -> ObjectReference {
    entry_ref(&EntryOwner {
        namespace: pa.namespace().unwrap_or_default(),
        name: pa.name_any(),
        uid: pa.uid().unwrap_or_default(),
    })
}

fn entry_ref(owner: &EntryOwner) -> ObjectReference {
    ObjectReference {
        api_version: Some(PortAllocation::api_version(&()).into_owned()),
        kind: Some(PortAllocation::kind(&()).into_owned()),
        namespace: Some(owner.namespace.clone()),
        name: Some(owner.name.clone()),
        uid: Some(owner.uid.clone()),
        ..ObjectReference::default()
    }
}

fn pool_ref(name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(PortPool::api_version(&()).into_owned()),
        kind: Some(PortPool::kind(&()).into_owned()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_the_object_by_uid_without_a_version() {
        let reference = pool_ref("gpu", "u-1");
        assert_eq!(
            reference.api_version.as_deref(),
            Some("portalloc.dev/v1alpha1")
        );
        assert_eq!(reference.kind.as_deref(), Some("PortPool"));
        assert_eq!(reference.namespace, None);
        assert_eq!(reference.uid.as_deref(), Some("u-1"));
        let owner = EntryOwner {
            namespace: "apps".into(),
            name: "web".into(),
            uid: "u-2".into(),
        };
        let reference = entry_ref(&owner);
        assert_eq!(reference.kind.as_deref(), Some("PortAllocation"));
        assert_eq!(reference.namespace.as_deref(), Some("apps"));
        assert_eq!(reference.resource_version, None);
    }
}

//! Kubernetes Events on what the watcher does (`kubectl describe palloc`, `kubectl events`),
//! events.k8s.io/v1: the words are [`crate::ledger::event_notice`]'s.
//!
//! Warnings (refusals) repeat at every resync: they go through kube-runtime's recorder, which
//! keeps each one for six minutes and patches its series count rather than creating another.
//! Everything else (ports allocated or released, entries freed, repairs) happens once per
//! change, so it is created as it is and remembered nowhere: the recorder's cache, swept in
//! full at every publish, held 11.8 MB of 110 MB at the heap's peak for 4,500 PortAllocations
//! synced from empty, and would grow with every one of 15,000.
//!
//! Best effort: an Event that cannot be written never fails what it reports. An identity that
//! may not write Events (a user running the plugin, a watcher bound to an older ClusterRole) is
//! said at debug level only; any other failure at info level, naming the object.

use crate::k8s::error::error_chain;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as EventObject;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
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
    reporter: Reporter,
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
            recorder: Recorder::new(client.clone(), reporter.clone()),
            reporter,
            client,
            on_pools,
            pool_uids: Arc::default(),
        }
    }

    /// A sync that took or gave back ports (see [`SyncNotices`]).
    pub async fn synced(&self, said: SyncNotices) {
        for notice in &said.notices {
            self.publish(notice, &said.regarding, None).await;
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
        let published = if notice.warning {
            self.recorder.publish(&event, regarding).await
        } else {
            let namespace = regarding.namespace.as_deref().unwrap_or("default");
            let once = once_event(&event, regarding, &self.reporter, Timestamp::now());
            Api::<EventObject>::namespaced(self.client.clone(), namespace)
                .create(&PostParams::default(), &once)
                .await
                .map(drop)
        };
        match published {
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

/// What a sync that took or gave back ports says on its PortAllocation: worked out when the sync
/// ends, so an Event waiting its turn to be sent holds these words, not the object and its
/// holdings.
pub struct SyncNotices {
    regarding: ObjectReference,
    notices: Vec<Notice>,
}

impl SyncNotices {
    /// `None` when the sync changed no port.
    pub fn of(pa: &PortAllocation, report: &SyncReport) -> Option<SyncNotices> {
        let held = report.holdings.port_count() as usize;
        let desired = pa.spec.desired_port_count();
        let generation = report.allocation.metadata.generation;
        let pool = &report.pool;
        let mut notices = Vec::new();
        if report.allocated > 0 {
            let allocated = report.allocated;
            notices.push(event_notice::allocated(
                pool, generation, allocated, held, desired,
            ));
        }
        if report.released > 0 {
            let released = report.released;
            notices.push(event_notice::released(
                pool, generation, released, held, desired,
            ));
        }
        (!notices.is_empty()).then(|| SyncNotices {
            regarding: allocation_ref(pa),
            notices,
        })
    }
}

/// An Event created once: named and stamped as kube-runtime's recorder names a new one
/// (`<object>.<nanoseconds in hex>`), with no series.
fn once_event(
    event: &Event,
    regarding: &ObjectReference,
    reporter: &Reporter,
    now: Timestamp,
) -> EventObject {
    let object = regarding.name.as_deref().unwrap_or(&reporter.controller);
    EventObject {
        metadata: ObjectMeta {
            name: Some(format!("{object}.{:x}", now.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        ..EventObject::default()
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

    #[test]
    fn an_event_said_once_is_named_and_stamped_as_the_recorder_names_a_new_one() {
        let event = Event {
            type_: EventType::Normal,
            reason: "Allocated".into(),
            note: Some("50 ports allocated".into()),
            action: "Allocate".into(),
            secondary: None,
        };
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some("watcher-0".into()),
        };
        let regarding = allocation_ref(&{
            let mut pa = PortAllocation::new("web", Default::default());
            pa.metadata.namespace = Some("apps".into());
            pa.metadata.uid = Some("u-3".into());
            pa
        });
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let once = once_event(&event, &regarding, &reporter, now);
        assert_eq!(
            once.metadata.name.as_deref(),
            Some(format!("web.{:x}", now.as_nanosecond()).as_str())
        );
        assert_eq!(once.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(once.type_.as_deref(), Some("Normal"));
        assert_eq!(once.reason.as_deref(), Some("Allocated"));
        assert_eq!(once.action.as_deref(), Some("Allocate"));
        assert_eq!(once.note.as_deref(), Some("50 ports allocated"));
        assert_eq!(
            once.reporting_controller.as_deref(),
            Some("portalloc-watcher")
        );
        assert_eq!(once.reporting_instance.as_deref(), Some("watcher-0"));
        assert_eq!(once.regarding.and_then(|r| r.uid).as_deref(), Some("u-3"));
        assert_eq!(once.event_time, Some(MicroTime(now)));
        assert!(once.series.is_none());
    }
}

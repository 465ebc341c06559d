//! What the watcher says on the objects it acts on, as Kubernetes Events (`kubectl describe`,
//! `kubectl events`): a PortAllocation's ports allocated or released, a sync refused (with the
//! reason its status carries), its entry repaired; a pool repaired, or full for someone. The
//! words only; `k8s/events.rs` publishes them through kube-runtime's recorder.
//!
//! The recorder makes one Event series of the notices that share a type, an action, a reason
//! and an object (and a related object), whatever their notes, within its cache window of
//! 6 minutes: a PortAllocation refused at every resync is one Event whose series count grows.
//! The note is the series' first. So the action carries what would make a note stale: the
//! generation a sync served (a new spec is a new series), and for a refusal its reason too (a
//! pool full that then disappears is two series).

use crate::ledger::refusal::{Reason, Refusal};
use crate::ledger::repair::repair_outcome::{Change, FreeReason, RepairPlan};

/// The most an Event's note may hold (events.k8s.io/v1: 1 kB).
pub const NOTE_LIMIT: usize = 1024;

/// One Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub warning: bool,
    /// `kubectl describe`'s Reason column.
    pub reason: &'static str,
    /// What was done (shown by `kubectl get events.events.k8s.io -o yaml`); also what keeps
    /// series apart.
    pub action: String,
    /// The Message column, at most [`NOTE_LIMIT`] bytes.
    pub note: String,
}

impl Notice {
    fn new(warning: bool, reason: &'static str, action: String, note: String) -> Notice {
        Notice {
            warning,
            reason,
            action,
            note: bounded(note),
        }
    }
}

/// A PortAllocation an Event is about, by its pool entry's name (`namespace/name`) and UID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryOwner {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

fn ports(n: usize) -> String {
    if n == 1 {
        "1 port".into()
    } else {
        format!("{n} ports")
    }
}

fn served(generation: Option<i64>) -> String {
    generation.map_or(String::new(), |g| format!("@{g}"))
}

/// A sync took `count` ports for generation `generation`; it now holds `held` of `desired`.
pub fn allocated(
    pool: &str,
    generation: Option<i64>,
    count: usize,
    held: usize,
    desired: usize,
) -> Notice {
    Notice::new(
        false,
        "Allocated",
        format!("Allocate{}", served(generation)),
        format!(
            "allocated {} from PortPool {pool}; it holds {held} of the {desired} its spec asks for",
            ports(count)
        ),
    )
}

/// A sync gave `count` ports back (the spec asks for fewer, or a role went away).
pub fn released(
    pool: &str,
    generation: Option<i64>,
    count: usize,
    held: usize,
    desired: usize,
) -> Notice {
    Notice::new(
        false,
        "Released",
        format!("Release{}", served(generation)),
        format!(
            "released {} to PortPool {pool}; it holds {held} of the {desired} its spec asks for",
            ports(count)
        ),
    )
}

/// The PortAllocation was deleted and its entry freed.
pub fn freed_after_deletion(pool: &str, count: usize) -> Notice {
    Notice::new(
        false,
        "Released",
        "Delete".into(),
        format!(
            "deleted: its {} in PortPool {pool} are free for others",
            ports(count)
        ),
    )
}

/// A lasting refusal, with the reason and message its status' conditions carry.
pub fn refused(generation: Option<i64>, refusal: &Refusal) -> Notice {
    let reason = refusal.reason();
    Notice::new(
        true,
        "Refused",
        format!("{reason}{}", served(generation)),
        format!("{reason}: {refusal}"),
    )
}

/// The same refusal on the pool, where it is the pool's story: it is full, or its own spec is
/// unusable. One series per PortAllocation refused (it is the related object).
pub fn pool_refused(owner: &str, refusal: &Refusal) -> Option<(String, Notice)> {
    let (pool, reason) = match refusal {
        Refusal::Core { pool, .. } if refusal.reason() == Reason::PoolFull => {
            (pool, Reason::PoolFull)
        }
        Refusal::PoolSpec { pool, .. } => (pool, Reason::InvalidPool),
        _ => return None,
    };
    let notice = Notice::new(
        true,
        reason.as_str(),
        "Allocate".into(),
        format!("refused PortAllocation {owner}: {refusal}"),
    );
    Some((pool.clone(), notice))
}

/// What a repair pass wrote to a pool, in one note: how many entries it freed and restored,
/// then each change as `kubectl portalloc repair` prints it, as many as fit.
pub fn pool_repaired(plan: &RepairPlan) -> Notice {
    let (mut freed, mut restored, mut other) = (0, 0, 0);
    for change in &plan.changes {
        match change {
            Change::Free { count, .. } => freed += count,
            Change::Restore { count, .. } => restored += count,
            _ => other += 1,
        }
    }
    let mut summary = Vec::new();
    if freed > 0 {
        summary.push(format!("freed {}", ports(freed)));
    }
    if restored > 0 {
        summary.push(format!("restored {}", ports(restored)));
    }
    if other > 0 {
        summary.push(format!("{other} record changes"));
    }
    let lines: Vec<String> = plan
        .changes
        .iter()
        .map(|c| format!("{} {c}", c.verb()))
        .collect();
    Notice::new(
        false,
        "Repaired",
        "Repair".to_string(),
        format!(
            "repair {} (now {} held by {} holders): {}",
            summary.join(", "),
            plan.held_ports,
            plan.holders,
            lines.join("; ")
        ),
    )
}

/// The PortAllocations a repair changed that still exist: those whose lost holdings it put back
/// from their status, and those whose entry it freed because they allocate from another pool
/// now. (Entries of deleted ones are said on the pool only.)
pub fn allocations_repaired(plan: &RepairPlan) -> Vec<(EntryOwner, Notice)> {
    let pool = &plan.pool;
    // No version of its own: a repair spans shards, so one series per pool and object.
    let action = "Repair".to_string();
    plan.changes
        .iter()
        .filter_map(|change| {
            let (uid, owner, note) = match change {
                Change::Restore {
                    uid, owner, count, ..
                } => (
                    uid,
                    owner,
                    format!(
                        "repair restored its {} in PortPool {pool}: its status records them and \
                         the pool had lost them",
                        ports(*count)
                    ),
                ),
                Change::Free {
                    uid,
                    owner,
                    count,
                    reason: FreeReason::OtherPool { pool: now },
                    ..
                } => (
                    uid,
                    owner,
                    format!(
                        "repair freed its {} left in PortPool {pool}: it allocates from pool \
                         {now} now",
                        ports(*count)
                    ),
                ),
                _ => return None,
            };
            let (namespace, name) = owner.split_once('/')?;
            let entry = EntryOwner {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: uid.clone(),
            };
            Some((entry, Notice::new(false, "Repaired", action.clone(), note)))
        })
        .collect()
}

/// At most [`NOTE_LIMIT`] bytes, cut at a character boundary with an ellipsis.
fn bounded(mut note: String) -> String {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let ellipsis = "…";
    let mut end = NOTE_LIMIT - ellipsis.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push_str(ellipsis);
    note
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::AllocError;

    fn full() -> Refusal {
        Refusal::Core {
            owner: "apps/big".into(),
            pool: "gpu".into(),
            error: Box::new(AllocError::PoolFull {
                size: 10,
                used: 8,
                needed: 8,
                free: 2,
                runs: None,
            }),
            holders: String::new(),
        }
    }

    #[test]
    fn a_refusal_carries_the_status_reason_and_message() {
        let notice = refused(Some(3), &full());
        assert!(notice.warning);
        assert_eq!(notice.reason, "Refused");
        assert_eq!(notice.action, "PoolFull@3");
        assert_eq!(notice.note, format!("PoolFull: {}", full()));
        // Another reason for the same generation is another series.
        let missing = Refusal::PoolNotFound {
            pool: "gpu".into(),
            owner: "apps/big".into(),
        };
        assert_eq!(refused(Some(3), &missing).action, "PoolNotFound@3");
    }

    #[test]
    fn a_full_pool_is_the_pools_story_a_missing_one_is_not() {
        let (pool, notice) = pool_refused("apps/big", &full()).unwrap();
        assert_eq!(pool, "gpu");
        assert_eq!(notice.reason, "PoolFull");
        assert!(notice.warning);
        assert!(notice.note.starts_with("refused PortAllocation apps/big: "));
        let missing = Refusal::PoolNotFound {
            pool: "gpu".into(),
            owner: "apps/big".into(),
        };
        assert_eq!(pool_refused("apps/big", &missing), None);
    }

    #[test]
    fn allocations_and_releases_name_the_pool_and_the_generation() {
        let notice = allocated("gpu", Some(2), 4, 4, 4);
        assert!(!notice.warning);
        assert_eq!(notice.reason, "Allocated");
        assert_eq!(notice.action, "Allocate@2");
        assert_eq!(
            notice.note,
            "allocated 4 ports from PortPool gpu; it holds 4 of the 4 its spec asks for"
        );
        let notice = released("gpu", Some(3), 1, 3, 3);
        assert_eq!(notice.reason, "Released");
        assert_eq!(notice.action, "Release@3");
        assert!(notice.note.starts_with("released 1 port to PortPool gpu"));
        assert_eq!(
            freed_after_deletion("gpu", 2).note,
            "deleted: its 2 ports in PortPool gpu are free for others"
        );
    }

    fn plan(changes: Vec<Change>) -> RepairPlan {
        RepairPlan {
            pool: "gpu".into(),
            pool_uid: "pool-uid".into(),
            changes,
            findings: vec![],
            holders: 1,
            held_ports: 2,
            holders_after: Default::default(),
            status: None,
            restored: vec![],
        }
    }

    #[test]
    fn a_repair_is_said_on_the_pool_and_on_each_live_allocation_it_changed() {
        let plan = plan(vec![
            Change::Free {
                uid: "u1".into(),
                owner: "apps/gone".into(),
                ports: "web.http.0=30001".into(),
                count: 1,
                reason: FreeReason::OwnerGone,
            },
            Change::Free {
                uid: "u2".into(),
                owner: "apps/moved".into(),
                ports: "web.http.0=30002".into(),
                count: 1,
                reason: FreeReason::OtherPool { pool: "cpu".into() },
            },
            Change::Restore {
                uid: "u3".into(),
                owner: "apps/kept".into(),
                ports: "web.http.0=30003,web.http.1=30004".into(),
                count: 2,
            },
        ]);
        let notice = pool_repaired(&plan);
        assert_eq!(notice.reason, "Repaired");
        assert_eq!(notice.action, "Repair");
        assert!(
            notice.note.starts_with(
                "repair freed 2 ports, restored 2 ports (now 2 held by 1 holders): free apps/gone"
            ),
            "{}",
            notice.note
        );
        let each = allocations_repaired(&plan);
        let owners: Vec<_> = each.iter().map(|(o, _)| o.name.as_str()).collect();
        assert_eq!(owners, ["moved", "kept"]);
        assert_eq!(each[1].0.namespace, "apps");
        assert_eq!(each[1].0.uid, "u3");
        assert!(
            each[1]
                .1
                .note
                .contains("restored its 2 ports in PortPool gpu")
        );
        assert!(each[0].1.note.contains("it allocates from pool cpu now"));
    }

    #[test]
    fn a_long_note_is_cut_to_the_limit_at_a_character_boundary() {
        let note = bounded("é".repeat(NOTE_LIMIT));
        assert!(note.len() <= NOTE_LIMIT);
        assert!(note.ends_with('…'));
        assert_eq!(bounded("short".into()), "short");
    }
}

//! One worker among the watcher's replicas: leader election over a `coordination.k8s.io`
//! Lease, with client-go's semantics (`k8s.io/client-go/tools/leaderelection`), the decisions
//! only. The reads and writes (GET, then a create or a compare-and-swap on the resourceVersion
//! read) are `k8s/leader.rs`.
//!
//! - A candidate takes the Lease when there is none, when its holder released it (an empty
//!   `holderIdentity`), or when the record has not changed for `leaseDurationSeconds` **by the
//!   candidate's own clock**: the renew time written by another machine is never compared with
//!   this one's clock, so clock skew between nodes cannot hand the Lease out early.
//! - The holder renews every [`LeaseTiming::retry_period`]; when it cannot renew for
//!   [`LeaseTiming::renew_deadline`] it stops leading, which is before any other candidate may
//!   take the Lease (`renew_deadline` < `lease_duration`, and the others count from a change
//!   they saw no earlier than the holder's last renewal).
//! - A holder that stops (SIGTERM) writes the Lease released, so another replica takes it at its
//!   next try instead of waiting for it to expire.
//!
//! Safety does not rest on this: every write of the allocation is a compare-and-swap, so two
//! replicas that both believe they lead (for at most a renew deadline) cost each other
//! conflicts, never a port handed out twice.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

/// The watcher's Lease when it watches every namespace.
pub const WATCHER_LEASE: &str = "portalloc-watcher";

/// The Lease of the watchers of one scope: `portalloc-watcher` for those of every namespace,
/// `portalloc-watcher-<namespace>` for those confined to one, so that watchers of different
/// scopes (which do different work) never wait for each other. A namespace name is at most 63
/// characters, so this stays a valid object name.
pub fn lease_name(watched_namespace: Option<&str>) -> String {
    match watched_namespace {
        None => WATCHER_LEASE.to_string(),
        Some(namespace) => format!("{WATCHER_LEASE}-{namespace}"),
    }
}

/// How long a Lease lasts and how often it is tried: client-go's defaults, those of
/// kube-controller-manager and kube-scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    /// `leaseDurationSeconds`: how long the others wait after the record last changed.
    pub lease_duration: Duration,
    /// How long the holder keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often a candidate tries to take the Lease, and the holder renews it.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What to do after reading the Lease.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// There is no Lease: create this one (which makes us the holder).
    Create(LeaseSpec),
    /// Write this over the Lease read, a compare-and-swap on its resourceVersion: our renewal,
    /// or taking a Lease that expired or was released (`taken`).
    Write { spec: LeaseSpec, taken: bool },
    /// Another candidate holds a valid Lease: try again later.
    Wait {
        holder: String,
        /// How long it stays valid if its holder does not renew it (by our clock).
        valid_for: Duration,
    },
}

/// One candidate: who it is, and what it last saw of the Lease and when that changed.
#[derive(Clone, Debug)]
pub struct Candidate {
    identity: String,
    timing: LeaseTiming,
    /// The record as last seen, and when (on this process's clock) it last changed.
    seen: Option<(LeaseSpec, Instant)>,
}

impl Candidate {
    pub fn new(identity: impl Into<String>, timing: LeaseTiming) -> Self {
        Candidate {
            identity: identity.into(),
            timing,
            seen: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timing(&self) -> LeaseTiming {
        self.timing
    }

    /// Whether `spec` names this candidate as its holder.
    pub fn holds(&self, spec: &LeaseSpec) -> bool {
        holder(spec) == Some(self.identity.as_str())
    }

    /// Decide from the Lease as read `now` (`None`: there is none), with `wall` the time to
    /// write into it.
    pub fn step(&mut self, current: Option<&LeaseSpec>, now: Instant, wall: Timestamp) -> Step {
        let Some(current) = current else {
            self.seen = None;
            return Step::Create(self.fresh(wall));
        };
        let changed_at = match &self.seen {
            Some((seen, at)) if seen == current => *at,
            _ => now,
        };
        self.seen = Some((current.clone(), changed_at));
        match holder(current) {
            Some(holder) if holder == self.identity => Step::Write {
                spec: self.renewed(current, wall),
                taken: false,
            },
            Some(holder) => {
                let duration = recorded_duration(current);
                let valid_until = changed_at + duration;
                if now < valid_until {
                    Step::Wait {
                        holder: holder.to_string(),
                        valid_for: valid_until - now,
                    }
                } else {
                    Step::Write {
                        spec: self.taken(current, wall),
                        taken: true,
                    }
                }
            }
            None => Step::Write {
                spec: self.taken(current, wall),
                taken: true,
            },
        }
    }

    /// The Lease given up by its holder: no holder, so the next candidate to read it takes it
    /// at once (client-go's ReleaseOnCancel). `None` when we do not hold it.
    pub fn released(&self, current: &LeaseSpec, wall: Timestamp) -> Option<LeaseSpec> {
        if !self.holds(current) {
            return None;
        }
        Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(MicroTime(wall)),
            renew_time: Some(MicroTime(wall)),
            ..current.clone()
        })
    }

    /// Whether the holder must stop leading: its last successful renewal is older than the
    /// renew deadline.
    pub fn lapsed(&self, last_renewed: Instant, now: Instant) -> bool {
        now.saturating_duration_since(last_renewed) >= self.timing.renew_deadline
    }

    fn seconds(&self) -> i32 {
        i32::try_from(self.timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    fn fresh(&self, wall: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.seconds()),
            acquire_time: Some(MicroTime(wall)),
            renew_time: Some(MicroTime(wall)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }
    }

    fn renewed(&self, current: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
        LeaseSpec {
            lease_duration_seconds: Some(self.seconds()),
            acquire_time: current.acquire_time.clone().or(Some(MicroTime(wall))),
            renew_time: Some(MicroTime(wall)),
            ..current.clone()
        }
    }

    fn taken(&self, current: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.seconds()),
            acquire_time: Some(MicroTime(wall)),
            renew_time: Some(MicroTime(wall)),
            lease_transitions: Some(current.lease_transitions.unwrap_or(0).saturating_add(1)),
            ..current.clone()
        }
    }
}

/// The holder a Lease names; `None` for one released (empty) or never held.
pub fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// The validity the record claims (`leaseDurationSeconds`); none, or not positive, is none.
fn recorded_duration(spec: &LeaseSpec) -> Duration {
    Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wall(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(wall(0))),
            renew_time: Some(MicroTime(wall(renewed))),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }
    }

    fn candidate(name: &str) -> Candidate {
        Candidate::new(name, LeaseTiming::default())
    }

    #[test]
    fn client_go_defaults_and_the_holder_stops_before_anyone_may_take_over() {
        let timing = LeaseTiming::default();
        assert_eq!(timing.lease_duration, Duration::from_secs(15));
        assert_eq!(timing.renew_deadline, Duration::from_secs(10));
        assert_eq!(timing.retry_period, Duration::from_secs(2));
        assert!(timing.renew_deadline < timing.lease_duration);
        assert!(timing.retry_period < timing.renew_deadline);
    }

    #[test]
    fn one_lease_per_watched_scope() {
        assert_eq!(lease_name(None), "portalloc-watcher");
        assert_eq!(lease_name(Some("apps")), "portalloc-watcher-apps");
    }

    #[test]
    fn no_lease_is_created_with_us_as_holder() {
        let mut a = candidate("watcher-a");
        let Step::Create(spec) = a.step(None, Instant::now(), wall(5)) else {
            panic!("expected a create");
        };
        assert_eq!(spec.holder_identity.as_deref(), Some("watcher-a"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.acquire_time, Some(MicroTime(wall(5))));
        assert_eq!(spec.renew_time, Some(MicroTime(wall(5))));
        assert!(a.holds(&spec));
    }

    #[test]
    fn a_valid_lease_of_another_waits_its_duration_from_when_we_saw_it_change() {
        let mut b = candidate("watcher-b");
        let t0 = Instant::now();
        let lease = held_by("watcher-a", 0);
        assert_eq!(
            b.step(Some(&lease), t0, wall(0)),
            Step::Wait {
                holder: "watcher-a".into(),
                valid_for: Duration::from_secs(15)
            }
        );
        // The same record 14 s later: still valid.
        assert!(matches!(
            b.step(Some(&lease), t0 + Duration::from_secs(14), wall(14)),
            Step::Wait { valid_for, .. } if valid_for == Duration::from_secs(1)
        ));
        // Unchanged for 15 s: expired, taken, one more transition.
        let Step::Write { spec, taken } =
            b.step(Some(&lease), t0 + Duration::from_secs(15), wall(15))
        else {
            panic!("expected a take-over");
        };
        assert!(taken);
        assert_eq!(spec.holder_identity.as_deref(), Some("watcher-b"));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(wall(15))));
        assert_eq!(spec.renew_time, Some(MicroTime(wall(15))));
    }

    #[test]
    fn a_renewal_restarts_the_wait_whatever_the_renew_time_says() {
        let mut b = candidate("watcher-b");
        let t0 = Instant::now();
        b.step(Some(&held_by("watcher-a", 0)), t0, wall(0));
        // Renewed at t0 + 10 s, with a renew time from a clock an hour behind ours: the change
        // is what counts.
        let renewed = held_by("watcher-a", -3600);
        let later = t0 + Duration::from_secs(10);
        assert!(matches!(
            b.step(Some(&renewed), later, wall(10)),
            Step::Wait { .. }
        ));
        assert!(matches!(
            b.step(Some(&renewed), t0 + Duration::from_secs(20), wall(20)),
            Step::Wait { valid_for, .. } if valid_for == Duration::from_secs(5)
        ));
        assert!(matches!(
            b.step(Some(&renewed), t0 + Duration::from_secs(25), wall(25)),
            Step::Write { taken: true, .. }
        ));
    }

    #[test]
    fn a_new_candidate_waits_a_whole_duration_even_for_an_old_renew_time() {
        // It cannot tell an abandoned Lease from one renewed just before it looked.
        let mut c = candidate("watcher-c");
        let stale = held_by("watcher-a", -86_400);
        assert!(matches!(
            c.step(Some(&stale), Instant::now(), wall(0)),
            Step::Wait { valid_for, .. } if valid_for == Duration::from_secs(15)
        ));
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let a = candidate("watcher-a");
        let released = a.released(&held_by("watcher-a", 30), wall(31)).unwrap();
        assert_eq!(released.holder_identity.as_deref(), Some(""));
        assert_eq!(released.lease_duration_seconds, Some(1));
        assert_eq!(released.renew_time, Some(MicroTime(wall(31))));
        assert_eq!(released.lease_transitions, Some(3));
        assert_eq!(holder(&released), None);
        let mut b = candidate("watcher-b");
        let Step::Write { spec, taken } = b.step(Some(&released), Instant::now(), wall(31)) else {
            panic!("expected a take-over");
        };
        assert!(taken);
        assert_eq!(spec.holder_identity.as_deref(), Some("watcher-b"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(4));
        // A Lease without a holder field at all is free too.
        let never_held = LeaseSpec::default();
        assert!(matches!(
            b.step(Some(&never_held), Instant::now(), wall(32)),
            Step::Write { taken: true, .. }
        ));
    }

    #[test]
    fn only_the_holder_releases() {
        let b = candidate("watcher-b");
        assert_eq!(b.released(&held_by("watcher-a", 0), wall(1)), None);
    }

    #[test]
    fn the_holder_renews_keeping_its_acquire_time_and_transitions() {
        let mut a = candidate("watcher-a");
        let lease = held_by("watcher-a", 0);
        let Step::Write { spec, taken } = a.step(Some(&lease), Instant::now(), wall(2)) else {
            panic!("expected a renewal");
        };
        assert!(!taken);
        assert_eq!(spec.holder_identity.as_deref(), Some("watcher-a"));
        assert_eq!(spec.acquire_time, Some(MicroTime(wall(0))));
        assert_eq!(spec.renew_time, Some(MicroTime(wall(2))));
        assert_eq!(spec.lease_transitions, Some(3));
    }

    #[test]
    fn the_holder_stops_leading_after_the_renew_deadline() {
        let a = candidate("watcher-a");
        let renewed = Instant::now();
        assert!(!a.lapsed(renewed, renewed + Duration::from_millis(9_999)));
        assert!(a.lapsed(renewed, renewed + Duration::from_secs(10)));
    }
}

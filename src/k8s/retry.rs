//! The one retry driver: bounded retries with exponential backoff and full jitter, for
//! compare-and-swap conflicts and transient API failures, honouring the server's Retry-After.
//! Every read-decide-write loop of this layer (allocation, repair, spec updates) goes round
//! through [`Attempts::backoff`].

use std::time::{Duration, Instant};

use rand::Rng;

use super::error::{KubeError, Target, server_retry_after, transport_message};

/// How hard to try before giving up. Both bounds apply: whichever is reached first ends it.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub max_elapsed: Duration,
    /// The first backoff's ceiling; it doubles per attempt up to `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        // The minute is the real bound. Under sustained contention (16 clients allocating back
        // to back) an unlucky client lost 30 rounds in 24 s, so attempts are capped high enough
        // that time, not bad luck, ends the wait; the cap still stops a client spinning on
        // instant failures.
        Self {
            max_attempts: 100,
            max_elapsed: Duration::from_secs(60),
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(1),
        }
    }
}

/// Why the last attempt failed, for the message when the budget runs out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryCause {
    Conflict,
    Transient(String),
}

impl RetryCause {
    /// Whether a failed request is worth another round, and why; `None` when it is final.
    pub fn of(err: &kube::Error) -> Option<RetryCause> {
        match err {
            kube::Error::Api(status) if status.is_conflict() => Some(RetryCause::Conflict),
            kube::Error::Api(status) if matches!(status.code, 429 | 500 | 502 | 503 | 504) => Some(
                RetryCause::Transient(format!("HTTP {}: {}", status.code, status.message)),
            ),
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => {
                Some(RetryCause::Transient(transport_message(err)))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for RetryCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetryCause::Conflict => f.write_str("409 Conflict (another client wrote first)"),
            RetryCause::Transient(message) => f.write_str(message),
        }
    }
}

/// Why a loop stops going round.
#[derive(Debug)]
pub enum Stop {
    /// The failure is not one a retry fixes.
    Final(KubeError),
    /// The budget of attempts or time is spent.
    Exhausted(Exhausted),
}

/// Counts attempts against a policy and sleeps between them.
#[derive(Debug)]
pub struct Attempts {
    policy: RetryPolicy,
    started: Instant,
    pub attempts: u32,
    pub conflicts: u32,
    pub transient_failures: u32,
    /// Conflicts of writes decided against a remembered copy (see [`Attempts::stale_copy`]).
    stale_copies: u32,
}

/// The retry budget ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    pub attempts: u32,
    pub elapsed: Duration,
    pub conflicts: u32,
    pub last: RetryCause,
}

impl Attempts {
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            started: Instant::now(),
            attempts: 1,
            conflicts: 0,
            transient_failures: 0,
            stale_copies: 0,
        }
    }

    /// A 409 on a write decided against a remembered copy: the copy was out of date, which
    /// says nothing about contention, and the next round reads afresh anyway. Counted as a
    /// conflict and an attempt (the budget still bounds the loop), without a sleep and
    /// without raising the next backoff.
    pub fn stale_copy(&mut self) -> Result<(), Exhausted> {
        self.conflicts += 1;
        if self.attempts >= self.policy.max_attempts {
            return Err(Exhausted {
                attempts: self.attempts,
                elapsed: self.started.elapsed(),
                conflicts: self.conflicts,
                last: RetryCause::Conflict,
            });
        }
        self.attempts += 1;
        self.stale_copies += 1;
        Ok(())
    }

    /// After request `target` failed with `err`: sleep and return Ok to go round again, or say
    /// why not. `label` names the loop in the log line (`ns/name in pool "p"`).
    pub async fn backoff(
        &mut self,
        err: kube::Error,
        target: Target,
        label: &str,
    ) -> Result<(), Stop> {
        let Some(cause) = RetryCause::of(&err) else {
            return Err(Stop::Final(KubeError::from_kube(err, target)));
        };
        let described = cause.to_string();
        let delay = self
            .retry_after(cause, server_retry_after(&err))
            .await
            .map_err(Stop::Exhausted)?;
        tracing::info!(
            "{label}: {described} on {} {}; attempt {} after {} ms",
            target.verb,
            target.resource,
            self.attempts,
            delay.as_millis()
        );
        Ok(())
    }

    /// Record a failed attempt; sleep and return Ok to try again, or Err when the budget is spent.
    /// The delay is at least what the server asked for (`server_delay`, its Retry-After).
    pub async fn retry_after(
        &mut self,
        cause: RetryCause,
        server_delay: Option<Duration>,
    ) -> Result<Duration, Exhausted> {
        match &cause {
            RetryCause::Conflict => self.conflicts += 1,
            RetryCause::Transient(_) => self.transient_failures += 1,
        }
        let jittered = self.next_delay(&mut rand::rng());
        let delay = server_delay.map_or(jittered, |asked| asked.max(jittered));
        let elapsed = self.started.elapsed();
        if self.attempts >= self.policy.max_attempts || elapsed + delay > self.policy.max_elapsed {
            return Err(Exhausted {
                attempts: self.attempts,
                elapsed,
                conflicts: self.conflicts,
                last: cause,
            });
        }
        tokio::time::sleep(delay).await;
        self.attempts += 1;
        Ok(delay)
    }

    /// Full jitter: uniform in [0, min(max_delay, base * 2^(attempt-1))].
    fn next_delay(&self, rng: &mut impl Rng) -> Duration {
        let exponent = (self.attempts - self.stale_copies)
            .saturating_sub(1)
            .min(20);
        let ceiling = self
            .policy
            .base_delay
            .saturating_mul(1 << exponent)
            .min(self.policy.max_delay);
        let nanos = ceiling.as_nanos() as u64;
        Duration::from_nanos(if nanos == 0 {
            0
        } else {
            rng.random_range(0..=nanos)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            max_elapsed: Duration::from_secs(5),
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(4),
        }
    }

    #[tokio::test]
    async fn gives_up_after_max_attempts_and_counts_them() {
        let mut attempts = Attempts::new(quick(3));
        assert!(
            attempts
                .retry_after(RetryCause::Conflict, None)
                .await
                .is_ok()
        );
        assert!(
            attempts
                .retry_after(RetryCause::Transient("reset".into()), None)
                .await
                .is_ok()
        );
        let exhausted = attempts
            .retry_after(RetryCause::Conflict, None)
            .await
            .unwrap_err();
        assert_eq!(exhausted.attempts, 3);
        assert_eq!(exhausted.conflicts, 2);
        assert_eq!(attempts.transient_failures, 1);
    }

    #[tokio::test]
    async fn gives_up_when_time_runs_out() {
        let policy = RetryPolicy {
            max_elapsed: Duration::ZERO,
            ..quick(100)
        };
        let exhausted = Attempts::new(policy)
            .retry_after(RetryCause::Conflict, None)
            .await
            .unwrap_err();
        assert_eq!(exhausted.attempts, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_servers_retry_after_is_honoured_within_the_budget() {
        let mut attempts = Attempts::new(quick(10));
        let asked = Duration::from_secs(2);
        let delay = attempts
            .retry_after(RetryCause::Transient("429".into()), Some(asked))
            .await
            .unwrap();
        assert_eq!(delay, asked);
        // A wait longer than the time left ends the loop instead of overrunning it.
        let exhausted = attempts
            .retry_after(
                RetryCause::Transient("429".into()),
                Some(Duration::from_secs(60)),
            )
            .await
            .unwrap_err();
        assert_eq!(exhausted.attempts, 2);
    }

    #[tokio::test]
    async fn a_final_error_stops_at_once_and_names_the_request() {
        let mut attempts = Attempts::new(quick(10));
        let forbidden = kube::Error::Api(Box::new(kube::core::Status {
            code: 403,
            message: "no".into(),
            ..Default::default()
        }));
        let target = super::super::resources::POOLS.on("get", "p", None);
        let Err(Stop::Final(err)) = attempts.backoff(forbidden, target, "test").await else {
            panic!("a 403 is final");
        };
        assert!(
            err.to_string()
                .starts_with("forbidden: you may not get portpools.portalloc.dev")
        );
        assert_eq!(attempts.attempts, 1);
    }

    #[test]
    fn delays_grow_but_stay_under_the_cap() {
        let policy = RetryPolicy {
            max_attempts: 100,
            max_elapsed: Duration::from_secs(60),
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(200),
        };
        let mut attempts = Attempts::new(policy);
        let mut rng = rand::rng();
        for n in 1..40 {
            attempts.attempts = n;
            let ceiling = Duration::from_millis(10)
                .saturating_mul(1 << (n - 1).min(20))
                .min(policy.max_delay);
            for _ in 0..20 {
                assert!(attempts.next_delay(&mut rng) <= ceiling);
            }
        }
    }

    #[test]
    fn a_stale_copy_counts_but_neither_sleeps_nor_raises_the_backoff() {
        let mut attempts = Attempts::new(quick(3));
        attempts.stale_copy().unwrap();
        assert_eq!((attempts.attempts, attempts.conflicts), (2, 1));
        // The next backoff is still the first one's: at most the base delay (1 ms).
        let mut rng = rand::rng();
        for _ in 0..100 {
            assert!(attempts.next_delay(&mut rng) <= Duration::from_millis(1));
        }
        attempts.stale_copy().unwrap();
        let exhausted = attempts.stale_copy().unwrap_err();
        assert_eq!((exhausted.attempts, exhausted.conflicts), (3, 3));
    }
}

//! Bounded retries with exponential backoff and full jitter, for compare-and-swap conflicts and
//! transient API failures.

use std::time::{Duration, Instant};

use rand::Rng;

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

/// Counts attempts against a policy and sleeps between them.
#[derive(Debug)]
pub struct Attempts {
    policy: RetryPolicy,
    started: Instant,
    pub attempts: u32,
    pub conflicts: u32,
    pub transient_failures: u32,
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
        }
    }

    /// Record a failed attempt; sleep and return Ok to try again, or Err when the budget is spent.
    pub async fn retry_after(&mut self, cause: RetryCause) -> Result<Duration, Exhausted> {
        match &cause {
            RetryCause::Conflict => self.conflicts += 1,
            RetryCause::Transient(_) => self.transient_failures += 1,
        }
        let delay = self.next_delay(&mut rand::rng());
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
        let exponent = self.attempts.saturating_sub(1).min(20);
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
        assert!(attempts.retry_after(RetryCause::Conflict).await.is_ok());
        assert!(
            attempts
                .retry_after(RetryCause::Transient("reset".into()))
                .await
                .is_ok()
        );
        let exhausted = attempts
            .retry_after(RetryCause::Conflict)
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
            .retry_after(RetryCause::Conflict)
            .await
            .unwrap_err();
        assert_eq!(exhausted.attempts, 1);
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
}

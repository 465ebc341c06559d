//! The baseline users have today: the RoleBasedGroup random port allocator, simulated. Each call
//! (one pod) draws its ports uniformly at random from the range and re-draws only ports already
//! drawn in the same call: ports are unique within one batch, never across calls.

use std::collections::HashSet;

use rand::Rng;

pub struct RandomOutcome {
    pub trials: u32,
    /// Mean number of handed-out ports per workload that an earlier call already held.
    pub mean_duplicates: f64,
    /// Share of workloads in which at least one port was handed out twice.
    pub share_with_duplicate: f64,
}

/// `pods` calls of `ports_per_pod` ports each in `first..=last`, repeated `trials` times.
pub fn simulate(
    pods: u32,
    ports_per_pod: u32,
    first: u16,
    last: u16,
    trials: u32,
    rng: &mut impl Rng,
) -> RandomOutcome {
    let mut duplicates_total = 0u64;
    let mut with_duplicate = 0u32;
    for _ in 0..trials {
        let mut held: HashSet<u16> = HashSet::new();
        let mut duplicates = 0u64;
        for _ in 0..pods {
            let mut batch: HashSet<u16> = HashSet::new();
            while batch.len() < ports_per_pod as usize {
                batch.insert(rng.random_range(first..=last));
            }
            for port in batch {
                if !held.insert(port) {
                    duplicates += 1;
                }
            }
        }
        duplicates_total += duplicates;
        with_duplicate += u32::from(duplicates > 0);
    }
    RandomOutcome {
        trials,
        mean_duplicates: duplicates_total as f64 / f64::from(trials),
        share_with_duplicate: f64::from(with_duplicate) / f64::from(trials),
    }
}

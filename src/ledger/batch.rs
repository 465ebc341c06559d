//! Group commit: what many owners hold in one pool after their operations, decided from one
//! read of the pool so that a single compare-and-swap commits all of them.
//!
//! Each item is decided with [`decide`] against the pool as the items before it left it, so the
//! result is exactly that of running the items one after another, with one write instead of one
//! per item. A refusal (pool full, port held, invalid spec) is that item's outcome and changes
//! nothing; the items after it are decided as if it were absent.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;

use crate::api::{PoolHolder, PortPoolStatus};
use crate::core::Holdings;

use super::decision::{Decision, Operation, decide};
use super::pool_record::{HolderEntry, PoolRecord};
use super::refusal::Refusal;

/// One owner's part of a batch.
#[derive(Clone, Debug)]
pub struct BatchItem {
    pub uid: String,
    /// `namespace/name` of the PortAllocation.
    pub owner: String,
    /// What it asks for, or why its spec cannot be served at all.
    pub operation: Result<Operation, Refusal>,
}

/// What the batch decided for one item.
#[derive(Clone, Debug, PartialEq)]
pub enum ItemOutcome {
    /// The pool already held what the item asks for.
    Unchanged(Holdings),
    /// The item's entry changes in the status to write.
    Changed {
        holdings: Holdings,
        allocated: usize,
        released: usize,
    },
    /// A lasting refusal; the item's entry is left as it was.
    Refused(Refusal),
}

impl ItemOutcome {
    /// What the item holds if the batch's status is written (for a refusal: what it held).
    pub fn holdings<'a>(&'a self, before: &'a Holdings) -> &'a Holdings {
        match self {
            ItemOutcome::Unchanged(holdings) | ItemOutcome::Changed { holdings, .. } => holdings,
            ItemOutcome::Refused(_) => before,
        }
    }
}

/// The decision for a whole batch: one outcome per item, in the items' order, and the one
/// status to write (`None` when no item changes the pool).
#[derive(Clone, Debug, PartialEq)]
pub struct BatchDecision {
    pub outcomes: Vec<ItemOutcome>,
    pub status: Option<PortPoolStatus>,
}

/// Decide every item against `record`, in order, as one change of the pool.
pub fn decide_batch(record: &PoolRecord, items: &[BatchItem], rng: &mut impl Rng) -> BatchDecision {
    // Every entry as read, verbatim, keyed by uid (as `status_with` keys them); items replace
    // or drop theirs. Other holders' text is never rewritten.
    let mut entries: BTreeMap<String, PoolHolder> = record
        .pool
        .status
        .iter()
        .flat_map(|s| s.holders.iter())
        .map(|entry| (entry.uid.clone(), entry.clone()))
        .collect();
    // The record the next item is decided against. Its status lists no holders: `decide` then
    // builds a one-entry status per item instead of copying every entry each time (quadratic
    // in a batch of 1,000); the entries live in `entries` above and the counts in `state`.
    let mut work = record.clone();
    if let Some(status) = work.pool.status.as_mut() {
        status.holders.clear();
    }
    let mut last_status = None;
    let mut outcomes = Vec::with_capacity(items.len());
    for item in items {
        let operation = match &item.operation {
            Ok(operation) => operation,
            Err(refusal) => {
                outcomes.push(ItemOutcome::Refused(refusal.clone()));
                continue;
            }
        };
        let before = work.holdings_of(&item.uid);
        match decide(&work, &item.uid, &item.owner, operation, rng) {
            Err(refusal) => outcomes.push(ItemOutcome::Refused(refusal)),
            Ok(Decision::Unchanged(holdings)) => outcomes.push(ItemOutcome::Unchanged(holdings)),
            Ok(Decision::Write {
                status,
                holdings,
                allocated,
                released,
            }) => {
                apply(&mut work, &mut entries, item, &before, &holdings, &status);
                last_status = Some(status);
                outcomes.push(ItemOutcome::Changed {
                    holdings,
                    allocated,
                    released,
                });
            }
        }
    }
    // The last write's status carries the counts of the final state; only its holders (one
    // entry at most, from the emptied record) are replaced by the merged list.
    let status = last_status.map(|mut status| {
        status.holders = entries.into_values().collect();
        status.holder_count = status.holders.len() as i32;
        status
    });
    BatchDecision { outcomes, status }
}

/// Carry one item's decision into the record the next item sees.
fn apply(
    work: &mut PoolRecord,
    entries: &mut BTreeMap<String, PoolHolder>,
    item: &BatchItem,
    before: &Holdings,
    after: &Holdings,
    status: &PortPoolStatus,
) {
    // The state changes exactly by the ports that left and joined the owner's holdings: that is
    // what `decide` did to its copy (a kept port is untouched, a dropped one released).
    let (was, now): (BTreeSet<u16>, BTreeSet<u16>) =
        (before.ports().collect(), after.ports().collect());
    for &port in was.difference(&now) {
        work.state.release(port);
    }
    for &port in now.difference(&was) {
        // Cannot fail: `decide` just took this port from the same state.
        let _ = work.state.mark_held(port);
    }
    work.opaque.remove(&item.uid);
    match status.holders.iter().find(|h| h.uid == item.uid) {
        Some(entry) if !after.is_empty() => {
            entries.insert(item.uid.clone(), entry.clone());
            work.holders.insert(
                item.uid.clone(),
                HolderEntry {
                    owner: entry.owner.clone(),
                    holdings: after.clone(),
                },
            );
        }
        _ => {
            entries.remove(&item.uid);
            work.holders.remove(&item.uid);
        }
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;

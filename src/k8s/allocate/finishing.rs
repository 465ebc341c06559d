//! The end of a batch's item (`batch`): its status written once its shards are committed, or the
//! error of an item no round could serve.

use kube::ResourceExt;

use super::allocator::{AllocateError, Allocator, allocations};
use super::batch::{Done, ItemResult, StopAll};
use super::configmaps::keep_env_configmap;
use super::sync::SyncReport;
use crate::api::PortAllocation;
use crate::k8s::error::error_chain;
use crate::ledger::{ItemOutcome, Outcome, Refusal, allocation_status, owner_of, set_slot_copies};

impl Allocator {
    /// Write one committed item's status. A status write that fails goes the single way,
    /// which re-reads and retries (the shard step is then a no-op for it).
    pub(super) async fn finish(&self, pa: PortAllocation, done: Done) -> ItemResult {
        let (holdings, allocated, released) = match done.outcome {
            ItemOutcome::Refused { refusal, holdings } => {
                self.record_refusal(&pa, &refusal, Some(holdings)).await;
                return Err(refusal.into());
            }
            ItemOutcome::Unchanged(holdings) => (holdings, 0, 0),
            ItemOutcome::Changed {
                holdings,
                allocated,
                released,
            } => (holdings, allocated, released),
        };
        let mut status =
            allocation_status(&pa, &holdings, Some(&done.pool_uid), Outcome::Converged);
        status.shards = crate::ledger::status_shards(&done.shards);
        set_slot_copies(&mut status, &done.copies);
        let report = |allocation, status_written| SyncReport {
            namespace: pa.namespace().unwrap_or_default(),
            name: pa.name_any(),
            pool: pa.spec.pool.clone(),
            holdings: holdings.clone(),
            allocated,
            released,
            attempts: 1,
            conflicts: 0,
            pool_written: done.written,
            status_written,
            allocation,
            configmap: None,
        };
        let mut report = if pa.status.as_ref() == Some(&status) {
            report(pa.clone(), false)
        } else {
            let mut updated = pa.clone();
            updated.status = Some(status);
            match allocations(&self.client, &pa)
                .replace_status(
                    &pa.name_any(),
                    &crate::k8s::client::write_params(),
                    &updated,
                )
                .await
            {
                Ok(written) => report(crate::k8s::client::lean(written), true),
                Err(e) => {
                    tracing::info!(
                        "{}: status write failed ({}); syncing it on its own",
                        owner_of(&pa),
                        error_chain(&e)
                    );
                    // The single path keeps the ConfigMap itself.
                    return self.sync_or_record(pa).await.map(|mut one| {
                        one.allocated += allocated;
                        one.released += released;
                        one.pool_written |= done.written;
                        one
                    });
                }
            }
        };
        // As the single path does after its status write: the env files follow the status.
        report.configmap = keep_env_configmap(&self.client, &report.allocation, false).await;
        Ok(report)
    }

    /// The error of an item a round could not serve; refusals are recorded on its status.
    pub(super) async fn stopped(
        &self,
        pa: &PortAllocation,
        stop: Option<&StopAll>,
    ) -> AllocateError {
        match stop {
            Some(StopAll::Refused(refusal)) => {
                // Each item's refusal names its own PortAllocation.
                let refusal = match refusal {
                    Refusal::PoolNotFound { pool, .. } => Refusal::PoolNotFound {
                        pool: pool.clone(),
                        owner: owner_of(pa),
                    },
                    other => other.clone(),
                };
                self.record_refusal(pa, &refusal, None).await;
                AllocateError::Refused(refusal)
            }
            Some(StopAll::Error(AllocateError::Exhausted {
                pool,
                attempts,
                elapsed_ms,
                conflicts,
                last,
                ..
            })) => AllocateError::Exhausted {
                owner: owner_of(pa),
                pool: pool.clone(),
                attempts: *attempts,
                elapsed_ms: *elapsed_ms,
                conflicts: *conflicts,
                last: last.clone(),
            },
            Some(StopAll::Error(AllocateError::BlockedShard {
                pool,
                shard,
                reason,
                ..
            })) => AllocateError::BlockedShard {
                owner: owner_of(pa),
                pool: pool.clone(),
                shard: shard.clone(),
                reason: reason.clone(),
            },
            // A final error of the server (Forbidden, say) for the batch as a whole: each item
            // goes alone, so the server's answer stays with its own item.
            Some(StopAll::Error(_)) | None => match self.sync_or_record(pa.clone()).await {
                Ok(_) => unreachable_ok(pa),
                Err(e) => e,
            },
        }
    }
}

/// An item that a lone retry synced after all: reported as the conflict it first was (rare).
fn unreachable_ok(pa: &PortAllocation) -> AllocateError {
    AllocateError::Exhausted {
        owner: owner_of(pa),
        pool: pa.spec.pool.clone(),
        attempts: 0,
        elapsed_ms: 0,
        conflicts: 0,
        last: "synced alone after the batch failed; run the command again to see it".into(),
    }
}

//! Client-side allocation with optimistic concurrency.
//!
//! A pool's holders live in its PortPoolShards, one per 256-port window, and each shard's
//! `resourceVersion` is the lock for its ports: read the shard, decide with the ledger, write
//! the shard's status with the version read, and on 409 Conflict read again and decide again
//! ([`super::commit`]). The shard write is the commit point. The PortAllocation's status is
//! written after it and is derived from the committed entries, so a client killed between the
//! two writes leaves a state the next sync completes without moving any port: the decision is
//! then "unchanged" and only the status is written.
//!
//! After both, the ConfigMap the PortAllocation names (`spec.configMap`) is brought in line with
//! the status just written (see [`super::configmaps`]). It follows the allocation and never
//! undoes it: its outcome, good or bad, is part of the [`SyncReport`].

use crate::k8s::error::error_chain;
use std::fmt;

use kube::ResourceExt;
use kube::api::Api;

use super::allocator::{AllocateError, Allocator, Failed, Where, allocations};
use super::commit::Request;
use super::configmaps::{ConfigMapError, EnvConfigMap, keep_env_configmap};
use crate::api::{PortAllocation, PortAllocationStatus};
use crate::core::Holdings;
use crate::k8s::error::KubeError;
use crate::k8s::resources::{ALLOCATION_STATUS, ALLOCATIONS};
use crate::k8s::retry::Attempts;
use crate::ledger::{Operation, Outcome, Refusal, allocation_status, owner_of, recorded_holdings};

/// What one sync or release did.
#[derive(Debug)]
pub struct SyncReport {
    pub namespace: String,
    pub name: String,
    pub pool: String,
    pub holdings: Holdings,
    pub allocated: usize,
    pub released: usize,
    pub attempts: u32,
    pub conflicts: u32,
    /// Whether a shard of the pool was written.
    pub pool_written: bool,
    pub status_written: bool,
    pub allocation: PortAllocation,
    /// What keeping its ConfigMap did; `None` when the spec names none. A failure here leaves
    /// the ports allocated and the status written.
    pub configmap: Option<Result<EnvConfigMap, ConfigMapError>>,
}

impl Allocator {
    /// Make the shards and the PortAllocation's status match its spec.
    pub async fn sync(&self, pa: PortAllocation) -> Result<SyncReport, AllocateError> {
        self.sync_inner(pa).await.map_err(|failed| failed.error)
    }

    async fn sync_inner(&self, pa: PortAllocation) -> Result<SyncReport, Failed> {
        let operation = Operation::sync_of(&pa)?;
        self.converge(pa, operation).await
    }

    /// [`Allocator::sync`], and on a lasting refusal record it on the object's status so
    /// `kubectl get` and GitOps dashboards show it.
    pub async fn sync_or_record(&self, pa: PortAllocation) -> Result<SyncReport, AllocateError> {
        match self.sync_inner(pa.clone()).await {
            Ok(report) => Ok(report),
            Err(Failed { error, holdings }) => {
                if let Some(refusal) = error.refusal() {
                    self.record_refusal(&pa, refusal, holdings).await;
                }
                Err(error)
            }
        }
    }

    /// Give back the ports of one role, or all of them, without touching the spec.
    pub async fn release(
        &self,
        pa: PortAllocation,
        role: Option<String>,
    ) -> Result<SyncReport, AllocateError> {
        self.converge(pa, Operation::Release { role })
            .await
            .map_err(|failed| failed.error)
    }

    /// Bring the ConfigMap `pa` names in line with its spec and status, alone: for an object
    /// whose ports need nothing (the watcher's resync), so a ConfigMap deleted or edited by hand
    /// comes back. `None` when it names none.
    pub async fn keep_configmap(
        &self,
        pa: &PortAllocation,
    ) -> Option<Result<EnvConfigMap, ConfigMapError>> {
        keep_env_configmap(&self.client, pa, false).await
    }

    /// Remove a holder's entries from a pool entirely, after its PortAllocation is gone.
    /// `status` is the last status it had, which names the shards its entries are in (without
    /// it every shard is read). Returns how many ports were freed.
    pub async fn release_holder(
        &self,
        pool: &str,
        uid: &str,
        owner: &str,
        status: Option<&PortAllocationStatus>,
    ) -> Result<usize, AllocateError> {
        let mut attempts = Attempts::new(self.policy);
        let request = Request {
            pool,
            uid,
            owner,
            operation: &Operation::Remove,
            without_object: match status {
                Some(status) => Where::of(Some(status)),
                None => Where::Anywhere,
            },
        };
        let committed = self
            .commit(&request, None, &mut attempts)
            .await
            .map_err(|failed| failed.error)?;
        Ok(committed.released)
    }

    /// Record a lasting refusal on the PortAllocation's status. `holdings`: what the shards
    /// said it held, when they were read; else what its status records. Best effort: the
    /// caller reports the refusal either way.
    pub(super) async fn record_refusal(
        &self,
        pa: &PortAllocation,
        refusal: &Refusal,
        holdings: Option<Holdings>,
    ) {
        let holdings = holdings.unwrap_or_else(|| {
            pa.status
                .as_ref()
                .map(recorded_holdings)
                .unwrap_or_default()
        });
        let mut updated = pa.clone();
        updated.status = Some(allocation_status(
            pa,
            &holdings,
            None,
            Outcome::Refused(refusal),
        ));
        if updated.status == pa.status {
            return;
        }
        if let Err(e) = allocations(&self.client, pa)
            .replace_status(
                &pa.name_any(),
                &crate::k8s::client::write_params(),
                &updated,
            )
            .await
        {
            tracing::info!(
                "{}: could not record {}: {}",
                owner_of(pa),
                refusal.reason(),
                error_chain(&e)
            );
        }
    }

    /// Commit to the shards, then write the PortAllocation's status; on a status conflict
    /// re-read the PortAllocation and go round again (the shard step is then a no-op).
    async fn converge(
        &self,
        mut pa: PortAllocation,
        operation: Operation,
    ) -> Result<SyncReport, Failed> {
        let mut attempts = Attempts::new(self.policy);
        let namespace = pa.namespace().unwrap_or_default();
        let name = pa.name_any();
        let api: Api<PortAllocation> = Api::namespaced(self.client.clone(), &namespace);
        let mut allocated = 0;
        let mut released = 0;
        let mut pool_written = false;
        loop {
            let uid = pa.uid().unwrap_or_default();
            let owner = owner_of(&pa);
            let pool_name = pa.spec.pool.clone();
            let request = Request {
                pool: &pool_name,
                uid: &uid,
                owner: &owner,
                operation: &operation,
                without_object: Where::Anywhere,
            };
            let committed = self.commit(&request, Some(&mut pa), &mut attempts).await?;
            allocated += committed.allocated;
            released += committed.released;
            pool_written |= committed.written;

            let outcome = if operation.released_on_purpose(&committed.holdings, released) {
                Outcome::Released
            } else {
                Outcome::Converged
            };
            let mut status =
                allocation_status(&pa, &committed.holdings, Some(&committed.pool_uid), outcome);
            status.shards = crate::ledger::status_shards(&committed.shards);
            crate::ledger::set_slot_copies(&mut status, &committed.copies);
            let report = |pa: PortAllocation, attempts: &Attempts, status_written| SyncReport {
                namespace: namespace.clone(),
                name: name.clone(),
                pool: pool_name.clone(),
                holdings: committed.holdings.clone(),
                allocated,
                released,
                attempts: attempts.attempts,
                conflicts: attempts.conflicts,
                pool_written,
                status_written,
                allocation: pa,
                configmap: None,
            };
            let is_release = matches!(operation, Operation::Release { .. });
            if pa.status.as_ref() == Some(&status) {
                let report = report(pa, &attempts, false);
                return Ok(self.with_configmap(report, is_release).await);
            }
            let mut updated = pa.clone();
            updated.status = Some(status);
            let label = format!("{owner} in pool {pool_name:?}");
            match api
                .replace_status(&name, &crate::k8s::client::write_params(), &updated)
                .await
            {
                Ok(written) => {
                    let report = report(crate::k8s::client::lean(written), &attempts, true);
                    return Ok(self.with_configmap(report, is_release).await);
                }
                Err(e) => {
                    let target = ALLOCATION_STATUS.on("update", &name, Some(&namespace));
                    self.backoff(&mut attempts, e, target, &label, &pool_name, &owner)
                        .await?;
                    pa = api.get(&name).await.map_err(|e| {
                        KubeError::from_kube(e, ALLOCATIONS.on("get", &name, Some(&namespace)))
                    })?;
                    if pa.uid().unwrap_or_default() != uid {
                        // Deleted and recreated meanwhile: a new owner, which the next round serves;
                        // the old UID's entry is a leak that `repair` frees.
                        continue;
                    }
                }
            }
        }
    }

    /// Keep the ConfigMap of the PortAllocation as the report leaves it (spec and the status
    /// just written).
    pub(super) async fn with_configmap(
        &self,
        mut report: SyncReport,
        released: bool,
    ) -> SyncReport {
        report.configmap = keep_env_configmap(&self.client, &report.allocation, released).await;
        report
    }
}

impl fmt::Display for SyncReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "portallocation/{} in {}: {} ports held in pool {}",
            self.name,
            self.namespace,
            self.holdings.port_count(),
            self.pool
        )?;
        match (self.allocated, self.released) {
            (0, 0) => f.write_str(" (unchanged)"),
            (a, 0) => write!(f, " ({a} allocated)"),
            (0, r) => write!(f, " ({r} released)"),
            (a, r) => write!(f, " ({a} allocated, {r} released)"),
        }
    }
}

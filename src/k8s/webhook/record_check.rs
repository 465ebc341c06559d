//! Before the webhook gives a pod its ports: each one must be its PortAllocation's in the pool's
//! record, not only in the PortAllocation's status, which its tenant may write
//! (docs/webhook-record-check.md). The decision is the ledger's ([`unheld_ports`]); here the
//! shards of the windows the pod's ports lie in are read, from the Allocator's remembered copies
//! when recent or kept current by the webhook's watch of the shards ([`ShardVersions`]), so an
//! admission usually costs no request.
//!
//! A remembered copy may be older than the status (another client allocated since), so a port
//! it does not give the owner is read again before the pod is denied. A copy that does give it
//! is trusted for [`MAX_AGE`] only, unless the watch vouches for it: a port the owner released
//! and someone else was given since would otherwise pass for as long as the copy stays
//! remembered.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use super::denial::RecordCheckError;
use crate::api::{PodInjection, PortAllocation, PortPoolShard};
use crate::k8s::allocate::Allocator;
use crate::k8s::error::KubeError;
use crate::k8s::record::{ShardStore, ShardVersions};
use crate::ledger::{
    RecordDenial, ShardKey, owner_of, pod_port_shards, pod_ports, shard_name, unheld_ports,
};

/// How long a remembered shard that gives the owner its ports is taken at its word.
pub const MAX_AGE: Duration = Duration::from_secs(5);

/// Set to `off` in the webhook's environment to skip the check (to measure its cost, or as a
/// way out should it refuse pods it should not).
pub const RECORD_CHECK_ENV: &str = "PORTALLOC_WEBHOOK_RECORD_CHECK";

static ENABLED: LazyLock<bool> =
    LazyLock::new(|| std::env::var(RECORD_CHECK_ENV).map_or(true, |v| v != "off"));

/// Where the check reads the record from.
pub(super) struct Record<'a> {
    pub client: &'a kube::Client,
    pub allocator: &'a Allocator,
    pub versions: &'a ShardVersions,
}

impl Record<'_> {
    /// `Ok` when every port `injection` gives the pod is `pa`'s in the record; else the
    /// denial.
    pub(super) async fn check(
        &self,
        pa: &PortAllocation,
        injection: &PodInjection,
    ) -> Result<(), RecordCheckError> {
        if !*ENABLED {
            return Ok(());
        }
        check(self.client, self.allocator, self.versions, pa, injection).await
    }
}

async fn check(
    client: &kube::Client,
    allocator: &Allocator,
    versions: &ShardVersions,
    pa: &PortAllocation,
    injection: &PodInjection,
) -> Result<(), RecordCheckError> {
    let started = Instant::now();
    let ports = pod_ports(pa, injection)?;
    let keys = pod_port_shards(&ports);
    let pool = &pa.spec.pool;
    let copies = allocator.shard_copies();
    let mut shards: BTreeMap<ShardKey, Option<PortPoolShard>> = keys
        .iter()
        .filter_map(|&key| {
            let name = shard_name(pool, key);
            let copy = copies.get_recent(&name, MAX_AGE).or_else(|| {
                copies
                    .get(&name)
                    .filter(|copy| versions.vouches_for(&name, copy))
            })?;
            Some((key, Some(copy)))
        })
        .collect();
    let remembered = shards.len();
    let store = ShardStore::new(client.clone());
    let mut read = BTreeSet::new();
    loop {
        let missing = keys.iter().filter(|key| !shards.contains_key(key));
        let reads = missing.map(|&key| {
            let store = &store;
            async move {
                let name = shard_name(pool, key);
                let shard = store.get(&name).await;
                (key, name, shard)
            }
        });
        for (key, name, shard) in futures::future::join_all(reads).await {
            let shard = shard.map_err(|(e, target)| RecordCheckError::Read {
                owner: owner_of(pa),
                source: KubeError::from_kube(e, target),
            })?;
            // The current object: the allocator may decide against it too. (Should it have
            // written a newer one meanwhile, this costs it one conflict, never a wrong port.)
            if let Some(shard) = &shard {
                copies.remember(&name, shard);
            }
            read.insert(key);
            shards.insert(key, shard);
        }
        let mismatches = unheld_ports(pa, &ports, &shards);
        // Remembered copies that disagree with the status: read them before denying.
        let stale: Vec<ShardKey> = mismatches
            .iter()
            .map(|m| m.port.shard)
            .filter(|key| !read.contains(key))
            .collect();
        if !stale.is_empty() {
            for key in stale {
                shards.remove(&key);
            }
            continue;
        }
        tracing::debug!(
            owner = %owner_of(pa),
            ports = ports.len(),
            shards = keys.len(),
            remembered,
            reads = read.len(),
            took_us = started.elapsed().as_micros() as u64,
            "record check"
        );
        if mismatches.is_empty() {
            return Ok(());
        }
        return Err(RecordDenial::new(pa, injection, mismatches).into());
    }
}

//! Which ports a pod on the node holds: the ports the pod webhook gave it, where the pool's
//! record gives them to its PortAllocation. The pod's labels and status can be written by its
//! tenant; the record's entries are what the tenancy policy guards, so they decide, exactly
//! as the webhook's record check does.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;

use crate::api::{POD_ALLOCATION_LABEL, PortAllocation, PortPool, PortPoolShard};
use crate::k8s::error::KubeError;
use crate::k8s::record::ShardStore;
use crate::k8s::resources::ALLOCATIONS;
use crate::ledger::node_guard::PodHolding;
use crate::ledger::{owner_of, pod_port_shards, pod_ports, shard_name, unheld_ports};

/// The objects one round read, so the pods of one PortAllocation (and the windows they share)
/// cost one read each: a node's many pods of few workloads make few requests.
#[derive(Default)]
pub(super) struct RoundReads {
    allocations: Mutex<HashMap<(String, String), Option<PortAllocation>>>,
    shards: Mutex<HashMap<String, Option<PortPoolShard>>>,
}

impl RoundReads {
    async fn allocation(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PortAllocation>, String> {
        let key = (namespace.to_string(), name.to_string());
        if let Some(pa) = self.allocations.lock().expect("not poisoned").get(&key) {
            return Ok(pa.clone());
        }
        let api: Api<PortAllocation> = Api::namespaced(client.clone(), namespace);
        let pa = api.get_opt(name).await.map_err(|e| {
            KubeError::from_kube(e, ALLOCATIONS.on("get", name, Some(namespace))).to_string()
        })?;
        self.allocations
            .lock()
            .expect("not poisoned")
            .insert(key, pa.clone());
        Ok(pa)
    }

    async fn shard(&self, store: &ShardStore, name: &str) -> Result<Option<PortPoolShard>, String> {
        if let Some(shard) = self.shards.lock().expect("not poisoned").get(name) {
            return Ok(shard.clone());
        }
        let shard = store
            .get(name)
            .await
            .map_err(|(e, target)| KubeError::from_kube(e, target).to_string())?;
        self.shards
            .lock()
            .expect("not poisoned")
            .insert(name.to_string(), shard.clone());
        Ok(shard)
    }
}

/// What the record says the pod holds: `Ok(None)` for a pod that asks for no ports (no
/// allocation label, or a PortAllocation that gives it none). An error is passing: the agent
/// asks again on its next round, the pod unseen meanwhile (it may claim, is never refused).
pub(super) async fn holding_of(
    client: &kube::Client,
    shards: &ShardStore,
    reads: &RoundReads,
    pools: &BTreeMap<String, PortPool>,
    pod: &Pod,
) -> Result<Option<PodHolding>, String> {
    let Some(name) = pod.labels().get(POD_ALLOCATION_LABEL) else {
        return Ok(None);
    };
    let namespace = pod.namespace().unwrap_or_default();
    let pod_name = format!("{namespace}/{}", pod.name_any());
    let Some(pa) = reads.allocation(client, &namespace, name).await? else {
        return Ok(None);
    };
    let Ok(injection) = pa.pod_injection(pod) else {
        return Ok(None);
    };
    // Not in the agent's view of the pools yet: asked again next round, not taken as nothing.
    let Some(pool) = pools.get(&pa.spec.pool) else {
        return Err(format!(
            "its PortAllocation {namespace}/{name} names PortPool {}, which the agent does not \
             know (not read yet, or deleted)",
            pa.spec.pool
        ));
    };
    let ports = pod_ports(&pa, &injection).map_err(|e| e.to_string())?;
    let mut read = BTreeMap::new();
    for key in pod_port_shards(&ports) {
        let shard = reads.shard(shards, &shard_name(&pa.spec.pool, key)).await?;
        read.insert(key, shard);
    }
    let unheld: BTreeSet<u16> = unheld_ports(&pa, &ports, &read)
        .into_iter()
        .map(|m| m.port.port)
        .collect();
    if !unheld.is_empty() {
        tracing::warn!(
            pod = %pod_name,
            owner = %owner_of(&pa),
            ports = ?unheld,
            "the record does not give these ports to the pod's PortAllocation; the guard treats them as not the pod's"
        );
    }
    Ok(Some(PodHolding {
        pod: pod_name,
        owner: owner_of(&pa),
        pool: pa.spec.pool.clone(),
        protocol: pool.spec.protocol,
        ports: ports
            .iter()
            .map(|p| p.port)
            .filter(|p| !unheld.contains(p))
            .collect(),
    }))
}

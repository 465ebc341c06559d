//! The record a reader of a pool sees: the union of its shards, copy by copy, with what only the
//! shards show.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Client, ResourceExt};

use super::shards::ShardStore;
use crate::api::{PortPool, SpecError};
use crate::k8s::error::KubeError;
use crate::k8s::process::cpu_bound;
use crate::ledger::{
    CopyBound, InUse, NodeCount, PoolRecord, PoolSnapshot, WindowRecord, record_warnings,
};

/// A pool as `pool describe` and `pool get` show it.
#[derive(Clone, Debug)]
pub struct PoolView {
    /// Copy 0: the whole pool without reuse.
    pub record: WindowRecord,
    /// The other copies (`nodeReuse`), ascending: every copy below the pool's `nodeReuse`
    /// (empty when it has no shard yet), and any past it that still has shards.
    pub reused: Vec<(u16, WindowRecord)>,
    /// The copies new holders may use: the pool's `nodeReuse`; following the nodes, those
    /// allowed to pods the size of its largest holder's (at least copy 0).
    pub reuse: u16,
    /// With `spec.followNodes`: the nodes counted and what they allow.
    pub nodes: Option<NodesView>,
    /// How many shards were loaded.
    pub shards: usize,
    /// What only the shards show (shards not loaded, ports in the wrong shard, shards that
    /// carry an older spec, ...).
    pub warnings: Vec<String>,
}

impl PoolView {
    /// `Record:` of `pool describe`.
    pub fn record_kind(&self) -> String {
        match self.shards {
            1 => "1 shard".to_string(),
            n => format!("{n} shards"),
        }
    }

    /// Every copy, copy 0 first.
    pub fn copies(&self) -> impl Iterator<Item = (u16, &WindowRecord)> {
        std::iter::once((0, &self.record)).chain(self.reused.iter().map(|(c, r)| (*c, r)))
    }

    /// The copies new holders may use (below `nodeReuse`): what is free is free in these.
    pub fn usable(&self) -> impl Iterator<Item = &WindowRecord> {
        self.copies()
            .filter(|(copy, _)| *copy < self.reuse)
            .map(|(_, record)| record)
    }

    /// Ports held in all copies together.
    pub fn held(&self) -> u32 {
        self.copies().map(|(_, r)| r.state.held_count()).sum()
    }

    /// How many pods may hold ports at once: the pool's size in each of its copies.
    pub fn capacity(&self) -> u32 {
        self.record.state.size() * u32::from(self.reuse)
    }

    /// Only what is held and free, copy by copy: the holders, their entries as read and any
    /// anomalies dropped. Counting every pool for the gauges and the usage summaries keeps each
    /// pool's view until all are counted; a pool of 750,000 holdings decodes to more than a
    /// hundred MB of holders that a count never reads.
    pub fn into_port_states(mut self) -> PoolView {
        for record in
            std::iter::once(&mut self.record).chain(self.reused.iter_mut().map(|(_, r)| r))
        {
            record.keep_port_state_only();
        }
        self.warnings = Vec::new();
        self
    }

    /// Holders in all copies together.
    pub fn holders(&self) -> usize {
        self.copies()
            .map(|(_, r)| r.holders.len() + r.opaque.len())
            .sum()
    }
}

/// What `pool describe` says of a pool that follows its nodes.
#[derive(Clone, Debug)]
pub struct NodesView {
    /// The node selector, as a label selector string (`every node` without one).
    pub selector: String,
    pub count: NodeCount,
    /// `status.nodesCountedAt`; `None` when the count was made by this reader (no watcher).
    pub counted_at: Option<Time>,
    pub bound: CopyBound,
    pub in_use: InUse,
    /// Ports per pod of the pool's holders, each size once, ascending.
    pub sizes: Vec<u32>,
}

/// Reads the pool's shards (one LIST). The inner error: the pool's spec is unusable.
pub async fn pool_view(
    client: &Client,
    pool: PortPool,
) -> Result<Result<PoolView, SpecError>, KubeError> {
    let shards = ShardStore::new(client.clone())
        .list(&pool.name_any())
        .await
        .map_err(|(e, target)| KubeError::from_kube(e, target))?;
    let mut snapshot = PoolSnapshot::of_pool(&pool);
    crate::k8s::nodes::count_if_unknown(client, &mut snapshot).await;
    let counted_at = pool
        .status
        .as_ref()
        .and_then(|s| s.nodes_counted_at.clone());
    // Every holding of the pool decoded and counted: seconds for the largest pools.
    let loaded = cpu_bound(|| PoolRecord::load(snapshot, shards).map(|record| view_of(&record)));
    Ok(loaded.map(|mut view| {
        if let Some(nodes) = &mut view.nodes {
            nodes.counted_at = counted_at;
        }
        view
    }))
}

/// The nodes part of a view, for a pool that follows them.
fn nodes_of(record: &PoolRecord) -> Option<NodesView> {
    let follow = record.pool.spec.follow_nodes.as_ref()?;
    let bound = record.copy_bound();
    let CopyBound::FollowNodes(count) = bound.clone() else {
        return None;
    };
    let sizes: std::collections::BTreeSet<u32> = record
        .copies
        .values()
        .flat_map(|copy| copy.shards.values())
        .flat_map(|shard| shard.record.holders.keys())
        .map(|uid| record.holdings_of(uid).ports_per_pod())
        .collect();
    Some(NodesView {
        selector: crate::k8s::nodes::selector_text(follow),
        count,
        counted_at: None,
        bound,
        in_use: record.in_use(),
        sizes: sizes.into_iter().collect(),
    })
}

/// What readers see of a loaded record.
pub fn view_of(record: &PoolRecord) -> PoolView {
    PoolView {
        record: record.first().union_record(),
        reused: (1..record.reuse())
            .chain(record.copies.keys().copied())
            .collect::<std::collections::BTreeSet<u16>>()
            .into_iter()
            .filter(|&copy| copy > 0)
            .map(|copy| (copy, record.copy_or_empty(copy).union_record()))
            .collect(),
        reuse: match record.copy_bound() {
            CopyBound::Fixed(reuse) => reuse,
            bound => bound
                .copies_allowed(record.largest_pod(), record.in_use())
                .max(1),
        },
        nodes: nodes_of(record),
        shards: record.shard_count(),
        warnings: record_warnings(record),
    }
}

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
    read_view(client, pool, |record| view_of(&record)).await
}

/// [`pool_view`] for a count (the gauges, the pools' usage summaries): each copy keeps only
/// what is held and free, no holders, entries, anomalies or warnings. A pool of 750,000
/// holdings decodes to more than a hundred MB of holders; joined copy by copy beside the
/// record, as `pool describe` shows them, they took as much again, so here each copy is cut
/// down as soon as it is joined and its shards are dropped with it.
pub async fn pool_port_states(
    client: &Client,
    pool: PortPool,
) -> Result<Result<PoolView, SpecError>, KubeError> {
    read_view(client, pool, port_states_of).await
}

async fn read_view(
    client: &Client,
    pool: PortPool,
    make: fn(PoolRecord) -> PoolView,
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
    let loaded = cpu_bound(|| PoolRecord::load(snapshot, shards).map(make));
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
        reused: shown_copies(record)
            .into_iter()
            .map(|copy| (copy, record.copy_or_empty(copy).union_record()))
            .collect(),
        reuse: usable_copies(record),
        nodes: nodes_of(record),
        shards: record.shard_count(),
        warnings: record_warnings(record),
    }
}

/// [`view_of`] with port states only, each copy's shards dropped once it is joined.
fn port_states_of(mut record: PoolRecord) -> PoolView {
    let (reuse, nodes, shards) = (
        usable_copies(&record),
        nodes_of(&record),
        record.shard_count(),
    );
    let reused_copies = shown_copies(&record);
    let mut states_of = |copy: u16| {
        let mut joined = record.copy_or_empty(copy).union_record();
        joined.keep_port_state_only();
        record.copies.remove(&copy);
        joined
    };
    PoolView {
        record: states_of(0),
        reused: reused_copies
            .into_iter()
            .map(|copy| (copy, states_of(copy)))
            .collect(),
        reuse,
        nodes,
        shards,
        warnings: Vec::new(),
    }
}

/// The copies past the first a view shows: every one below `nodeReuse` and any with shards.
fn shown_copies(record: &PoolRecord) -> std::collections::BTreeSet<u16> {
    (1..record.reuse())
        .chain(record.copies.keys().copied())
        .filter(|&copy| copy > 0)
        .collect()
}

/// The copies new holders may use (see [`PoolView::reuse`]).
fn usable_copies(record: &PoolRecord) -> u16 {
    match record.copy_bound() {
        CopyBound::Fixed(reuse) => reuse,
        bound => bound
            .copies_allowed(record.largest_pod(), record.in_use())
            .max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::{PoolView, port_states_of, view_of};
    use crate::ledger::ShardKey;
    use crate::ledger::fixtures::{holders, pool_record, pool_reused, shard_in};

    #[test]
    fn a_count_has_the_port_states_of_the_view_copy_by_copy_and_no_holders() {
        let pool = pool_reused(&["20000-20599"], 3);
        let shards = vec![
            shard_in(
                &pool,
                ShardKey::new(0, 0),
                holders(&[("a", "w.p=20001,20002")]),
            ),
            shard_in(
                &pool,
                ShardKey::new(0, 1),
                holders(&[("a", "w.p=-,-,20300"), ("b", "w.p=20301")]),
            ),
            shard_in(&pool, ShardKey::new(2, 2), holders(&[("c", "w.p=20590")])),
        ];
        let record = pool_record(&pool, shards);
        let view = view_of(&record);
        let counted = port_states_of(record);
        let states = |v: &PoolView| {
            v.copies()
                .map(|(copy, r)| (copy, r.state.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(states(&counted), states(&view));
        assert_eq!(counted.copies().count(), 3);
        assert_eq!((counted.held(), view.held()), (5, 5));
        assert_eq!((counted.reuse, counted.shards), (view.reuse, view.shards));
        assert_eq!(view.holders(), 3);
        assert_eq!(counted.holders(), 0);
    }
}

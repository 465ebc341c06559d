//! Every pool counted from its shards once per [`REFRESH`](crate::k8s::process::metrics::REFRESH): one read
//! that feeds the pool gauges of `/metrics` and the usage summary on each PortPool's status
//! (`kubectl get portpools`: Allocated, Free, Largest Free Run, Counted).
//!
//! The summary is written by the watcher alone, never by an allocation (the PortPool is no hot
//! object: allocations write only shards): when a figure changes, at most once per count, and
//! again every [`HEARTBEAT`] while none does, so that `countedAt` says whether a watcher still
//! counts. Each write is a compare-and-swap on the pool as listed: a pool changed meanwhile
//! (its spec, or another watcher's count) is counted again at the next refresh.
//!
//! The same write keeps the pool's `Overlap` condition: present (True) while the pool shares
//! ports with another pool of its protocol (written before the admission policy, or with it
//! absent), naming the other pool and the ports.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::api::{PortPool, PortPoolStatus, PortPoolUsage};
use crate::core::Band;
use crate::k8s::error::KubeError;
use crate::k8s::record::{PoolView, pool_port_states};
use crate::k8s::resources::POOL_STATUS;
use crate::ledger::{SharedPorts, all_overlaps};

/// The condition type a pool carries while it shares ports with another pool.
pub const CONDITION_OVERLAP: &str = "Overlap";

/// How often an unchanged summary is written again, to say it is still being counted.
pub const HEARTBEAT: Duration = Duration::from_secs(300);

/// One pool as read for this count.
pub struct CountedPool {
    pub pool: PortPool,
    pub view: PoolView,
}

/// Every pool that could be read, and how many could not (shards unreadable, spec unusable);
/// and which pools listed share ports.
pub struct Count {
    pub pools: Vec<CountedPool>,
    pub unreadable: u64,
    pub overlaps: Vec<SharedPorts>,
}

/// List the pools and read each one's shards (one LIST per pool).
pub async fn count_pools(client: &Client) -> Result<Count, kube::Error> {
    let listed = Api::<PortPool>::all(client.clone())
        .list(&Default::default())
        .await?;
    let mut count = Count {
        pools: Vec::with_capacity(listed.items.len()),
        unreadable: 0,
        overlaps: all_overlaps(&listed.items),
    };
    for pool in listed.items {
        match pool_port_states(client, pool.clone()).await {
            Ok(Ok(view)) => count.pools.push(CountedPool { pool, view }),
            Ok(Err(error)) => {
                tracing::debug!("counting PortPool {}: {error}", pool.name_any());
                count.unreadable += 1;
            }
            Err(error) => {
                tracing::debug!("counting PortPool {}: {error}", pool.name_any());
                count.unreadable += 1;
            }
        }
    }
    Ok(count)
}

/// The usage summary of one pool: its ports as a whole, both bands, every copy (`nodeReuse`):
/// ports held in any copy, free in the copies new holders may use, and the largest free run of
/// any of those. The one place that says what the summary holds.
pub fn usage_of(view: &PoolView, counted_at: Time) -> PortPoolUsage {
    let figure = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let largest_free_run = view
        .usable()
        .flat_map(|record| {
            [Band::Static, Band::Dynamic].map(|band| record.state.largest_free_run(band))
        })
        .max()
        .unwrap_or(0);
    PortPoolUsage {
        allocated: figure(view.held()),
        free: figure(view.usable().map(|r| r.state.free_count()).sum()),
        largest_free_run: figure(largest_free_run),
        counted_at,
    }
}

/// The pool's conditions with `Overlap` as `overlaps` (those of this pool) say: True, naming
/// each other pool and the ports, or absent. Its transition time is kept while it stays True.
pub fn conditions_with_overlap(
    pool: &PortPool,
    overlaps: &[&SharedPorts],
    now: Timestamp,
) -> Vec<Condition> {
    let current = pool.status.as_ref().map(|s| s.conditions.as_slice());
    let mut conditions: Vec<Condition> = current
        .unwrap_or_default()
        .iter()
        .filter(|c| c.type_ != CONDITION_OVERLAP)
        .cloned()
        .collect();
    if overlaps.is_empty() {
        return conditions;
    }
    let message = overlaps
        .iter()
        .map(|o| {
            format!(
                "shares {} {} with PortPool {}",
                o.protocol,
                o.ports(),
                o.other
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let since = current
        .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_OVERLAP))
        .filter(|c| c.status == "True")
        .map_or(Time(now), |c| c.last_transition_time.clone());
    conditions.push(Condition {
        type_: CONDITION_OVERLAP.to_string(),
        status: "True".to_string(),
        reason: "SharesPorts".to_string(),
        message,
        last_transition_time: since,
        observed_generation: pool.metadata.generation,
    });
    conditions
}

/// The status to write for a pool counted at `now`, or `None` when what it has will do: the
/// same size, figures and conditions, counted less than [`HEARTBEAT`] ago. `overlaps` are
/// this pool's.
pub fn status_to_write(
    counted: &CountedPool,
    overlaps: &[&SharedPorts],
    now: Timestamp,
) -> Option<PortPoolStatus> {
    let usage = usage_of(&counted.view, Time(now));
    let size = i32::try_from(counted.view.record.state.size()).unwrap_or(i32::MAX);
    let current = counted.pool.status.clone().unwrap_or_default();
    let conditions = conditions_with_overlap(&counted.pool, overlaps, now);
    let fresh = current.usage.as_ref().is_some_and(|was| {
        let same = PortPoolUsage {
            counted_at: was.counted_at.clone(),
            ..usage.clone()
        } == *was;
        let age = now.as_second().saturating_sub(was.counted_at.0.as_second());
        same && age < HEARTBEAT.as_secs() as i64
    });
    (!fresh || current.size != size || current.conditions != conditions).then_some(PortPoolStatus {
        size,
        usage: Some(usage),
        conditions,
        // The node count is kept apart (`node_count`): carried as listed.
        ..current
    })
}

/// Write the summary of every counted pool that needs it. A conflict (the pool changed since
/// it was listed) waits for the next count; other failures are logged.
pub async fn keep_usage(client: &Client, count: &Count) {
    let api: Api<PortPool> = Api::all(client.clone());
    let now = Timestamp::now();
    for counted in &count.pools {
        let name = counted.pool.name_any();
        let overlaps: Vec<&SharedPorts> =
            count.overlaps.iter().filter(|o| o.pool == name).collect();
        let Some(status) = status_to_write(counted, &overlaps, now) else {
            continue;
        };
        // A fresh object, so apiVersion and kind are set; the resourceVersion as listed.
        let mut pool = PortPool::new(&name, counted.pool.spec.clone());
        pool.metadata.resource_version = counted.pool.resource_version();
        pool.status = Some(status);
        match api
            .replace_status(&name, &crate::k8s::client::write_params(), &pool)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => {
                tracing::debug!("PortPool {name} changed since it was counted: counted again");
            }
            Err(e) => {
                let target = POOL_STATUS.on("update", &name, None);
                let error = KubeError::from_kube(e, target);
                tracing::warn!("keeping the usage of PortPool {name}: {error}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::fixtures::{holders, pool_of, whole_record};

    /// Pool `p`, 30000-30099 less 30090-30099 (90 ports, no static band), holding 30010-30013
    /// and 30050, as listed with `status`.
    fn counted(status: Option<PortPoolStatus>) -> CountedPool {
        let mut pool = pool_of(&["30000-30099"], &["30090-30099"]);
        let record = whole_record(
            &pool,
            holders(&[
                ("a", "web.http=30010,30011,30012,30013"),
                ("b", "web.http=30050"),
            ]),
        );
        pool.status = status;
        let view = PoolView {
            record,
            reused: vec![],
            reuse: 1,
            nodes: None,
            shards: 1,
            warnings: vec![],
        };
        CountedPool { pool, view }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    #[test]
    fn the_usage_is_of_the_pool_as_a_whole() {
        let usage = usage_of(&counted(None).view, Time(at(0)));
        assert_eq!(usage.allocated, 5);
        assert_eq!(usage.free, 85);
        // 30051-30089: 39 ports, longer than 30014-30049 (36) and 30000-30009 (10).
        assert_eq!(usage.largest_free_run, 39);
        assert_eq!(usage.counted_at, Time(at(0)));
    }

    #[test]
    fn with_node_reuse_every_usable_copy_counts() {
        let CountedPool { pool, mut view } = counted(None);
        view.reuse = 2;
        let second = whole_record(&pool, holders(&[("c", "web.http=30050")]));
        view.reused = vec![(1, second)];
        let usage = usage_of(&view, Time(at(0)));
        assert_eq!(usage.allocated, 6, "5 in copy 0, 1 in copy 1");
        assert_eq!(usage.free, 85 + 89);
        // Copy 1's 30000-30049 is the longest run of any copy.
        assert_eq!(usage.largest_free_run, 50);
        // A copy past nodeReuse still holds its ports but has nothing free to give.
        view.reuse = 1;
        let usage = usage_of(&view, Time(at(0)));
        assert_eq!(
            (usage.allocated, usage.free, usage.largest_free_run),
            (6, 85, 39)
        );
    }

    #[test]
    fn the_status_is_written_when_a_figure_changes_or_the_count_grows_old() {
        // Never counted, and never sized (a pool applied with kubectl): both are written.
        let written = status_to_write(&counted(None), &[], at(0)).expect("a first count");
        assert_eq!(written.size, 90);
        let usage = written.usage.clone().unwrap();
        assert_eq!((usage.allocated, usage.free), (5, 85));

        // The same figures, counted 10 s or 299 s ago: nothing to write.
        for later in [10, HEARTBEAT.as_secs() as i64 - 1] {
            assert_eq!(
                status_to_write(&counted(Some(written.clone())), &[], at(later)),
                None
            );
        }
        // Unchanged for HEARTBEAT: written again, to say a watcher still counts.
        let again = status_to_write(&counted(Some(written.clone())), &[], at(300)).unwrap();
        assert_eq!(again.usage.unwrap().counted_at, Time(at(300)));

        // A figure changed since: written at once.
        let mut stale = written.clone();
        stale.usage.as_mut().unwrap().allocated = 4;
        let fixed = status_to_write(&counted(Some(stale)), &[], at(10)).unwrap();
        assert_eq!(fixed.usage.unwrap().allocated, 5);

        // A size that does not match the spec: written too.
        let mut missized = written;
        missized.size = 100;
        assert_eq!(
            status_to_write(&counted(Some(missized)), &[], at(10)).map(|s| s.size),
            Some(90)
        );
    }

    #[test]
    fn the_overlap_condition_names_the_other_pool_and_goes_when_the_overlap_does() {
        let shared = SharedPorts {
            pool: "p".into(),
            other: "q".into(),
            protocol: crate::api::Protocol::Tcp,
            shared: "30005-30009".parse().unwrap(),
        };
        let first = status_to_write(&counted(None), &[&shared], at(0)).unwrap();
        let condition = &first.conditions[0];
        assert_eq!(
            (condition.type_.as_str(), condition.status.as_str()),
            ("Overlap", "True")
        );
        assert_eq!(
            condition.message,
            "shares TCP ports 30005-30009 with PortPool q"
        );
        // Still there 10 s later: nothing to write, the transition time kept.
        assert_eq!(
            status_to_write(&counted(Some(first.clone())), &[&shared], at(10)),
            None
        );
        // Another pool too: written at once, still True since 0.
        let more = SharedPorts {
            other: "r".into(),
            shared: "30050".parse().unwrap(),
            ..shared.clone()
        };
        let both =
            status_to_write(&counted(Some(first.clone())), &[&shared, &more], at(10)).unwrap();
        assert_eq!(
            both.conditions[0].message,
            "shares TCP ports 30005-30009 with PortPool q; shares TCP port 30050 with PortPool r"
        );
        assert_eq!(both.conditions[0].last_transition_time, Time(at(0)));
        // Resolved: the condition goes, at once.
        let resolved = status_to_write(&counted(Some(both)), &[], at(20)).unwrap();
        assert!(resolved.conditions.is_empty(), "{resolved:?}");
    }
}

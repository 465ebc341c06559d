//! Placement in a pool that follows its nodes: the copies a holder gets, and the refusal
//! past them, through the same `place` and batch the allocator uses.

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::api::{FollowNodes, PortAllocation, PortPool};
use crate::core::Holdings;
use crate::ledger::fixtures::{allocation, pool_of};
use crate::ledger::{
    BatchItem, ItemOutcome, Operation, Pass, PoolRecord, PoolSnapshot, Refusal, decide_pool_batch,
    owner_of,
};

fn following(ranges: &[&str]) -> PortPool {
    let mut pool = pool_of(ranges, &[]);
    pool.spec.follow_nodes = Some(FollowNodes::default());
    pool
}

fn record(pool: &PortPool, nodes: Option<NodeCount>) -> PoolRecord {
    let mut snapshot = PoolSnapshot::of_pool(pool);
    snapshot.nodes = nodes;
    PoolRecord::load(snapshot, Vec::new()).unwrap()
}

fn item(pa: &PortAllocation) -> BatchItem {
    BatchItem {
        uid: pa.metadata.uid.clone().unwrap(),
        owner: owner_of(pa),
        operation: Operation::sync_of(pa),
        known: Default::default(),
    }
}

/// The copy each item went to, or its refusal.
fn placed(record: &PoolRecord, pas: &[PortAllocation]) -> Vec<Result<u16, Refusal>> {
    let items: Vec<BatchItem> = pas.iter().map(item).collect();
    let mut rng = StdRng::seed_from_u64(7);
    let batch = decide_pool_batch(record, &items, Pass::Anywhere, false, &mut rng);
    batch
        .outcomes
        .into_iter()
        .zip(batch.shards)
        .map(|(outcome, shards)| match outcome.expect("decided") {
            ItemOutcome::Refused { refusal, .. } => Err(refusal),
            _ => Ok(shards.first().expect("placed somewhere").copy),
        })
        .collect()
}

#[test]
fn ports_per_pod_count_role_scoped_ports_in_every_pod_and_blocks_whole() {
    let holdings = |text: &str| Holdings::decode(text).unwrap();
    // Pod 1 holds its http port and the role's admin port (index 0 only).
    assert_eq!(
        holdings("web.http=100,101,102 web.admin=200").ports_per_pod(),
        2
    );
    // A block counts every port; another role's pods are counted apart.
    assert_eq!(
        holdings("web.blk=100-103,104-107 web.x=200 db.y=300").ports_per_pod(),
        5
    );
    // Groups are roles of their own.
    assert_eq!(holdings("web.http=100 1-web.http=101").ports_per_pod(), 1);
    assert_eq!(Holdings::new().ports_per_pod(), 0);

    let mut pa = allocation("a", 3, None);
    pa.spec.roles[0].ports.push(crate::api::PortRequest {
        name: "admin".into(),
        scope: crate::api::PortScope::RoleScoped,
        env: "ADMIN_PORT".into(),
        count: Some(4),
        ..Default::default()
    });
    assert_eq!(Operation::sync_of(&pa).unwrap().ports_per_pod(), 5);
    assert_eq!(Operation::Remove.ports_per_pod(), 0);
}

#[test]
fn copies_follow_the_nodes_up_to_the_bound_and_the_refusal_names_it() {
    // 4 ports; each owner has 4 pods of 1 port and fills a copy.
    let pool = following(&["100-103"]);
    let owners: Vec<PortAllocation> = ["a", "b", "c", "d"]
        .iter()
        .map(|name| allocation(name, 4, None))
        .collect();

    // 3 nodes: 1 port x 2 other holders < 3, so copies 0-2; copy 3 would reach 3.
    let three = record(&pool, Some(NodeCount::Counted(3)));
    let result = placed(&three, &owners);
    assert_eq!(result[..3], [Ok(0), Ok(1), Ok(2)]);
    let refusal = result[3].clone().unwrap_err();
    assert_eq!(refusal.reason(), crate::ledger::Reason::PoolFull);
    assert!(
        refusal.to_string().contains(
            "copy 3 refused: pods of 1 port with 3 other holders per port could be kept off 3 \
             of the pool's 3 nodes"
        ),
        "{refusal}"
    );

    // Two more nodes: the fourth owner fits in copy 3.
    let five = record(&pool, Some(NodeCount::Counted(5)));
    assert_eq!(placed(&five, &owners), vec![Ok(0), Ok(1), Ok(2), Ok(3)]);

    // Never counted: copy 0 only, and why.
    let unknown = record(&pool, Some(NodeCount::Unknown("no watcher".into())));
    let result = placed(&unknown, &owners[..2]);
    assert_eq!(result[0], Ok(0));
    let refusal = result[1].clone().unwrap_err();
    assert!(
        refusal
            .to_string()
            .contains("they are not counted (no watcher)"),
        "{refusal}"
    );
    // A snapshot with no count at all (a pool read before the watcher's first count).
    let never = record(&pool, None);
    assert!(placed(&never, &owners[..2])[1].is_err());
}

#[test]
fn a_fixed_reuse_places_as_before() {
    let pool = crate::ledger::fixtures::pool_reused(&["100-103"], 2);
    let owners: Vec<PortAllocation> = ["a", "b", "c"]
        .iter()
        .map(|name| allocation(name, 4, None))
        .collect();
    let result = placed(&record(&pool, None), &owners);
    assert_eq!(result[..2], [Ok(0), Ok(1)]);
    let refusal = result[2].clone().unwrap_err();
    assert!(
        refusal
            .to_string()
            .contains("each of the pool's 1 other copies, nodeReuse 2, refused too"),
        "{refusal}"
    );
}

#[test]
fn a_large_holder_bounds_the_copies_of_every_later_one() {
    // 8 ports, 6 nodes. `big` has pods of 4 ports (one PodScoped block of 4, one pod); small
    // owners have 1-port pods. With big in copy 0, copy 1 needs 4 x 1 < 6: allowed; copy 2
    // needs 4 x 2 < 6: refused, though the small owner's own pods would allow it.
    let pool = following(&["100-107"]);
    let mut big = allocation("big", 1, None);
    big.spec.roles[0].ports[0].count = Some(4);
    let fill = allocation("fill", 4, None);
    let small: Vec<PortAllocation> = ["s1", "s2"]
        .iter()
        .map(|name| allocation(name, 8, None))
        .collect();
    let six = record(&pool, Some(NodeCount::Counted(6)));
    let result = placed(&six, &[big, fill, small[0].clone(), small[1].clone()]);
    assert_eq!(result[..3], [Ok(0), Ok(0), Ok(1)]);
    let refusal = result[3].clone().unwrap_err();
    assert!(
        refusal.to_string().contains(
            "copy 2 refused: pods of 4 ports (the pool's largest; this holder's have 1) with 2 \
             other holders per port could be kept off 6 of the pool's 6 nodes (4 x 2 = 8)"
        ),
        "{refusal}"
    );
}

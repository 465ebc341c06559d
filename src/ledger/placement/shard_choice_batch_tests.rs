//! Group commit to the last port: one batch of one-port owners filling a pool exactly, decided
//! as `sync --all` decides it (pass 1 within each owner's home, its writes committed, then
//! pass 2 for the owners whose home was full), writes each shard at most once per pass.

use std::collections::BTreeSet;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::ledger::fixtures::{allocation, pool_of, sharded};
use crate::ledger::record::shard_record::new_shard;
use crate::ledger::{Operation, known_shards, owner_of};

/// `writes` as the API server would return them: each shard at a new version.
fn commit(record: &mut PoolRecord, writes: &[ShardWrite], version: &mut u64) {
    for write in writes {
        let mut shard = new_shard(&record.pool, write.key);
        *version += 1;
        shard.metadata.resource_version = Some(format!("w{version}"));
        shard.status = Some(write.status.clone());
        record.replace(shard);
    }
}

/// One-port owners spread over 50 namespaces, as a GitOps repository of many teams applies them.
fn owners(count: usize, record: &PoolRecord) -> Vec<BatchItem> {
    (0..count)
        .map(|i| {
            let mut pa = allocation(&format!("job-{i:05}"), 1, None);
            pa.metadata.namespace = Some(format!("team-{:02}", i % 50));
            let owner = owner_of(&pa);
            BatchItem {
                uid: format!("job-{i:05}"),
                known: known_shards(None, &record.layout, &owner),
                owner,
                operation: Operation::sync_of(&pa),
            }
        })
        .collect()
}

#[test]
fn filling_a_pool_to_its_last_port_writes_each_shard_at_most_once_per_pass() {
    // 16 windows of 256 ports, every one of them asked for.
    let pool = pool_of(&["20000-24095"], &[]);
    let mut record = sharded(&pool, vec![]);
    let windows = record.first().layout.shards().len();
    let items = owners(4096, &record);
    let mut rng = StdRng::seed_from_u64(34);
    let mut version = 0;

    let first = decide_pool_batch(&record, &items, Pass::WithinKnown, true, &mut rng);
    assert!(
        first.writes.len() <= windows,
        "pass 1: {} writes",
        first.writes.len()
    );
    commit(&mut record, &first.writes, &mut version);
    let left: Vec<BatchItem> = items
        .iter()
        .zip(&first.outcomes)
        .filter(|(_, outcome)| outcome.is_none())
        .map(|(item, _)| item.clone())
        .collect();
    // Homes are uneven (hashing 4,096 owners onto 16 windows): some overflow, and those owners
    // are what pass 2 is for.
    assert!(
        !left.is_empty(),
        "no home overflowed: the test does not reach pass 2"
    );

    // The widenings are told as each owner is decided (the caller writes them meanwhile):
    // the same ones, in the same order, as the batch lists at the end.
    let mut told = Vec::new();
    let second = decide_pool_batch_telling(
        &record,
        &left,
        (Pass::Anywhere, &[]),
        false,
        &mut rng,
        |n, shards| told.push((n, shards.clone())),
    );
    assert_eq!(told, second.widen);
    assert!(
        second.writes.len() <= windows,
        "pass 2: {} writes",
        second.writes.len()
    );
    assert_eq!(
        second.widen.len(),
        left.len(),
        "each moved owner's status widens first"
    );
    commit(&mut record, &second.writes, &mut version);

    let outcomes = first
        .outcomes
        .iter()
        .flatten()
        .chain(second.outcomes.iter().flatten());
    let mut held = BTreeSet::new();
    for outcome in outcomes {
        let ItemOutcome::Changed { holdings, .. } = outcome else {
            panic!("every owner gets its port while one is free: {outcome:?}");
        };
        for port in holdings.ports() {
            assert!(held.insert(port), "port {port} given twice");
        }
    }
    assert_eq!(held.len(), 4096, "every port held once");
    assert_eq!(record.first().union_record().state.free_count(), 0);
}

#[test]
fn owners_known_by_their_home_are_named_there_instead_of_widened() {
    let pool = pool_of(&["20000-24095"], &[]);
    let mut record = sharded(&pool, vec![]);
    let windows = record.first().layout.shards().len();
    let items = owners(4096, &record);
    let mut rng = StdRng::seed_from_u64(34);
    let mut version = 0;
    let first = decide_pool_batch(&record, &items, Pass::WithinKnown, true, &mut rng);
    commit(&mut record, &first.writes, &mut version);
    let left: Vec<BatchItem> = items
        .iter()
        .zip(&first.outcomes)
        .filter(|(_, outcome)| outcome.is_none())
        .map(|(item, _)| item.clone())
        .collect();
    assert!(!left.is_empty(), "the test does not reach pass 2");
    let homes: Vec<Option<ShardKey>> = left.iter().map(|i| i.known.first().copied()).collect();

    let mut told = 0;
    let second = decide_pool_batch_telling(
        &record,
        &left,
        (Pass::Anywhere, &homes),
        false,
        &mut rng,
        |_, _| told += 1,
    );
    assert_eq!((told, second.widen.len()), (0, 0), "no status is widened");
    assert_eq!(second.marked.len(), left.len(), "each moved owner is named");
    assert!(
        second.writes.len() <= windows,
        "{} writes",
        second.writes.len()
    );
    for &(n, home) in &second.marked {
        let item = &left[n];
        assert_eq!(Some(&home), item.known.first());
        let write = second
            .writes
            .iter()
            .find(|w| w.key == home)
            .expect("the home shard is written with the name");
        assert!(
            write
                .status
                .elsewhere
                .iter()
                .any(|e| e.uid == item.uid && e.owner == item.owner),
            "{} not named in {home:?}",
            item.owner
        );
        let placed = second.shards[n].iter().all(|&k| k != home);
        assert!(placed, "{} was moved out of its full home", item.owner);
    }
    // Every other holder of a home shard written so keeps its entry.
    commit(&mut record, &second.writes, &mut version);
    let held = record.first().union_record().state.held_count();
    assert_eq!(held, 4096);
    let (n, home) = second.marked[0];
    assert!(record.places_elsewhere(home, &left[n].uid));
}

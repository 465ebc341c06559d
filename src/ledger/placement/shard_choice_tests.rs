use std::collections::BTreeSet;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::api::{PortAllocation, SpecError};
use crate::ledger::fixtures::{allocation, holder, holders, pool_of, shard_of, sharded};
use crate::ledger::{Reason, ShardKey, WindowLayout, home_shard, owner_of};

/// One-window pool 100-105 (window 0), as most batch tests need one shard.
fn small(pairs: &[(&str, &str)]) -> PoolRecord {
    let pool = pool_of(&["100-105"], &[]);
    sharded(&pool, vec![shard_of(&pool, 0, holders(pairs))])
}

/// An item whose known shards are its home (no status yet) in `layout`.
fn item_in(layout: &WindowLayout, pa: &PortAllocation) -> BatchItem {
    let owner = owner_of(pa);
    BatchItem {
        uid: pa.metadata.uid.clone().unwrap(),
        known: home_shard(layout, &owner)
            .map(ShardKey::first)
            .into_iter()
            .collect(),
        owner,
        operation: Operation::sync_of(pa),
    }
}

fn sync(record: &PoolRecord, name: &str, replicas: i32) -> BatchItem {
    item_in(&record.layout, &allocation(name, replicas, None))
}

fn op(record: &PoolRecord, uid: &str, operation: Operation) -> BatchItem {
    BatchItem {
        uid: uid.into(),
        owner: format!("ns/{uid}"),
        operation: Ok(operation),
        known: home_shard(&record.layout, &format!("ns/{uid}"))
            .map(ShardKey::first)
            .into_iter()
            .collect(),
    }
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(11)
}

fn all_held(batch: &PoolBatch) -> Vec<u16> {
    let mut ports: Vec<u16> = batch
        .writes
        .iter()
        .flat_map(|w| &w.status.holders)
        .flat_map(|h| {
            crate::core::Holdings::decode(&h.ports)
                .unwrap()
                .ports()
                .collect::<Vec<_>>()
        })
        .collect();
    ports.sort_unstable();
    ports
}

fn decided(batch: &PoolBatch) -> Vec<&ItemOutcome> {
    batch.outcomes.iter().map(|o| o.as_ref().unwrap()).collect()
}

#[test]
fn refusals_are_per_item_and_do_not_block_the_others() {
    // 100-105: x holds 100. a takes 2, b asks for 100 (held), c is invalid, d wants 4 (only 3
    // left after a), e takes 1, f takes the last 2: the pool ends full.
    let record = small(&[("x", "web.http=100")]);
    let invalid = BatchItem {
        operation: Err(Refusal::Spec {
            owner: "ns/c".into(),
            error: SpecError {
                field: "spec.roles".into(),
                message: "no roles".into(),
            },
        }),
        ..op(&record, "c", Operation::Remove)
    };
    let items = vec![
        sync(&record, "a", 2),
        item_in(&record.layout, &allocation("b", 1, Some(100))),
        invalid,
        sync(&record, "d", 4),
        sync(&record, "e", 1),
        sync(&record, "f", 2),
    ];
    let batch = decide_pool_batch(&record, &items, Pass::Anywhere, false, &mut rng());
    let reasons: Vec<Option<Reason>> = decided(&batch)
        .iter()
        .map(|o| match o {
            ItemOutcome::Refused { refusal, .. } => Some(refusal.reason()),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        vec![
            None,
            Some(Reason::PortHeld),
            Some(Reason::InvalidSpec),
            Some(Reason::PoolFull),
            None,
            None
        ]
    );
    let ItemOutcome::Refused { refusal, .. } = decided(&batch)[1] else {
        unreachable!()
    };
    assert!(refusal.to_string().contains("held by ns/x"), "{refusal}");
    assert_eq!(batch.writes.len(), 1, "one write for the one shard");
    assert_eq!(all_held(&batch), vec![100, 101, 102, 103, 104, 105]);
    let status = &batch.writes[0].status;
    let uids: Vec<&str> = status.holders.iter().map(|h| h.uid.as_str()).collect();
    assert_eq!(uids, vec!["a", "e", "f", "x"]);
    assert_eq!(
        (status.allocated, status.available, status.holder_count),
        (6, 0, 4)
    );
    assert_eq!(batch.writes[0].resource_version.as_deref(), Some("rv0"));
    assert!(batch.widen.is_empty());
}

#[test]
fn a_batch_equals_its_items_one_after_another() {
    let pool = pool_of(&["200-299"], &[]);
    let start = sharded(
        &pool,
        vec![shard_of(
            &pool,
            0,
            holders(&[("k", "web.http=200,201,202"), ("r", "web.http=210")]),
        )],
    );
    let items = vec![
        sync(&start, "a", 5),
        sync(&start, "k", 1),
        op(&start, "r", Operation::Remove),
        sync(&start, "b", 3),
        item_in(&start.layout, &allocation("c", 1, Some(201))),
        op(&start, "k", Operation::Release { role: None }),
        sync(&start, "a", 7),
    ];
    let batch = decide_pool_batch(&start, &items, Pass::Anywhere, false, &mut rng());

    // Each item's outcome is what deciding it alone, after the items before it, gives: the
    // same counts (placement is random, so the ports themselves may differ), the same refusal.
    let mut one_by_one = start;
    let mut rng = rng();
    for (item, outcome) in items.iter().zip(decided(&batch)) {
        let record = one_by_one.first().shard_record(0);
        let operation = item.operation.as_ref().unwrap();
        match (
            decide(&record, &item.uid, &item.owner, operation, &mut rng),
            outcome,
        ) {
            (
                Ok(Decision::Write {
                    allocated,
                    released,
                    holdings: alone,
                }),
                ItemOutcome::Changed {
                    holdings,
                    allocated: a,
                    released: r,
                },
            ) => {
                assert_eq!((allocated, released), (*a, *r), "{}", item.owner);
                assert_eq!(alone.port_count(), holdings.port_count());
                one_by_one.copy_mut(0).set(&item.uid, &item.owner, holdings);
            }
            (Ok(Decision::Unchanged(holdings)), outcome) => {
                assert_eq!(*outcome, ItemOutcome::Unchanged(holdings))
            }
            (Err(refusal), outcome) => assert!(
                matches!(outcome, ItemOutcome::Refused { refusal: r, .. } if *r == refusal),
                "{}: {outcome:?}",
                item.owner
            ),
            (alone, outcome) => panic!("{}: {alone:?} alone, {outcome:?} in the batch", item.owner),
        }
    }
    // k's scale-down to one pod freed 201 before c asked for it: later items see earlier ones.
    assert!(matches!(
        decided(&batch)[4],
        ItemOutcome::Changed { allocated: 1, .. }
    ));
    assert!(matches!(
        decided(&batch)[2],
        ItemOutcome::Changed { released: 1, .. }
    ));
    assert_eq!(batch.writes, one_by_one.writes(false));
}

#[test]
fn deciding_the_written_batch_again_changes_nothing() {
    let pool = pool_of(&["300-399"], &[]);
    let start = sharded(
        &pool,
        vec![shard_of(&pool, 1, vec![holder("x", "web.http=300")])],
    );
    let items = vec![
        sync(&start, "a", 3),
        sync(&start, "b", 64),
        sync(&start, "x", 1),
        sync(&start, "c", 1),
    ];
    let first = decide_pool_batch(&start, &items, Pass::Anywhere, false, &mut rng());
    let mut written = start.clone();
    for (item, outcome) in items.iter().zip(decided(&first)) {
        written
            .copy_mut(0)
            .set(&item.uid, &item.owner, outcome.holdings());
    }
    let reread = PoolRecord::load(
        written.pool.clone(),
        written
            .writes(false)
            .into_iter()
            .map(|w| {
                let mut shard = shard_of(&pool, w.key.window, vec![]);
                shard.status = Some(w.status);
                shard
            })
            .collect(),
    )
    .unwrap();
    let again = decide_pool_batch(&reread, &items, Pass::Anywhere, false, &mut rng());
    assert!(again.writes.is_empty());
    for (before, after) in decided(&first).iter().zip(decided(&again)) {
        assert!(matches!(after, ItemOutcome::Unchanged(_)), "{after:?}");
        assert_eq!(before.holdings(), after.holdings());
    }
    assert_eq!(all_held(&first).len(), 1 + 3 + 64 + 1);
}

#[test]
fn nothing_to_do_writes_nothing_and_others_text_is_kept_verbatim() {
    // Decodable but not in our encoding, and an undecodable entry: both kept byte for byte.
    let theirs = "web.b=403 web.a=404";
    let pool = pool_of(&["400-409"], &[]);
    let record = sharded(
        &pool,
        vec![shard_of(
            &pool,
            1,
            holders(&[("d", theirs), ("o", "???"), ("a", "web.http=400")]),
        )],
    );
    let idle = decide_pool_batch(
        &record,
        &[sync(&record, "a", 1)],
        Pass::Anywhere,
        false,
        &mut rng(),
    );
    assert!(idle.writes.is_empty());
    let batch = decide_pool_batch(
        &record,
        &[
            sync(&record, "n", 1),
            op(&record, "gone", Operation::Remove),
        ],
        Pass::Anywhere,
        false,
        &mut rng(),
    );
    let status = &batch.writes[0].status;
    let text = |uid: &str| {
        status
            .holders
            .iter()
            .find(|h| h.uid == uid)
            .map(|h| h.ports.clone())
    };
    assert_eq!(text("d").as_deref(), Some(theirs));
    assert_eq!(text("o").as_deref(), Some("???"));
    assert_eq!(status.holder_count, 4);
    // Removing the undecodable owner drops its text too.
    let removed = decide_pool_batch(
        &record,
        &[op(&record, "o", Operation::Remove)],
        Pass::Anywhere,
        false,
        &mut rng(),
    );
    assert!(
        removed.writes[0]
            .status
            .holders
            .iter()
            .all(|h| h.uid != "o")
    );
}

/// Pool 30000-30767 (windows 117-120): 208 + 256 + 256 + 48 ports.
fn four_windows() -> PoolRecord {
    sharded(&pool_of(&["30000-30767"], &[]), vec![])
}

#[test]
fn owners_that_fit_their_home_stay_there_and_the_first_pass_leaves_the_rest() {
    let record = four_windows();
    let pas: Vec<PortAllocation> = (0..40)
        .map(|i| allocation(&format!("a{i}"), 2, None))
        .collect();
    let items: Vec<BatchItem> = pas.iter().map(|pa| item_in(&record.layout, pa)).collect();
    let batch = decide_pool_batch(&record, &items, Pass::WithinKnown, false, &mut rng());
    for (item, (outcome, shards)) in items.iter().zip(batch.outcomes.iter().zip(&batch.shards)) {
        assert!(matches!(outcome, Some(ItemOutcome::Changed { .. })));
        assert_eq!(shards, &item.known, "{} stays home", item.owner);
    }
    assert!(batch.widen.is_empty());
    // Only new shards are written: created with the pool's spec, one write each.
    let touched: BTreeSet<u16> = items
        .iter()
        .flat_map(|i| i.known.iter().map(|k| k.window))
        .collect();
    let written: BTreeSet<u16> = batch.writes.iter().map(|w| w.key.window).collect();
    assert_eq!(written, touched);
    assert!(batch.writes.iter().all(|w| w.resource_version.is_none()));
    assert!(batch.writes.iter().all(|w| w.status.pool_spec.is_some()));

    // A home too small (window 120 has 48 ports): the first pass leaves the owner, the second
    // puts it elsewhere and asks for its status to name the new shard first.
    let big = (0..)
        .map(|i| allocation(&format!("big{i}"), 100, None))
        .find(|pa| home_shard(&record.layout, &owner_of(pa)) == Some(120))
        .unwrap();
    let item = item_in(&record.layout, &big);
    let first = decide_pool_batch(
        &record,
        std::slice::from_ref(&item),
        Pass::WithinKnown,
        false,
        &mut rng(),
    );
    assert_eq!(first.outcomes, vec![None]);
    assert!(first.writes.is_empty());
    let placed = place(&record, &item, &mut rng());
    assert!(matches!(
        placed.outcome,
        ItemOutcome::Changed { allocated: 100, .. }
    ));
    let [index] = placed.shards.iter().copied().collect::<Vec<_>>()[..] else {
        panic!(
            "100 ports fit one 256-port window whole: {:?}",
            placed.shards
        );
    };
    assert_ne!(index, ShardKey::first(120));
    assert_eq!(placed.widen, Some([index, ShardKey::first(120)].into()));
}

#[test]
fn a_full_pool_is_filled_to_the_last_port_by_one_batch_without_a_refusal() {
    // 1,000 ports over 5 windows (30000-30999), 1,000 one-port owners: homes overflow (a hash
    // spreads them unevenly) and the overflow goes wherever ports are left.
    let record = sharded(&pool_of(&["30000-30999"], &[]), vec![]);
    let items: Vec<BatchItem> = (0..1000)
        .map(|i| sync(&record, &format!("o{i}"), 1))
        .collect();
    let first = decide_pool_batch(&record, &items, Pass::WithinKnown, false, &mut rng());
    let left = first.outcomes.iter().filter(|o| o.is_none()).count();
    assert!(left > 0, "some homes overflow");
    // Pass 2 decides the rest against the shards as pass 1 left them.
    let mut after = record.clone();
    let mut rest = Vec::new();
    for (item, outcome) in items.iter().zip(&first.outcomes) {
        match outcome {
            Some(ItemOutcome::Changed { holdings, .. }) => {
                after.copy_mut(0).set(&item.uid, &item.owner, holdings)
            }
            Some(other) => panic!("{}: {other:?}", item.owner),
            None => rest.push(item.clone()),
        }
    }
    let all = decide_pool_batch(&after, &rest, Pass::Anywhere, false, &mut rng());
    assert!(
        decided(&all)
            .iter()
            .all(|o| matches!(o, ItemOutcome::Changed { allocated: 1, .. })),
    );
    assert_eq!(
        all.widen.len(),
        left,
        "exactly the overflow widens its status"
    );
    let held = all_held(&all);
    assert_eq!(held.len(), 1000);
    assert_eq!(
        held,
        (30000..=30999).collect::<Vec<u16>>(),
        "every port once"
    );
    // Every write is one shard's: at most its 256 ports, at most 256 entries.
    for write in &all.writes {
        assert!(write.status.holders.len() <= 256);
        assert!(write.status.allocated <= 256);
    }
    let one_more = sync(&record, "late", 1);
    let mut items = items;
    items.push(one_more);
    let over = decide_pool_batch(&record, &items, Pass::Anywhere, false, &mut rng());
    let ItemOutcome::Refused { refusal, .. } = decided(&over)[1000] else {
        panic!("the 1,001st is refused");
    };
    assert_eq!(refusal.reason(), Reason::PoolFull);
    assert!(
        refusal.to_string().contains("it has 1000 ports"),
        "{refusal}"
    );
}

#[test]
fn a_newer_pool_spec_reaches_every_shard_when_propagating() {
    let mut pool = pool_of(&["30000-30767"], &[]);
    let shards = vec![
        shard_of(&pool, 117, vec![holder("a", "web.http=30001")]),
        shard_of(&pool, 118, vec![]),
    ];
    pool.metadata.generation = Some(2);
    pool.spec.exclude = vec!["30300".into()];
    let record = sharded(&pool, shards);
    assert!(
        decide_pool_batch(&record, &[], Pass::Anywhere, false, &mut rng())
            .writes
            .is_empty()
    );
    let writes = decide_pool_batch(&record, &[], Pass::Anywhere, true, &mut rng()).writes;
    assert_eq!(
        writes.iter().map(|w| w.key.window).collect::<Vec<_>>(),
        [117, 118]
    );
    for write in &writes {
        assert_eq!(write.status.pool_generation, 2);
        assert_eq!(write.status.pool_spec.as_ref(), Some(&pool.spec));
    }
    // 118 lost one port to the exclusion; 117's entry is kept byte for byte.
    assert_eq!(writes[1].status.size, 255);
    assert_eq!(
        writes[0].status.holders,
        vec![holder("a", "web.http=30001")]
    );
}

/// An allocation of `replicas` single ports whose home in `record` is window `home`.
fn homed_at(record: &PoolRecord, home: u16, replicas: i32) -> BatchItem {
    let pa = (0..)
        .map(|i| allocation(&format!("h{home}-{i}"), replicas, None))
        .find(|pa| home_shard(&record.layout, &owner_of(pa)) == Some(home))
        .unwrap();
    item_in(&record.layout, &pa)
}

fn ports_of(placed: &Placed) -> Vec<u16> {
    let mut ports: Vec<u16> = placed.outcome.holdings().ports().collect();
    ports.sort_unstable();
    ports
}

#[test]
fn even_windows_fill_upward_and_odd_ones_downward_so_a_pair_keeps_one_free_run() {
    // Windows 118 (30208-30463) and 119 (30464-30719) of four_windows().
    let mut record = four_windows();
    for (home, expected) in [(118, 30208..=30217), (119, 30710..=30719)] {
        let item = homed_at(&record, home, 10);
        let placed = place(&record, &item, &mut rng());
        assert_eq!(ports_of(&placed), expected.collect::<Vec<u16>>());
        record
            .copy_mut(0)
            .set(&item.uid, &item.owner, placed.outcome.holdings());
    }
    // What the two windows leave is one run across their shared edge: a block longer than
    // either window's part still fits (on the whole pool).
    let union = record.first().union_record().state;
    assert_eq!(union.fragmentation().largest(), 512 - 20);
}

#[test]
fn an_owner_its_home_cannot_take_goes_to_the_fullest_window_that_can() {
    // Home 120 has 48 ports, all held; 117 has 8 free, 118 256, 119 56: 50 ports fit 118 and
    // 119 whole, and 119 is the fuller (best fit keeps 118 whole for a larger owner), though
    // 118 comes first in the owner's home order.
    let pool = pool_of(&["30000-30767"], &[]);
    let record = sharded(
        &pool,
        vec![
            shard_of(&pool, 117, vec![holder("x", "f.blk=30000-30199")]),
            shard_of(&pool, 119, vec![holder("y", "f.blk=30464-30663")]),
            shard_of(&pool, 120, vec![holder("z", "f.blk=30720-30767")]),
        ],
    );
    let item = homed_at(&record, 120, 50);
    assert_eq!(
        record.layout.home_order(&item.owner),
        vec![120, 117, 118, 119]
    );
    let placed = place(&record, &item, &mut rng());
    assert_eq!(placed.shards, BTreeSet::from([ShardKey::first(119)]));
    assert_eq!(
        placed.widen,
        Some([ShardKey::first(119), ShardKey::first(120)].into())
    );
    assert_eq!(ports_of(&placed), (30670..=30719).collect::<Vec<u16>>());
}

#[test]
fn a_window_that_would_use_static_ports_is_taken_only_when_no_other_can() {
    // The pool's 24-port static band (KEP-3668 for 768 ports) is 30000-30023, in window 117.
    // 117 is the fullest window, but 10 ports there would take 6 static ones: 118 takes them
    // from its dynamic band instead, even though it is emptier.
    let mut pool = pool_of(&["30000-30767"], &[]);
    pool.spec.static_band = crate::api::StaticBandSetting::Auto;
    let shards = |in_118: &str| {
        vec![
            shard_of(&pool, 117, vec![holder("x", "f.blk=30024-30203")]),
            shard_of(&pool, 118, vec![holder("y", in_118)]),
            shard_of(&pool, 119, vec![holder("w", "f.blk=30464-30719")]),
            shard_of(&pool, 120, vec![holder("z", "f.blk=30720-30767")]),
        ]
    };
    let record = sharded(&pool, shards("f.blk=30208-30307"));
    let item = homed_at(&record, 120, 10);
    let placed = place(&record, &item, &mut rng());
    assert_eq!(placed.shards, BTreeSet::from([ShardKey::first(118)]));
    // With 118 and 119 full, 117 takes them: 4 dynamic ports and 6 static ones.
    let record = sharded(&pool, shards("f.blk=30208-30463"));
    let placed = place(&record, &item, &mut rng());
    assert_eq!(placed.shards, BTreeSet::from([ShardKey::first(117)]));
    let statics = ports_of(&placed).iter().filter(|&&p| p < 30024).count();
    assert_eq!(statics, 6);
}

#[test]
fn a_block_takes_the_tightest_run_even_across_a_window_edge() {
    // 117 and 120 full. 118 keeps 30384-30463 (80) free, 119 keeps 30464-30483 (20) and
    // 30544-30719 (176): across their edge, 30384-30483 is one run of exactly 100 ports. A block
    // of 100 fits there, across the pair, and leaves 119's run of 176 whole for a larger block
    // (alone, 119 would cut it).
    let pool = pool_of(&["30000-30767"], &[]);
    let record = sharded(
        &pool,
        vec![
            shard_of(&pool, 117, vec![holder("x", "f.blk=30000-30207")]),
            shard_of(&pool, 118, vec![holder("y", "f.blk=30208-30383")]),
            shard_of(&pool, 119, vec![holder("w", "f.blk=30484-30543")]),
            shard_of(&pool, 120, vec![holder("z", "f.blk=30720-30767")]),
        ],
    );
    let pa = (0..)
        .map(|i| {
            let mut pa = allocation(&format!("b{i}"), 1, None);
            let port = &mut pa.spec.roles[0].ports[0];
            port.scope = crate::api::PortScope::RoleScoped;
            port.count = Some(100);
            pa
        })
        .find(|pa| home_shard(&record.layout, &owner_of(pa)) == Some(120))
        .unwrap();
    let placed = place(&record, &item_in(&record.layout, &pa), &mut rng());
    assert_eq!(ports_of(&placed), (30384..=30483).collect::<Vec<u16>>());
    assert_eq!(
        placed.shards,
        BTreeSet::from([ShardKey::first(118), ShardKey::first(119)])
    );
}

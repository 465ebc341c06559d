use proptest::prelude::*;

use super::*;
use crate::api::{PoolHolder, PortPool, PortPoolShardStatus, PortPoolSpec, StaticBandSetting};
use crate::core::{PortBlock, SlotKey};
use crate::ledger::Anomaly;

/// Pool `p` (UID `pool-uid`) of 30000-30767: windows 117 (30000-30207), 118 (30208-30463),
/// 119 (30464-30719) and 120 (30720-30767).
pub(super) fn pool() -> PortPool {
    let mut pool = PortPool::new(
        "p",
        PortPoolSpec {
            ranges: vec!["30000-30767".into()],
            exclude: vec![],
            protocol: Default::default(),
            static_band: StaticBandSetting::None,
            node_reuse: None,
            follow_nodes: None,
            guard: None,
            allow_overlap: false,
        },
    );
    pool.metadata.uid = Some("pool-uid".into());
    pool.metadata.generation = Some(1);
    pool
}

pub(super) fn holder(uid: &str, ports: &str) -> PoolHolder {
    PoolHolder {
        uid: uid.into(),
        owner: format!("ns/{uid}"),
        ports: ports.into(),
    }
}

fn shard(index: u16, holders: Vec<PoolHolder>) -> PortPoolShard {
    let mut shard = new_shard(&PoolSnapshot::of_pool(&pool()), ShardKey::first(index));
    shard.metadata.resource_version = Some(format!("rv{index}"));
    shard.status = Some(PortPoolShardStatus {
        holders,
        ..Default::default()
    });
    shard
}

fn slot(role: &str, port: &str) -> SlotKey {
    SlotKey::new(role, port, 0)
}

fn holdings(text: &str) -> Holdings {
    Holdings::decode(text).unwrap()
}

#[test]
fn a_spanning_owner_is_one_owner_to_the_planner() {
    let record = CopyRecord::load(
        PoolSnapshot::of_pool(&pool()),
        vec![
            shard(117, vec![holder("a", "web.http=30001 big.blk=30200-30207")]),
            shard(
                118,
                vec![
                    holder("a", "big.blk=30208-30215"),
                    holder("b", "db.sql=30300"),
                ],
            ),
        ],
    )
    .unwrap();
    assert_eq!(record.anomalies, vec![]);
    assert_eq!(
        record.holdings_of("a"),
        holdings("web.http=30001 big.blk=30200-30215")
    );
    assert_eq!(record.holdings_of("b"), holdings("db.sql=30300"));
    assert_eq!(record.holdings_of("nobody"), Holdings::new());
    // Each shard's state counts only its own ports.
    assert_eq!(record.shards[&117].record.state.held_count(), 9);
    assert_eq!(record.shards[&118].record.state.held_count(), 9);
    assert_eq!(record.shards[&118].record.state.size(), 256);
}

#[test]
fn anomalies_across_shards_are_named() {
    let mut foreign = shard(119, vec![holder("z", "x.y=30500")]);
    foreign.spec.pool = "other".into();
    let mut stale = shard(120, vec![]);
    stale.spec.pool_uid = "old-uid".into();
    let mut past = shard(120, vec![]);
    past.metadata.name = Some("p-256".into());
    past.spec.index = 256;
    let record = CopyRecord::load(
        PoolSnapshot::of_pool(&pool()),
        vec![
            // c lists 30300, which is window 118's and held there by b; 29990 is in window
            // 117 but not in the pool.
            shard(
                117,
                vec![holder("c", "x.y=30300 x.v=30301 x.z=29990 x.w=30100-30101")],
            ),
            shard(
                118,
                vec![holder("b", "db.sql=30300"), holder("c", "x.w=30400-30401")],
            ),
            foreign,
            stale,
            past,
        ],
    )
    .unwrap();
    let a = &record.anomalies;
    assert!(a.contains(&ShardAnomaly::WrongShard {
        shard: 117,
        uid: "c".into(),
        owner: "ns/c".into(),
        slot: slot("x", "y"),
        port: 30300,
    }));
    assert!(a.contains(&ShardAnomaly::HeldInTwoShards {
        port: 30300,
        first: (117, "ns/c".into()),
        second: (118, "ns/b".into()),
    }));
    assert!(a.iter().any(|x| matches!(
        x,
        ShardAnomaly::InShard {
            shard: 117,
            anomaly: Anomaly::OutsidePool { port: 29990, .. }
        }
    )));
    assert!(a.contains(&ShardAnomaly::SlotApart {
        uid: "c".into(),
        slot: slot("x", "w"),
        shards: vec![117, 118],
    }));
    let not_loaded: Vec<&str> = a
        .iter()
        .filter_map(|x| match x {
            ShardAnomaly::NotLoaded { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(not_loaded, vec!["p-119", "p-120", "p-256"]);
    assert_eq!(
        record.shards.keys().copied().collect::<Vec<_>>(),
        vec![117, 118]
    );
    // Shard 118 plans with the ports shard 117 wrongly lists as held.
    assert!(!record.shards[&118].record.state.is_held(30301));
    assert!(record.state_for(118).unwrap().is_held(30301));
    assert!(!record.state_for(118).unwrap().is_held(30302));
    assert_eq!(
        record.state_for(118).unwrap().held_count(),
        record.shards[&118].record.state.held_count() + 1
    );
    assert!(record.state_for(119).is_none());
    // The piece in the lowest shard is what the planner sees of a slot that does not join.
    assert_eq!(
        record.holdings_of("c").block(&slot("x", "w")),
        PortBlock::new(30100, 2)
    );
}

#[test]
fn a_second_object_for_one_window_is_not_loaded() {
    let mut twin = shard(117, vec![holder("t", "x.y=30002")]);
    twin.metadata.name = Some("p-117-twin".into());
    let record = CopyRecord::load(
        PoolSnapshot::of_pool(&pool()),
        vec![twin, shard(117, vec![holder("a", "x.y=30001")])],
    )
    .unwrap();
    assert_eq!(record.holdings_of("a"), holdings("x.y=30001"));
    assert_eq!(record.holdings_of("t"), Holdings::new());
    assert!(matches!(
        &record.anomalies[..],
        [ShardAnomaly::NotLoaded { name, .. }] if name == "p-117-twin"
    ));
    // A write goes to the object read, whatever it is called.
    let mut only = shard(117, vec![]);
    only.metadata.name = Some("p-117-renamed".into());
    let record = CopyRecord::load(PoolSnapshot::of_pool(&pool()), vec![only]).unwrap();
    let writes = record.writes_for("a", "ns/a", &holdings("x.y=30001"));
    assert_eq!(
        (
            writes[0].name.as_str(),
            writes[0].resource_version.as_deref()
        ),
        ("p-117-renamed", Some("rv117"))
    );
}

#[test]
fn a_spanning_allocation_becomes_one_write_per_shard_in_ascending_order() {
    let record = CopyRecord::load(
        PoolSnapshot::of_pool(&pool()),
        vec![shard(118, vec![holder("b", "db.sql=30300")])],
    )
    .unwrap();
    let decided = holdings("n.p=30460-30470 n.q=30005");
    let writes = record.writes_for("n", "ns/n", &decided);
    let summary: Vec<_> = writes
        .iter()
        .map(|w| {
            let texts: Vec<_> = w.status.holders.iter().map(|h| h.ports.as_str()).collect();
            (
                w.name.as_str(),
                w.resource_version.as_deref(),
                texts,
                w.status.allocated,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("p-117", None, vec!["n.q=30005"], 1),
            (
                "p-118",
                Some("rv118"),
                vec!["db.sql=30300", "n.p=30460-30463"],
                5
            ),
            ("p-119", None, vec!["n.p=30464-30470"], 7),
        ]
    );
    assert_eq!(writes[2].status.size, 256);
    assert_eq!(writes[2].status.available, 249);
}

#[test]
fn shrinking_a_spanning_owner_rewrites_only_the_shards_it_leaves() {
    let b_text = "db.b=30301 db.a=30300"; // decodable, not as we would write it
    let record = CopyRecord::load(
        PoolSnapshot::of_pool(&pool()),
        vec![
            shard(117, vec![holder("a", "web.http=30001 big.blk=30200-30207")]),
            shard(
                118,
                vec![holder("a", "big.blk=30208-30215"), holder("b", b_text)],
            ),
            shard(119, vec![holder("e", "x.y=30500")]),
        ],
    )
    .unwrap();
    let writes = record.writes_for("a", "ns/a", &holdings("web.http=30001"));
    assert_eq!(
        writes.iter().map(|w| w.key.window).collect::<Vec<_>>(),
        vec![117, 118]
    );
    assert_eq!(writes[0].status.holders[0].ports, "web.http=30001");
    assert_eq!(writes[0].status.allocated, 1);
    // a's entry leaves shard 118; b's stays byte for byte.
    assert_eq!(writes[1].status.holders, vec![holder("b", b_text)]);
    assert_eq!(writes[1].status.allocated, 2);
    // Nothing to do when the decision is what is held.
    let same = record.holdings_of("a");
    assert_eq!(record.writes_for("a", "ns/a", &same), vec![]);
    // Releasing everything removes every part.
    let gone = record.writes_for("a", "ns/a", &Holdings::new());
    assert!(
        gone.iter()
            .all(|w| w.status.holders.iter().all(|h| h.uid != "a"))
    );
    assert_eq!(gone.len(), 2);
}

fn arb_holdings() -> impl Strategy<Value = Holdings> {
    let block = (1u16..=65535, 1u32..=1024)
        .prop_filter_map("fits", |(first, count)| PortBlock::new(first, count));
    prop::collection::btree_map(("[a-c]", "[p-r]", 0u32..4), block, 0..8).prop_map(|slots| {
        slots
            .into_iter()
            .map(|((role, port, index), block)| (SlotKey::new(role, port, index), block))
            .collect()
    })
}

proptest! {
    #[test]
    fn split_then_union_is_the_identity(decided in arb_holdings()) {
        let parts = split_by_shard(&decided);
        for (&index, part) in &parts {
            for (_, piece) in part.iter() {
                prop_assert!(window(index).contains(piece.first));
                prop_assert!(window(index).contains(piece.last()));
            }
        }
        let (union, apart) = union_of(parts.into_iter());
        prop_assert!(apart.is_empty());
        prop_assert_eq!(union, decided);
    }
}

#[test]
fn a_union_of_some_windows_has_their_ports_and_only_their_entries_joined() {
    let record = CopyRecord::load(
        PoolSnapshot::of_pool(&pool()),
        vec![
            shard(117, vec![holder("a", "big.blk=30200-30207")]),
            shard(
                118,
                vec![
                    holder("a", "big.blk=30208-30215"),
                    holder("b", "db.sql=30300"),
                ],
            ),
            shard(119, vec![holder("c", "web.http=30500")]),
        ],
    )
    .unwrap();
    let some = record.union_record_of(&[117, 118].into());
    assert_eq!(some.ports.len(), 208 + 256);
    assert!(!some.ports.contains(30500));
    assert_eq!(
        some.holdings_of("a"),
        holdings("big.blk=30200-30215"),
        "the block cut at the window edge is one slot again"
    );
    assert_eq!(some.holdings_of("b"), holdings("db.sql=30300"));
    assert!(
        some.holdings_of("c").is_empty(),
        "window 119 is not in the union"
    );
    assert_eq!(some.state.held_count(), 17);
    assert!(some.anomalies.is_empty(), "{:?}", some.anomalies);
    let all = record.union_record();
    assert_eq!(all.ports.len(), 768);
    assert_eq!(all.state.held_count(), 18);
    assert_eq!(all.holdings_of("c"), holdings("web.http=30500"));
}

#[test]
fn a_rival_object_for_a_window_never_hides_the_shard_named_for_it() {
    let mut rival = shard(118, vec![]);
    rival.metadata.name = Some("a-rival".into());
    let record = CopyRecord::load(
        PoolSnapshot::of_pool(&pool()),
        vec![rival, shard(118, vec![holder("b", "db.sql=30300")])],
    )
    .unwrap();
    assert_eq!(record.shards[&118].record.name(), "p-118");
    assert_eq!(record.holdings_of("b"), holdings("db.sql=30300"));
    assert!(
        record
            .anomalies
            .iter()
            .any(|a| matches!(a, ShardAnomaly::NotLoaded { name, .. } if name == "a-rival")),
        "{:?}",
        record.anomalies
    );
}

/// What `shards_of` must say: every shard whose holders or undecodable entries list `uid`.
fn shards_listing(record: &CopyRecord, uid: &str) -> Vec<u16> {
    record
        .shards
        .iter()
        .filter(|(_, s)| s.record.holders.contains_key(uid) || s.record.opaque.contains_key(uid))
        .map(|(&index, _)| index)
        .collect()
}

#[derive(Clone, Debug)]
enum Step {
    /// `set` an owner's holdings on the record.
    Set(usize, Holdings),
    /// `set` on a clone, which then replaces the record (the clone shares the index).
    SetOnClone(usize, Holdings),
    /// A shard replaced by what another client stored: its write, less one owner's entry.
    Replace(u16, usize),
}

fn arb_step() -> impl Strategy<Value = Step> {
    let block = (30000u16..=30767, 1u32..=40)
        .prop_filter_map("inside the pool", |(first, count)| {
            PortBlock::new(first, count).filter(|b| b.last() <= 30767)
        });
    let inside =
        prop::collection::btree_map(("[a-b]", "[p-q]", 0u32..2), block, 0..4).prop_map(|slots| {
            slots
                .into_iter()
                .map(|((role, port, index), block)| (SlotKey::new(role, port, index), block))
                .collect::<Holdings>()
        });
    prop_oneof![
        (0usize..4, inside.clone()).prop_map(|(owner, h)| Step::Set(owner, h)),
        (0usize..4, inside).prop_map(|(owner, h)| Step::SetOnClone(owner, h)),
        (117u16..=120, 0usize..4).prop_map(|(index, owner)| Step::Replace(index, owner)),
    ]
}

proptest! {
    #[test]
    fn shards_of_agrees_with_a_search_of_every_shard(steps in prop::collection::vec(arb_step(), 1..12)) {
        const OWNERS: [&str; 4] = ["a", "b", "c", "d"];
        let mut record = CopyRecord::load(
            PoolSnapshot::of_pool(&pool()),
            vec![
                shard(117, vec![holder("a", "big.blk=30200-30207"), holder("d", "not a port")]),
                shard(118, vec![holder("a", "big.blk=30208-30215"), holder("b", "db.sql=30300")]),
            ],
        )
        .expect("a valid pool");
        for step in steps {
            // Asked before each step, so the index is built and must be kept or forgotten.
            for uid in OWNERS {
                prop_assert_eq!(record.shards_of(uid), shards_listing(&record, uid));
            }
            match step {
                Step::Set(owner, decided) => record.set(OWNERS[owner], "ns/x", &decided),
                Step::SetOnClone(owner, decided) => {
                    let mut clone = record.clone();
                    clone.set(OWNERS[owner], "ns/x", &decided);
                    for uid in OWNERS {
                        prop_assert_eq!(record.shards_of(uid), shards_listing(&record, uid));
                    }
                    record = clone;
                }
                Step::Replace(index, owner) => {
                    let written = record.shards.get(&index).map(|s| {
                        let mut status = s.write(&record.pool, false).status;
                        status.holders.retain(|h| h.uid != OWNERS[owner]);
                        let mut object = s.record.shard.clone();
                        object.status = Some(status);
                        object
                    });
                    if let Some(object) = written {
                        record.replace(object);
                    }
                }
            }
        }
        for uid in OWNERS {
            prop_assert_eq!(record.shards_of(uid), shards_listing(&record, uid));
        }
    }
}

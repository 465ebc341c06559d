use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::api::{
    PortAllocation, PortAllocationSpec, PortPool, PortPoolSpec, PortRequest, Role, Scope,
};
use crate::api::{SpecError, StaticBandSetting};
use crate::ledger::Reason;

fn pool(range: &str, holders: &[(&str, &str)]) -> PortPool {
    let mut pool = PortPool::new(
        "p",
        PortPoolSpec {
            ranges: vec![range.into()],
            exclude: vec![],
            protocol: Default::default(),
            static_band: StaticBandSetting::None,
        },
    );
    pool.status = Some(PortPoolStatus {
        holders: holders
            .iter()
            .map(|(uid, ports)| PoolHolder {
                uid: (*uid).into(),
                owner: format!("ns/{uid}"),
                ports: (*ports).into(),
            })
            .collect(),
        ..Default::default()
    });
    pool.status = Some(PoolRecord::load(pool.clone()).unwrap().current_status());
    pool
}

/// A PortAllocation `uid` with one role of `replicas` pods, one PodScoped port each, or one
/// RoleScoped port fixed at `fixed`.
fn allocation(uid: &str, replicas: i32, fixed: Option<i32>) -> PortAllocation {
    let request = PortRequest {
        name: "http".into(),
        scope: if fixed.is_some() {
            Scope::RoleScoped
        } else {
            Scope::PodScoped
        },
        env: "HTTP_PORT".into(),
        port: fixed,
        ..Default::default()
    };
    let mut pa = PortAllocation::new(
        uid,
        PortAllocationSpec {
            pool: "p".into(),
            roles: vec![Role {
                name: "web".into(),
                replicas,
                ports: vec![request],
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    pa.metadata.namespace = Some("ns".into());
    pa.metadata.uid = Some(uid.into());
    pa
}

fn sync(uid: &str, replicas: i32) -> BatchItem {
    sync_of(&allocation(uid, replicas, None))
}

fn sync_of(pa: &PortAllocation) -> BatchItem {
    BatchItem {
        uid: pa.metadata.uid.clone().unwrap(),
        owner: format!("ns/{}", pa.metadata.name.as_deref().unwrap()),
        operation: Operation::sync_of(pa),
    }
}

fn item(uid: &str, operation: Operation) -> BatchItem {
    BatchItem {
        uid: uid.into(),
        owner: format!("ns/{uid}"),
        operation: Ok(operation),
    }
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(11)
}

fn held(status: &PortPoolStatus) -> Vec<u16> {
    let mut ports: Vec<u16> = status
        .holders
        .iter()
        .flat_map(|h| {
            Holdings::decode(&h.ports)
                .unwrap()
                .ports()
                .collect::<Vec<_>>()
        })
        .collect();
    ports.sort_unstable();
    ports
}

#[test]
fn refusals_are_per_item_and_do_not_block_the_others() {
    // 100-105: x holds 100. a takes 2, b asks for 100 (held), c is invalid, d wants 4 (only 3
    // left after a), e takes 1, f takes the last 2: the pool ends full.
    let record = PoolRecord::load(pool("100-105", &[("x", "web.http=100")])).unwrap();
    let invalid = BatchItem {
        uid: "c".into(),
        owner: "ns/c".into(),
        operation: Err(Refusal::Spec {
            owner: "ns/c".into(),
            error: SpecError {
                field: "spec.roles".into(),
                message: "no roles".into(),
            },
        }),
    };
    let items = vec![
        sync("a", 2),
        sync_of(&allocation("b", 1, Some(100))),
        invalid,
        sync("d", 4),
        sync("e", 1),
        sync("f", 2),
    ];
    let decision = decide_batch(&record, &items, &mut rng());
    let reasons: Vec<Option<Reason>> = decision
        .outcomes
        .iter()
        .map(|o| match o {
            ItemOutcome::Refused(r) => Some(r.reason()),
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
    let ItemOutcome::Refused(held_by) = &decision.outcomes[1] else {
        unreachable!()
    };
    assert!(held_by.to_string().contains("held by ns/x"), "{held_by}");
    let status = decision.status.expect("a, e and f change the pool");
    assert_eq!(held(&status), vec![100, 101, 102, 103, 104, 105]);
    let uids: Vec<&str> = status.holders.iter().map(|h| h.uid.as_str()).collect();
    assert_eq!(uids, vec!["a", "e", "f", "x"]);
    assert_eq!(
        (status.allocated, status.available, status.holder_count),
        (6, 0, 4)
    );
}

#[test]
fn a_batch_equals_its_items_one_after_another() {
    let start = pool(
        "200-299",
        &[("k", "web.http=200,201,202"), ("r", "web.http=210")],
    );
    let items = vec![
        sync("a", 5),
        sync("k", 1),
        item("r", Operation::Remove),
        sync("b", 3),
        sync_of(&allocation("c", 1, Some(201))),
        item("k", Operation::Release { role: None }),
        sync("a", 7),
    ];
    let batch = decide_batch(
        &PoolRecord::load(start.clone()).unwrap(),
        &items,
        &mut rng(),
    );

    let mut one_by_one = start;
    let mut rng = rng();
    for (item, outcome) in items.iter().zip(&batch.outcomes) {
        let record = PoolRecord::load(one_by_one.clone()).unwrap();
        let operation = item.operation.as_ref().unwrap();
        match decide(&record, &item.uid, &item.owner, operation, &mut rng) {
            Ok(Decision::Write {
                status, holdings, ..
            }) => {
                assert!(
                    matches!(outcome, ItemOutcome::Changed { holdings: h, .. } if *h == holdings)
                );
                one_by_one.status = Some(status);
            }
            Ok(Decision::Unchanged(holdings)) => {
                assert_eq!(*outcome, ItemOutcome::Unchanged(holdings))
            }
            Err(refusal) => assert_eq!(*outcome, ItemOutcome::Refused(refusal)),
        }
    }
    // k's scale-down to one pod freed 201 before c asked for it: later items see earlier ones.
    assert!(matches!(
        batch.outcomes[4],
        ItemOutcome::Changed { allocated: 1, .. }
    ));
    assert!(matches!(
        batch.outcomes[2],
        ItemOutcome::Changed { released: 1, .. }
    ));
    assert_eq!(batch.status, one_by_one.status);
}

#[test]
fn deciding_the_written_batch_again_changes_nothing() {
    let start = pool("300-399", &[("x", "web.http=300")]);
    let items = vec![sync("a", 3), sync("b", 64), sync("x", 1), sync("c", 1)];
    let first = decide_batch(
        &PoolRecord::load(start.clone()).unwrap(),
        &items,
        &mut rng(),
    );
    let mut written = start;
    written.status = first.status.clone();
    let again = decide_batch(&PoolRecord::load(written).unwrap(), &items, &mut rng());
    assert_eq!(again.status, None);
    for (before, after) in first.outcomes.iter().zip(&again.outcomes) {
        let held = Holdings::new();
        assert!(matches!(after, ItemOutcome::Unchanged(_)), "{after:?}");
        assert_eq!(before.holdings(&held), after.holdings(&held));
    }
    assert_eq!(held(first.status.as_ref().unwrap()).len(), 1 + 3 + 64 + 1);
}

#[test]
fn nothing_to_do_writes_nothing_and_others_text_is_kept_verbatim() {
    // Decodable but not in our encoding, and an undecodable entry: both kept byte for byte.
    let theirs = "web.b=403 web.a=404";
    let start = pool(
        "400-409",
        &[("d", theirs), ("o", "???"), ("a", "web.http=400")],
    );
    let record = PoolRecord::load(start).unwrap();
    let idle = decide_batch(&record, &[sync("a", 1)], &mut rng());
    assert_eq!(idle.status, None);
    let decision = decide_batch(
        &record,
        &[sync("n", 1), item("gone", Operation::Remove)],
        &mut rng(),
    );
    let status = decision.status.unwrap();
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
    let removed = decide_batch(&record, &[item("o", Operation::Remove)], &mut rng());
    assert!(removed.status.unwrap().holders.iter().all(|h| h.uid != "o"));
}

//! Tests of holding.rs: slot keys, the text form, and ports per pod.
use super::*;
use proptest::prelude::*;

fn holdings(entries: &[(&str, &str, u32, u16)]) -> Holdings {
    entries
        .iter()
        .map(|&(role, port, index, value)| (SlotKey::new(role, port, index), value))
        .collect()
}

#[test]
fn group_slots_never_collide_with_roles_and_round_trip() {
    let plain = SlotKey::in_group("prefill", "http", 0, 1);
    assert_eq!(plain, SlotKey::new("prefill", "http", 1));
    assert_eq!((plain.group(), plain.spec_role()), (0, "prefill"));
    let grouped = SlotKey::in_group("prefill-x", "http", 12, 3);
    assert_eq!(grouped.role, "12-prefill-x");
    assert_eq!((grouped.group(), grouped.spec_role()), (12, "prefill-x"));
    // A role whose name has a dash is not mistaken for a group.
    assert_eq!(SlotKey::new("web-2", "http", 0).spec_role(), "web-2");
    let long = "r".repeat(63);
    let mut holdings = Holdings::new();
    holdings.insert(SlotKey::in_group(&long, "http", 1023, 0), 100);
    holdings.insert(SlotKey::in_group(&long, "http", 0, 0), 101);
    assert_eq!(Holdings::decode(&holdings.encode()), Ok(holdings));
}

#[test]
fn encodes_groups_in_order_with_gaps() {
    let held = holdings(&[
        ("prefill", "grpc", 0, 30100),
        ("decode", "http", 2, 30003),
        ("decode", "http", 0, 30001),
        ("decode", "metrics", 0, 30200),
    ]);
    let text = held.encode();
    assert_eq!(
        text,
        "decode.http=30001,-,30003 decode.metrics=30200 prefill.grpc=30100"
    );
    assert_eq!(Holdings::decode(&text), Ok(held));
    assert_eq!(Holdings::new().encode(), "");
    assert_eq!(Holdings::decode("  "), Ok(Holdings::new()));
}

#[test]
fn blocks_are_written_first_to_last_next_to_single_ports() {
    let block = |first, count| PortBlock::new(first, count).unwrap();
    let held: Holdings = [
        (SlotKey::new("ray", "workers", 0), block(20000, 8)),
        (SlotKey::new("ray", "workers", 2), block(20016, 8)),
        (SlotKey::new("ray", "head", 0), PortBlock::single(20100)),
    ]
    .into_iter()
    .collect();
    let text = held.encode();
    assert_eq!(text, "ray.head=20100 ray.workers=20000-20007,-,20016-20023");
    assert_eq!(Holdings::decode(&text), Ok(held.clone()));
    assert_eq!(held.len(), 3);
    assert_eq!(held.port_count(), 17);
    assert_eq!(held.get(&SlotKey::new("ray", "workers", 2)), Some(20016));
    assert_eq!(held.ports().count(), 17);
    assert!(held.ports().any(|p| p == 20023));
}

#[test]
fn a_group_may_start_with_missing_indices() {
    let held = holdings(&[("a", "p", 3, 7)]);
    assert_eq!(held.encode(), "a.p=-,-,-,7");
    assert_eq!(Holdings::decode("a.p=-,-,-,7"), Ok(held));
}

#[test]
fn decode_errors_quote_the_bad_group() {
    let message = |text: &str| Holdings::decode(text).unwrap_err().to_string();
    assert_eq!(
        message("decode.http=30001 decodehttp=5"),
        r#"holdings group "decodehttp=5" is malformed: write "<role>.<port>=<ports>", e.g. "decode.http=30001,-,30003""#
    );
    assert_eq!(
        message("decode.http=30001,x"),
        r#""x" in holdings group "decode.http=30001,x" is not a port or block: write a port in 1..65535, a block "first-last", or "-" for an index that holds none"#
    );
    assert_eq!(
        message("Decode.http=1"),
        r#""Decode" in holdings group "Decode.http=1" is not a valid name: use 1-63 lowercase letters, digits and '-'"#
    );
    assert_eq!(
        message("a.b=1 a.b=2"),
        r#""a.b" has more than one holdings group: merge them into one"#
    );
    for bad in [
        "a.b=",
        "a.b=1,,2",
        "a.b=0",
        "a.b=65536",
        "a.b=+1",
        "a.b=5-4",
        "a.b=0-3",
        "a.b=1-",
        "a.b.c=1",
        "=1",
    ] {
        assert!(Holdings::decode(bad).is_err(), "{bad:?} should not decode");
    }
}

#[test]
fn ten_thousand_ports_encode_well_under_a_mebibyte() {
    let pod_scoped: Holdings = (0..10_000)
        .map(|i| (SlotKey::new("decode", "http", i), 20_000 + i as u16))
        .collect();
    assert!(pod_scoped.encode().len() < 64 * 1024);

    // Worst realistic spread: every port its own group with long names.
    let spread: Holdings = (0..10_000)
        .map(|i| {
            let role = format!("inference-server-role-{i:05}");
            (SlotKey::new(role, "metrics-http", 0), 20_000 + i as u16)
        })
        .collect();
    assert!(spread.encode().len() < 512 * 1024);
}

#[test]
fn slot_validation_names_the_bad_name() {
    assert_eq!(SlotKey::new("decode", "http", 0).validate(), Ok(()));
    let err = SlotKey::new("decode", "http.alt", 0)
        .validate()
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with(r#""http.alt" in holdings group"#)
    );
}

fn arb_name() -> impl Strategy<Value = String> {
    "[a-z0-9-]{1,12}"
}

/// Mostly single ports, some blocks (which may overlap: the text form
/// does not care, the pool does).
fn arb_block() -> impl Strategy<Value = PortBlock> {
    prop_oneof![
        3 => (1u16..).prop_map(PortBlock::single),
        1 => (1u16..64000, 1u32..=1024).prop_map(|(first, count)| PortBlock::new(first, count).unwrap()),
    ]
}

fn arb_holdings() -> impl Strategy<Value = Holdings> {
    prop::collection::btree_map((arb_name(), arb_name(), 0u32..12), arb_block(), 0..40).prop_map(
        |map| {
            map.into_iter()
                .map(|((role, port, index), block)| (SlotKey::new(role, port, index), block))
                .collect()
        },
    )
}

/// An operation on holdings, to replay against a `BTreeMap` (the model: what the sorted
/// vector replaced).
#[derive(Debug, Clone)]
enum Op {
    Insert(SlotKey, PortBlock),
    Remove(SlotKey),
    Extend(Vec<(SlotKey, PortBlock)>),
}

fn arb_slot() -> impl Strategy<Value = SlotKey> {
    // Few names and indices, so slots repeat: replacing and removing get exercised.
    ("[ab]", "[xy]", 0u32..4).prop_map(|(role, port, index)| SlotKey::new(role, port, index))
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (arb_slot(), arb_block()).prop_map(|(s, b)| Op::Insert(s, b)),
        2 => arb_slot().prop_map(Op::Remove),
        1 => prop::collection::vec((arb_slot(), arb_block()), 0..6).prop_map(Op::Extend),
    ]
}

proptest! {
    #[test]
    fn behaves_as_an_ordered_map(
        start in prop::collection::vec((arb_slot(), arb_block()), 0..10),
        ops in prop::collection::vec(arb_op(), 0..40),
    ) {
        let mut model: std::collections::BTreeMap<SlotKey, PortBlock> =
            start.iter().cloned().collect();
        let mut held: Holdings = start.into_iter().collect();
        for op in ops {
            match op {
                Op::Insert(slot, block) => prop_assert_eq!(
                    held.insert_block(slot.clone(), block),
                    model.insert(slot, block)
                ),
                Op::Remove(slot) => prop_assert_eq!(held.remove(&slot), model.remove(&slot)),
                Op::Extend(entries) => {
                    model.extend(entries.iter().cloned());
                    held.extend(entries);
                }
            }
            let listed: Vec<(SlotKey, PortBlock)> =
                held.iter().map(|(s, b)| (s.clone(), b)).collect();
            let expected: Vec<(SlotKey, PortBlock)> =
                model.iter().map(|(s, b)| (s.clone(), *b)).collect();
            prop_assert_eq!(listed, expected);
            for slot in model.keys() {
                prop_assert_eq!(held.block(slot), model.get(slot).copied());
            }
            prop_assert_eq!(held.len(), model.len());
        }
    }

    #[test]
    fn encode_decode_round_trips(held in arb_holdings()) {
        let text = held.encode();
        let decoded = Holdings::decode(&text);
        prop_assert_eq!(decoded.as_ref().map(Holdings::port_count), Ok(held.port_count()));
        prop_assert_eq!(decoded, Ok(held));
    }
}

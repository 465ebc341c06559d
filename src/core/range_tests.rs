//! Unit and property tests of port ranges and port sets.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn range(first: u16, last: u16) -> PortRange {
    PortRange { first, last }
}

fn set(text: &str) -> PortSet {
    text.parse().unwrap()
}

#[test]
fn parses_ranges_and_single_ports() {
    assert_eq!(PortRange::parse("30000-32767"), Ok(range(30000, 32767)));
    assert_eq!(PortRange::parse("  8080 "), Ok(range(8080, 8080)));
    assert_eq!(PortRange::parse("1 - 65535"), Ok(range(1, 65535)));
    assert_eq!(PortRange::parse("5-5"), Ok(range(5, 5)));
}

#[test]
fn rejects_bad_ranges_with_messages_that_quote_them() {
    let message = |text: &str| PortRange::parse(text).unwrap_err().to_string();
    assert_eq!(
        message("10-5"),
        r#"invalid port range "10-5": the first port must not exceed the last (write "5-10")"#
    );
    assert_eq!(message("0-10"), r#"port 0 in "0-10" is outside 1..65535"#);
    assert_eq!(message("0"), r#"port 0 in "0" is outside 1..65535"#);
    assert_eq!(
        message("70000"),
        r#"port 70000 in "70000" is outside 1..65535"#
    );
    assert_eq!(
        message("1-99999999999999"),
        r#"port 99999999999999 in "1-99999999999999" is outside 1..65535"#
    );
    assert_eq!(
        message("abc"),
        r#""abc" is not a port or range: write "A" or "A-B", e.g. "30000-32767""#
    );
    assert_eq!(
        message(""),
        r#"a port range is empty: write "A" or "A-B", e.g. "30000-32767""#
    );
    for text in ["a-b", "1--2", "-5", "5-", "+5", "1-2-3", "5 6", "٣"] {
        assert!(
            matches!(PortRange::parse(text), Err(RangeError::Syntax { .. })),
            "{text:?} should be a syntax error"
        );
    }
}

#[test]
fn displays_single_ports_without_a_dash() {
    assert_eq!(range(80, 80).to_string(), "80");
    assert_eq!(range(80, 90).to_string(), "80-90");
    assert_eq!(range(1, 65535).len(), 65535);
}

#[test]
fn parse_list_merges_overlapping_and_adjacent_ranges() {
    let ports = PortSet::parse_list(&["10-20", "15-25", "26", "40-50,30"]).unwrap();
    assert_eq!(ports.to_string(), "10-26,30,40-50");
    assert_eq!(ports.len(), 17 + 1 + 11);
}

#[test]
fn parse_list_quotes_an_item_with_an_empty_piece() {
    let err = PortSet::parse_list(&["1,,2"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#""1,,2" contains an empty port range: write "A" or "A-B", e.g. "30000-32767""#
    );
}

#[test]
fn parse_disjoint_names_the_two_overlapping_ranges() {
    let err = PortSet::parse_disjoint(&["30050-30200", "31000", "30000-30100"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"ranges "30000-30100" and "30050-30200" overlap: list each port once"#
    );
    // A range nested inside a wide one is caught even past a third range.
    let err = PortSet::parse_disjoint(&["1-100", "20", "50"]).unwrap_err();
    assert_eq!(
        err,
        RangeError::Overlap {
            a: "1-100".into(),
            b: "20".into()
        }
    );
    // Adjacent is not overlapping.
    assert_eq!(
        PortSet::parse_disjoint(&["1-10", "11-20"]).unwrap(),
        set("1-20")
    );
}

#[test]
fn nth_and_index_of_skip_gaps() {
    let ports = set("10-12,20,30-31");
    let listed: Vec<u16> = ports.iter().collect();
    assert_eq!(listed, [10, 11, 12, 20, 30, 31]);
    assert_eq!(ports.nth(3), Some(20));
    assert_eq!(ports.nth(5), Some(31));
    assert_eq!(ports.nth(6), None);
    assert_eq!(ports.index_of(30), Some(4));
    assert_eq!(ports.index_of(13), None);
    assert_eq!(ports.index_of(9), None);
    assert_eq!(ports.index_of(32), None);
}

#[test]
fn subtract_cuts_holes_and_edges() {
    let pool = set("30000-30010,30020-30030");
    assert_eq!(
        pool.subtract(&set("30000,30005-30022,30030-40000"))
            .to_string(),
        "30001-30004,30023-30029"
    );
    assert_eq!(pool.subtract(&PortSet::empty()), pool);
    assert!(pool.subtract(&set("1-65535")).is_empty());
}

#[test]
fn subset_and_overlap() {
    let pool = set("100-200,300-400");
    assert!(set("150-160,300").is_subset_of(&pool));
    assert!(!set("150-250").is_subset_of(&pool));
    assert!(PortSet::empty().is_subset_of(&pool));
    assert!(pool.overlaps(&set("200-299")));
    assert!(!pool.overlaps(&set("201-299,401")));
}

#[test]
fn from_ranges_drops_port_zero_and_empty_ranges() {
    let ports = PortSet::from_ranges([range(0, 3), range(9, 5), range(65535, 65535)]);
    assert_eq!(ports.to_string(), "1-3,65535");
}

fn arb_ranges() -> impl Strategy<Value = Vec<PortRange>> {
    // Small ports make overlaps and adjacency common; a few reach 65535.
    let small = (1u16..300, 0u16..40).prop_map(|(first, extra)| range(first, first + extra));
    let large = (65400u16..=65535).prop_map(|first| range(first, 65535));
    prop::collection::vec(prop_oneof![4 => small, 1 => large], 0..8)
}

fn model(ranges: &[PortRange]) -> BTreeSet<u16> {
    ranges.iter().flat_map(|r| r.first..=r.last).collect()
}

proptest! {
    #[test]
    fn display_parse_round_trips(ranges in arb_ranges()) {
        let ports = PortSet::from_ranges(ranges);
        let text = ports.to_string();
        let reparsed = if ports.is_empty() {
            PortSet::parse_list(&[] as &[&str]).unwrap()
        } else {
            PortSet::parse_list(&[&text]).unwrap()
        };
        prop_assert_eq!(reparsed, ports);
    }

    #[test]
    fn range_display_parse_round_trips(first in 1u16.., extra in 0u16..100) {
        let r = range(first, first.saturating_add(extra));
        prop_assert_eq!(PortRange::parse(&r.to_string()), Ok(r));
    }

    #[test]
    fn set_operations_match_a_naive_model(a in arb_ranges(), b in arb_ranges()) {
        let (set_a, set_b) = (PortSet::from_ranges(a.clone()), PortSet::from_ranges(b.clone()));
        let (model_a, model_b) = (model(&a), model(&b));

        prop_assert_eq!(set_a.len() as usize, model_a.len());
        prop_assert_eq!(set_a.iter().collect::<Vec<_>>(), model_a.iter().copied().collect::<Vec<_>>());

        let difference = set_a.subtract(&set_b);
        let model_difference: BTreeSet<u16> = model_a.difference(&model_b).copied().collect();
        prop_assert_eq!(difference.iter().collect::<BTreeSet<_>>(), model_difference.clone());
        prop_assert_eq!(difference.len() as usize, model_difference.len());
        // A subtraction result is itself normalised.
        prop_assert_eq!(&PortSet::from_ranges(difference.ranges().to_vec()), &difference);

        prop_assert_eq!(set_a.is_subset_of(&set_b), model_a.is_subset(&model_b));
        prop_assert_eq!(set_a.overlaps(&set_b), !model_a.is_disjoint(&model_b));
        prop_assert!(difference.is_subset_of(&set_a));
        prop_assert!(!difference.overlaps(&set_b));
    }

    #[test]
    fn nth_index_of_and_contains_match_enumeration(a in arb_ranges(), probe in 0u16..400) {
        let ports = PortSet::from_ranges(a.clone());
        for (idx, port) in ports.iter().enumerate() {
            prop_assert_eq!(ports.nth(idx as u32), Some(port));
            prop_assert_eq!(ports.index_of(port), Some(idx as u32));
        }
        prop_assert_eq!(ports.nth(ports.len()), None);
        prop_assert_eq!(ports.contains(probe), model(&a).contains(&probe));
        prop_assert_eq!(ports.index_of(probe).is_some(), ports.contains(probe));
    }

    #[test]
    fn parse_disjoint_accepts_exactly_non_overlapping_input(a in arb_ranges()) {
        let texts: Vec<String> = a.iter().map(|r| r.to_string()).collect();
        let total: usize = a.iter().map(|r| r.len() as usize).sum();
        let disjoint = model(&a).len() == total;
        match PortSet::parse_disjoint(&texts) {
            Ok(ports) => {
                prop_assert!(disjoint);
                prop_assert_eq!(ports, PortSet::from_ranges(a));
            }
            Err(RangeError::Overlap { a: x, b: y }) => {
                prop_assert!(!disjoint);
                let (x, y) = (PortRange::parse(&x).unwrap(), PortRange::parse(&y).unwrap());
                prop_assert!(x.overlaps(&y));
            }
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
    }
}

//! A pool's spec changing under its holders: what differs, field by field, and which holders a
//! new spec would strand (a port outside its ranges, an excluded port, another protocol). Pure:
//! the k8s layer reads the shards and refuses with what this finds.

use std::collections::BTreeMap;

use crate::api::{PoolHolder, PortPoolSpec, SpecError};
use crate::core::Holdings;

/// One line per spec field that differs, `field: old -> new`, in the spec's own field names.
pub fn spec_differences(old: &PortPoolSpec, new: &PortPoolSpec) -> Vec<String> {
    let as_map = |spec: &PortPoolSpec| match serde_json::to_value(spec) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let (old, new) = (as_map(old), as_map(new));
    let mut fields: Vec<&String> = old.keys().chain(new.keys()).collect();
    fields.sort();
    fields.dedup();
    let shown = |value: Option<&serde_json::Value>| match value {
        Some(value) => value.to_string(),
        None => "<unset>".to_string(),
    };
    fields
        .into_iter()
        .filter(|field| old.get(*field) != new.get(*field))
        .map(|field| {
            format!(
                "spec.{field}: {} -> {}",
                shown(old.get(field)),
                shown(new.get(field))
            )
        })
        .collect()
}

/// Every holder that `new` would strand, as `owner (ports ...: why)`, sorted: a holder keeps
/// its ports when a spec changes, so a port the new spec does not have would be held outside
/// the pool, where no allocation sees it. `protocol_changes`: every held port is stranded.
pub fn stranded_holders<'a>(
    new: &PortPoolSpec,
    protocol_changes: bool,
    entries: impl IntoIterator<Item = &'a PoolHolder>,
) -> Result<Vec<String>, SpecError> {
    let ports = new.port_set()?;
    let mut by_owner: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
    for entry in entries {
        // An unreadable entry is repair's business; it holds nothing this check can name.
        let Ok(holdings) = Holdings::decode(&entry.ports) else {
            continue;
        };
        let lost: Vec<u16> = holdings
            .ports()
            .filter(|&port| protocol_changes || !ports.contains(port))
            .collect();
        if !lost.is_empty() {
            by_owner.entry(&entry.owner).or_default().extend(lost);
        }
    }
    let why = match protocol_changes {
        true => format!("the protocol would become {}", new.protocol),
        false => "outside the new ranges or excluded".to_string(),
    };
    Ok(by_owner
        .into_iter()
        .map(|(owner, mut lost)| {
            lost.sort_unstable();
            lost.dedup();
            let listed: Vec<String> = lost.iter().take(8).map(u16::to_string).collect();
            let more = match lost.len() {
                n if n > 8 => format!(" and {} more", n - 8),
                _ => String::new(),
            };
            format!("{owner} (ports {}{more}: {why})", listed.join(","))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortRangeText, Protocol};

    fn spec(ranges: &str, exclude: &[&str]) -> PortPoolSpec {
        PortPoolSpec {
            ranges: vec![PortRangeText(ranges.into())],
            exclude: exclude.iter().map(|e| PortRangeText((*e).into())).collect(),
            protocol: Protocol::default(),
            static_band: Default::default(),
            node_reuse: None,
            follow_nodes: None,
            guard: None,
            allow_overlap: false,
        }
    }

    fn holder(owner: &str, ports: &str) -> PoolHolder {
        PoolHolder {
            uid: format!("uid-{owner}"),
            owner: owner.into(),
            ports: ports.into(),
        }
    }

    #[test]
    fn differences_name_each_field() {
        let old = spec("21000-29999", &[]);
        let new = spec("20000-23999", &["22379-22380"]);
        assert_eq!(
            spec_differences(&old, &new),
            vec![
                "spec.exclude: <unset> -> [\"22379-22380\"]",
                "spec.ranges: [\"21000-29999\"] -> [\"20000-23999\"]",
            ]
        );
        assert!(spec_differences(&old, &old).is_empty());
    }

    #[test]
    fn holders_outside_the_new_ranges_or_excluded_are_named() {
        let holders = [
            holder("a/kept", "web.http=21000"),
            holder("a/out", "web.http=25000,21001"),
            holder("b/excluded", "web.http=22379"),
        ];
        let stranded = stranded_holders(&spec("20000-23999", &["22379"]), false, &holders).unwrap();
        assert_eq!(
            stranded,
            vec![
                "a/out (ports 25000: outside the new ranges or excluded)",
                "b/excluded (ports 22379: outside the new ranges or excluded)",
            ]
        );
    }

    #[test]
    fn a_new_protocol_strands_every_holder() {
        let holders = [holder("a/kept", "web.http=21000")];
        let mut udp = spec("20000-23999", &[]);
        udp.protocol = Protocol::Udp;
        let stranded = stranded_holders(&udp, true, &holders).unwrap();
        assert_eq!(stranded.len(), 1);
        assert!(stranded[0].starts_with("a/kept (ports 21000: the protocol would become UDP"));
        assert!(
            stranded_holders(&spec("20000-23999", &[]), false, &holders)
                .unwrap()
                .is_empty()
        );
    }
}

//! `kubectl portalloc pool describe NAME`: the pool's page (spec, usage, bands, holders,
//! warnings), then its copies (`describe_copies`) and its node agents (`describe_guard`).

use std::fmt::Write as _;

use kube::Client;

use super::DescribeArgs;
use super::describe_copies::copies_text;
use super::describe_guard::guard_text_of;
use crate::cli::output::bar;
use crate::cli::{CliError, Exit};
use crate::core::{Band, PoolState, hazards};
use crate::k8s::{self, get_pool};
use crate::ledger::{Anomaly, WindowRecord};

pub(super) async fn describe(client: &Client, args: DescribeArgs) -> anyhow::Result<()> {
    let pool = get_pool(client, &args.name).await?;
    let view = k8s::pool_view(client, pool)
        .await?
        .map_err(|e| CliError::new(Exit::Invalid, format!("PortPool {:?}: {e}", args.name)))?;
    let mut warnings = view.warnings.clone();
    warnings.extend(k8s::node_ports::node_port_conflicts(client, &view.record).await);
    warnings.extend(k8s::pool_overlaps_of(client, &args.name).await);
    print!(
        "{}",
        describe_text(&view.record, &view.record_kind(), &warnings)
    );
    if view.reuse > 1 || !view.reused.is_empty() || view.nodes.is_some() {
        print!("{}", copies_text(&view));
    }
    let reports = k8s::node_agent::node_reports(client, &args.node_agent_namespace)
        .await
        .map_err(|e| e.to_string());
    print!(
        "{}",
        guard_text_of(
            &args.name,
            &args.node_agent_namespace,
            &view.record.pool.spec,
            reports.as_deref().map_err(Clone::clone)
        )
    );
    Ok(())
}

/// The `pool describe` page. Pure, so it is tested without a cluster. `kind` says how the
/// record is stored; `extra` are warnings found outside the record (node ports, shards).
pub fn describe_text(record: &WindowRecord, kind: &str, extra: &[String]) -> String {
    let mut out = String::new();
    write_spec(&mut out, record, kind);
    write_usage(&mut out, record);
    write_bands(&mut out, &record.state);
    write_holders(&mut out, record);
    write_warnings(&mut out, record, extra);
    out
}

/// What the pool was asked to hand out, and how its record is stored.
fn write_spec(out: &mut String, record: &WindowRecord, kind: &str) {
    let spec = &record.pool.spec;
    let _ = writeln!(out, "Name:         {}", record.name());
    let _ = writeln!(out, "Protocol:     {}", spec.protocol);
    let _ = writeln!(
        out,
        "Ranges:       {}",
        spec.ranges
            .iter()
            .map(|r| r.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let excluded = if spec.exclude.is_empty() {
        "<none>".to_string()
    } else {
        spec.exclude
            .iter()
            .map(|r| r.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "Exclude:      {excluded}");
    let _ = writeln!(out, "Record:       {kind}");
}

/// How much is held and free, and which blocks still fit.
fn write_usage(out: &mut String, record: &WindowRecord) {
    let state = &record.state;
    let _ = writeln!(out, "Size:         {} ports", state.size());
    let _ = writeln!(
        out,
        "Allocated:    {} {}",
        state.held_count(),
        bar(state.held_count(), state.size(), 30)
    );
    let _ = writeln!(out, "Free:         {}", state.free_count());
    let frag = state.fragmentation();
    let fits: Vec<String> = record
        .block_sizes_to_report()
        .into_iter()
        .map(|size| format!("{} of {size}", frag.fits(size)))
        .collect();
    let _ = writeln!(
        out,
        "Free runs:    {} (largest {} ports); blocks that fit: {}",
        frag.runs(),
        frag.largest(),
        fits.join(", ")
    );
    // How full the pool can get before the largest block its holders use is refused: the
    // figure to size a pool by (packed placement keeps it near 100 %).
    let largest_block = record
        .holders
        .values()
        .flat_map(|h| h.holdings.iter().map(|(_, block)| u32::from(block.count)))
        .filter(|&n| n > 1)
        .max();
    if let Some(size) = largest_block {
        let _ = writeln!(
            out,
            "Refuses:      a block of {size} at {:.1} % full, if only such blocks came from now on",
            state.occupancy_at_refusal(size) * 100.0
        );
    }
}

/// The static and dynamic bands (KEP-3668): their bounds and how much of each is used.
fn write_bands(out: &mut String, state: &PoolState) {
    let _ = writeln!(out, "Bands:");
    let bands = state.bands();
    for (band, label) in [(Band::Static, "static "), (Band::Dynamic, "dynamic")] {
        let indices = bands.indices(band);
        let usage = state.usage(band);
        let bounds = match (
            state.ports().nth(indices.start),
            indices
                .end
                .checked_sub(1)
                .and_then(|i| state.ports().nth(i)),
        ) {
            (Some(first), Some(last)) if !indices.is_empty() => format!("{first}-{last}"),
            _ => "<empty>".to_string(),
        };
        let _ = writeln!(
            out,
            "  {label}  {bounds:<13} {:>5}/{:<5} used {}",
            usage.used,
            usage.size,
            bar(usage.used, usage.size, 20)
        );
    }
}

/// Every holder with its ports; unreadable entries count as holders too.
fn write_holders(out: &mut String, record: &WindowRecord) {
    let _ = writeln!(
        out,
        "Holders:      {}",
        record.holders.len() + record.opaque.len()
    );
    for (uid, holder) in &record.holders {
        let _ = writeln!(
            out,
            "  {}  ({} ports, uid {uid})",
            holder.owner,
            holder.holdings.port_count()
        );
        let _ = writeln!(out, "    {}", holder.holdings.encode());
    }
}

/// The pool's range hazards, the warnings found outside the record, then what repair fixes.
fn write_warnings(out: &mut String, record: &WindowRecord, extra: &[String]) {
    let mut warnings: Vec<String> = hazards(&record.ports)
        .into_iter()
        .map(|h| h.message)
        .collect();
    warnings.extend(extra.iter().cloned());
    for anomaly in &record.anomalies {
        warnings.push(match anomaly {
            Anomaly::Undecodable { owner, error, .. } => format!("holder {owner} has an unreadable entry ({error}): run `kubectl portalloc repair`"),
            Anomaly::OutsidePool { owner, slot, port, .. } => format!("{owner} holds port {port} ({slot}), which is outside the pool or excluded: run `kubectl portalloc repair`"),
            Anomaly::Duplicate { port, first, second } => format!("port {port} is held by both {first} and {second}: run `kubectl portalloc repair`"),
        });
    }
    if warnings.is_empty() {
        let _ = writeln!(out, "Warnings:     <none>");
    } else {
        let _ = writeln!(out, "Warnings:");
        for warning in warnings {
            let _ = writeln!(out, "  - {warning}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PortPool;
    use crate::api::{PoolHolder, PortPoolSpec, StaticBandSetting};
    use crate::ledger::PoolSnapshot;

    #[test]
    fn describe_shows_blocks_and_free_runs() {
        let pool = PortPool::new(
            "gpu",
            PortPoolSpec {
                ranges: vec!["20000-20099".into()],
                exclude: vec!["20050".into()],
                protocol: Default::default(),
                static_band: StaticBandSetting::None,
                node_reuse: None,
                follow_nodes: None,
                guard: None,
                allow_overlap: false,
            },
        );
        let holders = vec![PoolHolder {
            uid: "u1".into(),
            owner: "ml/ray".into(),
            ports: "ray.head=20099 ray.workers=20000-20007,20008-20015".into(),
        }];
        let copy = PoolSnapshot::of_pool(&pool);
        let ports = copy.ports().unwrap();
        let static_band = copy.spec.core_static_band();
        let record = WindowRecord::joined(copy, ports, static_band, holders);
        let text = describe_text(&record, "1 shard", &[]);
        assert!(
            text.contains("  ml/ray  (17 ports, uid u1)\n    ray.head=20099 ray.workers=20000-20007,20008-20015\n"),
            "{text}"
        );
        // Free: 20016-20049 (34) and 20051-20098 (48).
        assert!(
            text.contains(
                "Free runs:    2 (largest 48 ports); blocks that fit: 10 of 8, 5 of 16, 2 of 32\n"
            ),
            "{text}"
        );
        // 17 held; the runs of 34 and 48 take 4 and 6 more blocks of 8: 97 of 99 ports.
        assert!(
            text.contains(
                "Refuses:      a block of 8 at 98.0 % full, if only such blocks came from now on\n"
            ),
            "{text}"
        );
    }
}

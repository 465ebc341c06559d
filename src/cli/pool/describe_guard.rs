//! The part of `pool describe` about the nodes: which node agents reserve and guard the pool, in
//! which mode, which have no guard and why, which stopped reporting, and ports of the pool that
//! something on a node already listens on.

use std::fmt::Write as _;
use std::time::Duration;

use crate::api::{GuardMode, PortPoolSpec};
use crate::ledger::node_report::{PoolGuardSummary, ReadReport, pool_guard_summary};

/// How many node names a line lists before it says how many more.
const NAMES_SHOWN: usize = 10;

/// The section for `pool` (guard `mode`), from every agent's report, or why they could not be
/// read.
pub fn guard_text(
    pool: &str,
    agents_namespace: &str,
    mode: GuardMode,
    reports: Result<&[ReadReport], String>,
) -> String {
    section(pool, agents_namespace, mode.to_string(), mode, reports)
}

/// The section for a pool with `spec`: a guard the kernel cannot apply (SCTP's) is named as
/// asked and said to be unapplied, and no agent is listed as guarding the pool.
pub fn guard_text_of(
    pool: &str,
    agents_namespace: &str,
    spec: &PortPoolSpec,
    reports: Result<&[ReadReport], String>,
) -> String {
    let (asked, judged) = (spec.guard_mode(), spec.judged_guard());
    if asked == judged {
        return guard_text(pool, agents_namespace, asked, reports);
    }
    let heading = format!(
        "{asked}, not applied: the kernel hands an {} bind to sctp_bind, which runs no cgroup \
         bind hook, so no node agent sees it (set guard to Off; the ports are still reserved)",
        spec.protocol
    );
    // An agent older than this rule may still list the pool: the kernel judges none of its binds.
    let reports: Result<Vec<ReadReport>, String> = reports.map(|reports| {
        reports
            .iter()
            .cloned()
            .map(|mut read| {
                read.report.pools.remove(pool);
                read
            })
            .collect()
    });
    section(
        pool,
        agents_namespace,
        heading,
        judged,
        reports.as_deref().map_err(Clone::clone),
    )
}

fn section(
    pool: &str,
    agents_namespace: &str,
    heading: String,
    mode: GuardMode,
    reports: Result<&[ReadReport], String>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Guard:        {heading}");
    let reports = match reports {
        Ok(reports) => reports,
        Err(why) => {
            let _ = writeln!(out, "Node agents:  could not be read ({why})");
            return out;
        }
    };
    if reports.is_empty() {
        let _ = writeln!(
            out,
            "Node agents:  none report in namespace {agents_namespace}: no node agent runs \
             there, so the pool's ports are neither reserved nor guarded on the nodes (agents \
             installed elsewhere: --node-agent-namespace; docs/node-agent.md)"
        );
        return out;
    }
    let summary = pool_guard_summary(pool, mode, reports);
    let _ = writeln!(out, "Node agents:  {} report", reports.len());
    render(&mut out, &summary);
    out
}

fn render(out: &mut String, summary: &PoolGuardSummary) {
    for mode in [GuardMode::Enforce, GuardMode::Audit] {
        let nodes: Vec<&str> = summary
            .guarding
            .iter()
            .filter(|(_, m)| *m == mode)
            .map(|(n, _)| n.as_str())
            .collect();
        if !nodes.is_empty() {
            let _ = writeln!(out, "  guard it ({mode}): {}", names(&nodes));
        }
    }
    for (node, why) in &summary.unguarded {
        let _ = writeln!(out, "  reserve its ports, no guard: {node} ({why})");
    }
    if !summary.stale.is_empty() {
        let nodes: Vec<String> = summary
            .stale
            .iter()
            .map(|(node, age)| match age {
                Some(age) => format!("{node} (last {} ago)", short(*age)),
                None => format!("{node} (never)"),
            })
            .collect();
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let _ = writeln!(
            out,
            "  stopped reporting: {}: their guard stays attached with the ports it last knew",
            names(&nodes)
        );
    }
    for line in &summary.conflicts {
        let _ = writeln!(out, "  warning: {line}");
    }
}

fn names(nodes: &[&str]) -> String {
    let mut text = nodes
        .iter()
        .take(NAMES_SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if nodes.len() > NAMES_SHOWN {
        let _ = write!(text, " and {} more", nodes.len() - NAMES_SHOWN);
    }
    text
}

fn short(age: Duration) -> String {
    match age.as_secs() {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::node_report::NodeReport;

    fn read(node: &str, mode: Option<GuardMode>, age: u64) -> ReadReport {
        ReadReport {
            report: NodeReport {
                node: node.into(),
                pools: mode.map(|m| ("llm".to_string(), m)).into_iter().collect(),
                reserved: 10,
                ..NodeReport::default()
            },
            age: Some(Duration::from_secs(age)),
            lease_duration: Duration::from_secs(90),
        }
    }

    #[test]
    fn the_section_names_guarding_unguarded_and_stopped_agents() {
        let mut no_bpf = read("gpu-3", None, 5);
        no_bpf.report.guard_unavailable = Some("no cgroup v2 hierarchy at /sys/fs/cgroup".into());
        let reports = [
            read("gpu-1", Some(GuardMode::Enforce), 5),
            read("gpu-2", Some(GuardMode::Enforce), 20),
            no_bpf,
            read("gpu-4", Some(GuardMode::Enforce), 600),
        ];
        assert_eq!(
            guard_text("llm", "portalloc-system", GuardMode::Enforce, Ok(&reports)),
            "Guard:        Enforce\n\
             Node agents:  4 report\n  \
             guard it (Enforce): gpu-1, gpu-2\n  \
             reserve its ports, no guard: gpu-3 (no cgroup v2 hierarchy at /sys/fs/cgroup)\n  \
             stopped reporting: gpu-4 (last 10m ago): their guard stays attached with the ports it last knew\n"
        );
    }

    #[test]
    fn an_sctp_pool_is_never_called_guarded() {
        let spec: PortPoolSpec = serde_json::from_value(serde_json::json!({
            "ranges": ["40000-40009"], "protocol": "SCTP", "guard": "Enforce"
        }))
        .unwrap();
        // An agent that still lists the pool (an older one) is not believed either.
        let reports = [
            read("gpu-1", Some(GuardMode::Enforce), 5),
            read("gpu-2", None, 5),
        ];
        let text = guard_text_of("llm", "portalloc-system", &spec, Ok(&reports));
        assert!(
            text.starts_with(
                "Guard:        Enforce, not applied: the kernel hands an SCTP bind to sctp_bind"
            ),
            "{text}"
        );
        assert!(!text.contains("guard it"), "{text}");
        assert!(!text.contains("has not applied"), "{text}");
        assert!(text.contains("Node agents:  2 report"), "{text}");
        let tcp = PortPoolSpec {
            protocol: crate::api::Protocol::Tcp,
            ..spec
        };
        assert!(
            guard_text_of("llm", "portalloc-system", &tcp, Ok(&reports))
                .contains("guard it (Enforce): gpu-1")
        );
    }

    #[test]
    fn no_agent_and_unreadable_reports_say_so() {
        assert!(
            guard_text("llm", "portalloc-system", GuardMode::Disabled, Ok(&[]))
                .contains("none report in namespace portalloc-system: no node agent runs")
        );
        let text = guard_text(
            "llm",
            "portalloc-system",
            GuardMode::Audit,
            Err("Forbidden: list leases".into()),
        );
        assert!(text.contains("could not be read (Forbidden: list leases)"));
    }
}

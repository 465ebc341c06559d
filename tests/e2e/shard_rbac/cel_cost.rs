//! The tenancy policy's CEL cost, by `celcost --policy` (the API server's own admission code)
//! on the heaviest writes a 256-port shard takes and on writes it must refuse.

use crate::support::{self, tools};

/// The API server estimates no cost when a ValidatingAdmissionPolicy is written, and enforces
/// while admitting: 1,000,000 per expression, 10,000,000 per request. `celcost --policy` runs the
/// tenancy policy with its admission code on the heaviest writes a 256-port shard takes (every
/// entry changing at once, two owners of 128 ports swapping them, entries of thousands of
/// indices) and on writes it must refuse: all within the limits, each decided as expected.
#[test]
fn the_tenancy_policy_is_within_the_cel_cost_limits() {
    let policy = support::repo_root().join("rbac/portalloc-tenancy-policy.yaml");
    let out = std::process::Command::new(tools::celcost())
        .arg("--policy")
        .arg(&policy)
        .output()
        .expect("run celcost");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let totals: Vec<&str> = text.lines().filter(|l| l.starts_with("  total ")).collect();
    assert_eq!(totals.len(), 12, "one total per write: {text}");
    assert!(
        text.contains("all 256 entries of a full window change") && !text.contains("ERROR"),
        "{text}"
    );
}

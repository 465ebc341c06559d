//! References checked at apply time: `kubectl apply --dry-run=server` (the real kubectl against the
//! real API server) refuses a reference to a role the object lacks, or to a port its role lacks,
//! so a GitOps review finds the mistake before the merge; the plugin's own message stays.

use std::process::Command;

use kube::Api;
use portalloc::api::PortAllocation;

use crate::support::{self, cli, tools};

/// A router referring to a two-worker role through `references` (YAML flow items).
fn manifest(name: &str, ns: &str, references: &[&str]) -> String {
    let references: String = references.iter().map(|r| format!("    - {r}\n")).collect();
    format!(
        "apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {{name: {name}, namespace: {ns}}}
spec:
  pool: refs
  roles:
  - name: router
    replicas: 1
    ports: [{{name: http, env: ROUTER_PORT}}]
    references:
{references}  - name: worker
    replicas: 2
    ports: [{{name: rpc, env: RPC_PORT}}]
"
    )
}

/// `kubectl apply --dry-run=server -f -`: (succeeded, stdout + stderr).
fn apply_dry_run(yaml: &str) -> (bool, String) {
    let mut command = Command::new(tools::kubectl());
    command
        .arg("--kubeconfig")
        .arg(&support::cluster().kubeconfig)
        .args(["apply", "--dry-run=server", "-f", "-"]);
    let out = tools::run_with_input(command, yaml);
    (out.status.success(), tools::all_output(&out))
}

const MISSING_ROLE: &str = "every references[].from must name a role of this PortAllocation";
const MISSING_PORT: &str = "a port reference (role.port) must name a port of that role";

#[tokio::test]
async fn references_to_missing_roles_and_ports_are_refused_at_apply() {
    let client = support::client().await;
    let ns = support::namespace(&client, "refs").await;

    let good = manifest(
        "good",
        &ns,
        &[
            "{env: RPC, from: worker.rpc}",
            "{env: RPC1, from: 'worker.rpc[1]'}",
            "{env: RPCS, from: 'worker.rpc[*]'}",
            "{env: WORKERS, from: 'worker[*]', format: '{address}:{rpc}'}",
            "{env: SELF, from: router.http}",
        ],
    );
    let (ok, text) = apply_dry_run(&good);
    assert!(
        ok,
        "a manifest whose references all resolve is accepted: {text}\n{good}"
    );
    assert!(text.contains("(server dry run)"), "{text}");

    let cases: [(&str, &str, &[&str], &[&str]); 5] = [
        (
            "port of a missing role",
            "{env: L, from: leader.http}",
            &[MISSING_ROLE],
            &[MISSING_PORT],
        ),
        (
            "pods of a missing role",
            "{env: L, from: 'leader[*]'}",
            &[MISSING_ROLE],
            &[MISSING_PORT],
        ),
        (
            "indexed pod of a missing role",
            "{env: L, from: 'leaders[0]'}",
            &[MISSING_ROLE],
            &[],
        ),
        (
            "missing port of a role",
            "{env: W, from: worker.http}",
            &[MISSING_PORT],
            &[MISSING_ROLE],
        ),
        (
            "missing port, indexed",
            "{env: W, from: 'worker.http[1]'}",
            &[MISSING_PORT],
            &[MISSING_ROLE],
        ),
    ];
    let mut failures = Vec::new();
    for (what, reference, expected, absent) in cases {
        let yaml = manifest("bad", &ns, &["{env: RPC, from: worker.rpc}", reference]);
        let (ok, text) = apply_dry_run(&yaml);
        if ok {
            failures.push(format!("{what}: accepted at apply:\n{yaml}"));
            continue;
        }
        for needle in expected.iter().chain(["spec.roles", "is invalid"].iter()) {
            if !text.contains(needle) {
                failures.push(format!("{what}: lacks {needle:?}: {text}"));
            }
        }
        for needle in absent {
            if text.contains(needle) {
                failures.push(format!("{what}: also says {needle:?}: {text}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // A dry run writes nothing.
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    assert!(api.get_opt("good").await.unwrap().is_none());
    assert!(api.get_opt("bad").await.unwrap().is_none());

    // The plugin still says it in its own words, naming the roles there are.
    let bad = manifest("bad", &ns, &["{env: L, from: leader.http}"]);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &bad);
    assert!(!run.ok(), "{}", run.stdout);
    assert!(
        run.stderr
            .contains("names role \"leader\", which does not exist")
            && run.stderr.contains("router, worker"),
        "{}",
        run.stderr
    );
}

/// Every rule of the checked-in CRDs within the API server's static cost limits, by the API
/// server's own estimator (the figures go in docs/gitops.md).
#[test]
fn crd_rules_are_within_the_cost_budget() {
    let crds = support::repo_root().join("crds/portalloc-crds.yaml");
    let out = Command::new(tools::celcost())
        .arg(&crds)
        .output()
        .expect("run celcost");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let totals: Vec<&str> = text.lines().filter(|l| l.contains("(total)")).collect();
    assert_eq!(totals.len(), 3, "one total per CRD: {text}");
    assert!(totals.iter().all(|l| l.contains(" ok (")), "{text}");
    assert!(
        text.contains("[self.roles.map(t, t.name)].all(names"),
        "the reference rules are among those estimated: {text}"
    );
}

//! Bad input, table-driven, through the binary against the real API server: every case exits
//! non-zero with its documented code, says in one line which object and field are wrong, and
//! leaves every object exactly as it was (UIDs and resourceVersions compared before and after).
//!
//! The cases are data, one table per topic (`manifest_cases`, `command_cases`); the test below
//! runs them all and names every case that fails.

mod case;
mod command_cases;
mod fixture;
mod manifest_cases;
mod snapshot;

use kube::Client;

use crate::support;
use crate::support::cli::{self, Run};
use crate::support::private_cluster::PrivateCluster;

use case::{Case, check};
use fixture::{Fixture, HTTP, pa_doc, web};
use snapshot::snapshot;

/// Every table run against the shared cluster, by topic, in the order they run.
fn tables(f: &Fixture) -> Vec<(&'static str, Vec<Case>)> {
    vec![
        ("manifest shape", manifest_cases::shape_cases(f)),
        ("pool spec", manifest_cases::pool_spec_cases(f)),
        ("roles", manifest_cases::role_cases(f)),
        ("requested ports", manifest_cases::port_request_cases(f)),
        ("references", manifest_cases::reference_cases(f)),
        ("against the pool", manifest_cases::pool_fit_cases(f)),
        ("manifest source", manifest_cases::source_cases(f)),
        (
            "before the first write",
            manifest_cases::before_the_first_write_cases(f),
        ),
        ("pool flags", command_cases::pool_flag_cases(f)),
        ("pool verbs", command_cases::pool_command_cases(f)),
        ("named objects", command_cases::named_object_cases(f)),
        ("flags", command_cases::flag_cases(f)),
        ("webhook", command_cases::webhook_cases(f)),
        ("connection", command_cases::connection_cases(f)),
    ]
}

fn run(case: &Case, run_args: impl FnOnce(&[&str], Option<&str>) -> Run) -> Run {
    let args: Vec<&str> = case.args.iter().map(String::as_str).collect();
    run_args(&args, case.stdin.as_deref())
}

/// What is wrong with `case`'s run, if anything: its refusal, and whether the cluster changed.
async fn failures_of(client: &Client, f: &Fixture, table: &str, case: &Case) -> Vec<String> {
    let mut failures = Vec::new();
    let before = snapshot(client, &f.prefix, &f.ns).await;
    let run = run(case, |args, stdin| match stdin {
        Some(input) => cli::run_stdin(args, input),
        None => cli::run(args),
    });
    if let Err(why) = check(case, &run) {
        failures.push(format!(
            "{table}: {}: {why}\n  args: {:?}\n  {run}",
            case.what, case.args
        ));
    }
    let after = snapshot(client, &f.prefix, &f.ns).await;
    if before != after {
        failures.push(format!(
            "{table}: {}: the cluster changed:\n  before {before:?}\n  after  {after:?}",
            case.what
        ));
    }
    failures
}

/// The CRDs missing: a control plane of its own where `install` never ran. The number of cases
/// run (none when no such control plane can be started) and the failures.
fn crds_missing_failures(f: &Fixture) -> (usize, Vec<String>) {
    let Some(bare) = PrivateCluster::start("bare", false) else {
        return (0, Vec::new());
    };
    let file = f.dir.path().join("x.yaml");
    std::fs::write(&file, pa_doc("x", "default", &web("1", HTTP))).unwrap();
    let cases = command_cases::crds_missing_cases(file.to_str().unwrap());
    let failures = cases
        .iter()
        .filter_map(|case| {
            let run = run(case, |args, _| bare.run(args));
            check(case, &run)
                .err()
                .map(|why| format!("{} {:?}: {why}\n  {run}", case.what, case.args))
        })
        .collect();
    (cases.len(), failures)
}

#[tokio::test]
async fn bad_input_is_refused_clearly_and_changes_nothing() {
    let client = support::client().await;
    let f = Fixture::set_up(&client).await;
    let mut failures = Vec::new();
    let mut count = 0;
    for (table, cases) in tables(&f) {
        for case in &cases {
            count += 1;
            failures.extend(failures_of(&client, &f, table, case).await);
        }
    }
    let (bare_count, bare_failures) = crds_missing_failures(&f);
    count += bare_count;
    failures.extend(bare_failures);

    eprintln!("bad input: {count} cases, {} failures", failures.len());
    assert!(
        failures.is_empty(),
        "{} failures in {count} cases:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(count >= 40);
}

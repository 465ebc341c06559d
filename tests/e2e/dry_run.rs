//! Dry runs and diffs against the real API server: `--dry-run=client|server` on `create`,
//! `sync`, `release` and `delete`, and `diff -f`, print the ports each object would take and
//! free, and write nothing (the record and the objects are read before and after).

use kube::Api;
use portalloc::api::PortAllocation;

use crate::support::{self, cli, invariants};

/// The lines of `text` starting with `prefix`.
fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[tokio::test]
async fn dry_runs_and_diffs_show_the_ports_and_write_nothing() {
    let client = support::client().await;
    let ns = support::namespace(&client, "dry-run").await;
    let pool = support::unique_name("dry");
    support::create_pool(&pool, "31900-31949");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let two = support::simple_allocation("app", &pool, "decode", 2, &["rpc"]);
    let four = support::simple_allocation("app", &pool, "decode", 4, &["rpc"]);
    let one = support::simple_allocation("app", &pool, "decode", 1, &["rpc"]);
    let record = invariants::shard_versions(&client, &pool).await;

    // A new object: both dry runs say what it would take; nothing is created or recorded.
    for mode in ["--dry-run=client", "--dry-run=server", "--dry-run"] {
        let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns, mode], &two);
        assert!(run.ok(), "{mode}: {run}");
        assert!(
            run.stdout.contains("created (") && run.stdout.contains("would take 2 ports"),
            "{run}"
        );
        assert_eq!(lines(&run.stdout, "  take  decode.rpc[").len(), 2, "{run}");
    }
    let diff = cli::run_stdin(&["diff", "-f", "-", "-n", &ns], &two);
    assert_eq!(diff.code, 1, "a new object is a difference: {diff}");
    assert_eq!(lines(&diff.stdout, "+ decode.rpc[").len(), 2, "{diff}");
    assert!(diff.stderr.is_empty(), "differences are not errors: {diff}");
    assert!(api.get_opt("app").await.unwrap().is_none());
    assert_eq!(invariants::shard_versions(&client, &pool).await, record);

    // Created for real: the diff of the same manifest is empty and exits 0, and the ports a
    // dry run of it names are the ones it holds.
    let created = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &two);
    assert!(created.ok(), "{created}");
    let diff = cli::run_stdin(&["diff", "-f", "-", "-n", &ns], &two);
    assert_eq!(diff.code, 0, "{diff}");
    assert!(diff.stdout.contains("take 0, keep 2, free 0"), "{diff}");
    let stored = api.get("app").await.unwrap();
    let record = invariants::shard_versions(&client, &pool).await;

    // Scale-up and scale-down, reviewed before they are applied.
    let up = cli::run_stdin(&["diff", "-f", "-", "-n", &ns], &four);
    assert_eq!(up.code, 1, "{up}");
    assert_eq!(lines(&up.stdout, "+ ").len(), 2, "{up}");
    assert_eq!(
        lines(&up.stdout, "  decode.rpc[").len(),
        2,
        "kept ports: {up}"
    );
    assert!(up.stdout.contains("(spec changes)"), "{up}");
    let down = cli::run_stdin(&["diff", "-f", "-", "-n", &ns], &one);
    assert_eq!(down.code, 1, "{down}");
    assert_eq!(lines(&down.stdout, "- decode.rpc[1]").len(), 1, "{down}");
    let server = cli::run_stdin(&["create", "-f", "-", "-n", &ns, "--dry-run=server"], &four);
    assert!(
        server.ok() && server.stdout.contains("configured (server dry run)"),
        "{server}"
    );

    // sync, release and delete: previews, and the object and record stay as they were.
    for args in [
        vec!["sync", "app", "--dry-run=server"],
        vec!["release", "app", "--dry-run=client"],
        vec!["release", "app", "--role", "decode", "--dry-run=server"],
        vec!["delete", "app", "--dry-run=server"],
        vec!["delete", "app", "--dry-run=client"],
    ] {
        let mut args = args;
        args.extend(["-n", ns.as_str()]);
        let run = cli::run(&args);
        assert!(run.ok(), "{args:?}: {run}");
        let expected = if args[0] == "sync" {
            "free 0"
        } else {
            "free 2"
        };
        assert!(run.stdout.contains(expected), "{args:?}: {run}");
    }
    let after = api.get("app").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        stored.metadata.resource_version
    );
    assert_eq!(after.status, stored.status);
    assert_eq!(invariants::shard_versions(&client, &pool).await, record);

    // A refusal is said as the real command would say it, with its exit code.
    let huge = support::simple_allocation("huge", &pool, "decode", 60, &["rpc"]);
    let refused = cli::run_stdin(&["create", "-f", "-", "-n", &ns, "--dry-run=client"], &huge);
    assert_eq!(refused.code, 4, "pool full is Refused (4): {refused}");
    assert!(refused.stderr.contains("(dry run)"), "{refused}");
    let diff = cli::run_stdin(&["diff", "-f", "-", "-n", &ns], &huge);
    assert_eq!(diff.code, 4, "{diff}");
    assert!(diff.stdout.contains("! refused:"), "{diff}");
    assert!(api.get_opt("huge").await.unwrap().is_none());

    // --dry-run takes only what kubectl's does.
    let bad = cli::run(&["sync", "app", "-n", &ns, "--dry-run=maybe"]);
    assert_eq!(bad.code, 2, "{bad}");
}

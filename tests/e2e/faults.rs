//! A slow or failing API server, through a fault-injecting proxy of the tests' own: added
//! latency, refused connections, a server that never answers, truncated responses. The client's
//! retries stay bounded in attempts and time, `--request-timeout` is honoured, and every failure
//! says what happened, with exit code 6 (safe to run again).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, PostParams};
use portalloc::api::PortAllocation;
use portalloc::k8s::{AllocateError, Allocator, RetryPolicy};

use crate::support::cli::{self, BIN, Run};
use crate::support::fault_proxy::{Fault, FaultProxy, Stats};
use crate::support::invariants::{allocations_of, assert_consistent};
use crate::support::private_cluster::client_from;
use crate::support::{self};

fn timed(kubeconfig: &std::path::Path, args: &[&str]) -> (Run, Duration) {
    let started = Instant::now();
    let run = cli::run_with(kubeconfig, args);
    (run, started.elapsed())
}

/// The `error: ...` line, which must be the only line on stderr.
fn one_line_error(run: &Run) -> &str {
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {run}");
    assert!(lines[0].starts_with("error: "), "{run}");
    lines[0]
}

async fn create_object(client: &Client, ns: &str, name: &str, pool: &str) -> PortAllocation {
    let manifest = support::simple_allocation(name, pool, "worker", 2, &["rpc"]);
    let pa: PortAllocation = serde_yaml::from_str(&manifest).unwrap();
    Api::<PortAllocation>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pa)
        .await
        .unwrap()
}

#[tokio::test]
async fn latency_slows_allocation_but_changes_nothing_else() {
    let client = support::client().await;
    let ns = support::namespace(&client, "fault-latency").await;
    let pool = support::unique_name("fault-latency");
    support::create_pool(&pool, "34000-34099");
    let proxy = FaultProxy::start(
        &support::cluster().kubeconfig,
        Fault::Latency(Duration::from_millis(150)),
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        support::simple_allocation("slow", &pool, "worker", 3, &["rpc"]),
    )
    .unwrap();
    let path = file.path().to_str().unwrap();
    let (run, took) = timed(&proxy.kubeconfig, &["create", "-f", path, "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("3 ports held"), "{run}");
    // Four requests (read pool, create, write pool, write status), each delayed both ways.
    assert!(took >= Duration::from_millis(1200), "{took:?}");
    // A request timeout above the latency is not tripped by it.
    let (run, _) = timed(
        &proxy.kubeconfig,
        &["sync", "slow", "-n", &ns, "--request-timeout", "2s"],
    );
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("(unchanged)"), "{run}");
    eprintln!(
        "faults: latency 150 ms per chunk: create took {:.2}s",
        took.as_secs_f64()
    );
    assert_consistent(&client, &pool).await;
}

#[tokio::test]
async fn request_timeout_bounds_a_server_that_never_answers() {
    let client = support::client().await;
    let ns = support::namespace(&client, "fault-hang").await;
    let pool = support::unique_name("fault-hang");
    support::create_pool(&pool, "34100-34199");
    create_object(&client, &ns, "stuck", &pool).await;
    let proxy = FaultProxy::start(&support::cluster().kubeconfig, Fault::Blackhole);
    let version = crate::support::invariants::shard_versions(&client, &pool).await;

    for args in [
        vec!["sync", "stuck", "-n", &ns, "--request-timeout", "1s"],
        vec!["get", "-n", &ns, "--request-timeout", "1s"],
        vec!["repair", "--pool", &pool, "--request-timeout", "1s"],
    ] {
        let (run, took) = timed(&proxy.kubeconfig, &args);
        assert_eq!(run.code, 6, "{args:?}: {run}");
        let line = one_line_error(&run);
        assert!(
            line.contains("timed out: no answer within the request timeout"),
            "{args:?}: the message must say it timed out: {line}"
        );
        assert!(line.contains("safe to"), "{line}");
        // One timed-out request (1s), retried within 4x the timeout at most.
        assert!(took < Duration::from_secs(7), "{args:?} took {took:?}");
        eprintln!(
            "faults: hung server, {:?}: {:.1}s: {line}",
            args[0],
            took.as_secs_f64()
        );
    }
    assert!(proxy.count(|s: &Stats| &s.hung) >= 3);
    assert_eq!(
        crate::support::invariants::shard_versions(&client, &pool).await,
        version,
        "nothing was written"
    );
}

/// The allocator itself, with every connection refused: it retries, and gives up within its
/// policy's attempts and time, saying how many attempts it made and that a rerun is safe.
#[tokio::test]
async fn allocator_retries_are_bounded_in_attempts_and_in_time() {
    let client = support::client().await;
    let ns = support::namespace(&client, "fault-budget").await;
    let pool = support::unique_name("fault-budget");
    support::create_pool(&pool, "34200-34299");
    let pa = create_object(&client, &ns, "refused", &pool).await;
    let proxy = FaultProxy::start(&support::cluster().kubeconfig, Fault::Refuse);
    let through_proxy = client_from(&proxy.kubeconfig, None).await;

    // Bounded by attempts: 6 attempts, fast backoff.
    let mut allocator = Allocator::new(through_proxy.clone());
    allocator.policy = RetryPolicy {
        max_attempts: 6,
        max_elapsed: Duration::from_secs(30),
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(100),
    };
    let before = proxy.count(|s: &Stats| &s.refused);
    let started = Instant::now();
    let err = allocator.sync(pa.clone()).await.unwrap_err();
    let took = started.elapsed();
    let AllocateError::Exhausted {
        attempts,
        conflicts,
        ref last,
        ..
    } = err
    else {
        panic!("expected the retry budget to run out: {err}");
    };
    assert_eq!((attempts, conflicts), (6, 0), "{err}");
    assert!(
        last.contains("onnect") || last.contains("reset") || last.contains("closed"),
        "{err}"
    );
    assert!(
        err.to_string().contains("safe to run the command again"),
        "{err}"
    );
    let tried = proxy.count(|s: &Stats| &s.refused) - before;
    assert!(
        (6..=12).contains(&tried),
        "{tried} connections for 6 attempts"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    eprintln!(
        "faults: refused, attempt budget: {err} ({:.2}s)",
        took.as_secs_f64()
    );

    // Bounded by time: the default attempt cap, but 2 s in all (what `--request-timeout 500ms`
    // gives a command: four times the request timeout).
    allocator.policy = RetryPolicy {
        max_elapsed: Duration::from_secs(2),
        ..RetryPolicy::default()
    };
    let started = Instant::now();
    let err = allocator.sync(pa).await.unwrap_err();
    let took = started.elapsed();
    let AllocateError::Exhausted { attempts, .. } = err else {
        panic!("{err}");
    };
    assert!(
        attempts < RetryPolicy::default().max_attempts,
        "time, not attempts, ended it: {err}"
    );
    assert!(took <= Duration::from_millis(2500), "{took:?}");
    eprintln!(
        "faults: refused, time budget: {attempts} attempts in {:.2}s",
        took.as_secs_f64()
    );

    // And the binary: the same refusal is exit 6 with a one-line message, quickly.
    let (run, took) = timed(&proxy.kubeconfig, &["sync", "refused", "-n", &ns]);
    assert_eq!(run.code, 6, "{run}");
    let line = one_line_error(&run);
    assert!(
        line.contains("unavailable") && line.contains("safe to retry"),
        "{line}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Nothing was allocated by any of it.
    assert!(
        allocations_of(&client, &pool)
            .await
            .values()
            .all(is_default_status)
    );
}

/// Nothing written: only the status the API server fills in for an object nobody has synced.
fn is_default_status(pa: &PortAllocation) -> bool {
    pa.status.as_ref().is_some_and(|s| {
        s.observed_generation == Some(0) && s.assignments.is_empty() && s.conditions.is_empty()
    })
}

struct Outcome {
    args: Vec<String>,
    code: i32,
    stderr: String,
    took: Duration,
}

/// Run every command line at once through `kubeconfig`; wait for all.
fn run_all(kubeconfig: &std::path::Path, commands: Vec<Vec<String>>) -> Vec<Outcome> {
    let children: Vec<_> = commands
        .into_iter()
        .map(|args| {
            let child = Command::new(BIN)
                .args(&args)
                .args(["--request-timeout", "3s", "-v", "1"])
                .env("KUBECONFIG", kubeconfig)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (args, Instant::now(), child)
        })
        .collect();
    children
        .into_iter()
        .map(|(args, spawned, child)| {
            let output = child.wait_with_output().unwrap();
            Outcome {
                args,
                code: output.status.code().unwrap_or(-1),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
                took: spawned.elapsed(),
            }
        })
        .collect()
}

/// Connections dropped and responses cut short at random, under concurrent clients: each
/// command succeeds or exits 6 with a clear message, within its budget; reruns complete the job
/// and no port is ever held twice.
#[tokio::test]
async fn dropped_connections_and_truncated_responses_never_corrupt_the_pool() {
    flaky(false).await;
}

/// The same against a pool of two shards (34300-34303 and 34304-34499): owners that span them.
#[tokio::test]
async fn dropped_connections_and_truncated_responses_never_corrupt_two_shards() {
    flaky(true).await;
}

async fn flaky(two_shards: bool) {
    let client = support::client().await;
    let ns = support::namespace(&client, "fault-flaky").await;
    let pool = support::unique_name("fault-flaky");
    if two_shards {
        support::create_pool(&pool, "34300-34499");
    } else {
        // One shard: window 133.
        support::create_pool(&pool, "34048-34247");
    }
    let proxy = FaultProxy::start(
        &support::cluster().kubeconfig,
        Fault::Flaky {
            refuse: 0.25,
            truncate: 0.35,
            max_bytes: 8000,
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let file_of = |name: &str| {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            support::simple_allocation(name, &pool, "worker", 3, &["rpc", "admin"]),
        )
        .unwrap();
        path.to_string_lossy().into_owned()
    };
    let words = |line: &str| line.split(' ').map(String::from).collect::<Vec<_>>();
    let names: Vec<String> = (0..16).map(|i| format!("flaky-{i}")).collect();
    let started = Instant::now();
    // Phase 1: create all; phase 2: sync those that exist, delete four of them.
    let mut outcomes = run_all(
        &proxy.kubeconfig,
        names
            .iter()
            .map(|n| words(&format!("create -f {} -n {ns}", file_of(n))))
            .collect(),
    );
    let created: Vec<&String> = names
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| o.code == 0)
        .map(|(n, _)| n)
        .collect();
    let doomed: Vec<String> = created.iter().take(4).map(|n| n.to_string()).collect();
    let mut second: Vec<Vec<String>> = created
        .iter()
        .map(|n| words(&format!("sync {n} -n {ns}")))
        .collect();
    second.extend(doomed.iter().map(|n| words(&format!("delete {n} -n {ns}"))));
    outcomes.extend(run_all(&proxy.kubeconfig, second));
    let wall = started.elapsed();

    let mut failed = Vec::new();
    let mut most_attempts = 0u32;
    let mut retries = 0usize;
    let mut slowest = Duration::ZERO;
    for outcome in &outcomes {
        slowest = slowest.max(outcome.took);
        for line in outcome.stderr.lines().filter(|l| l.contains("; attempt ")) {
            retries += 1;
            let n: u32 = line
                .split("; attempt ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            most_attempts = most_attempts.max(n);
        }
        // A command's budget: 4 x 3 s of retries, plus one request in flight and start-up.
        assert!(
            outcome.took < Duration::from_secs(20),
            "{:?}: {}",
            outcome.took,
            outcome.stderr
        );
        // A sync racing the delete of the same object may find it gone: exit 3, said plainly.
        let raced_delete = outcome.code == 3
            && outcome.args[0] == "sync"
            && doomed.contains(&outcome.args[1])
            && outcome.stderr.contains("not found");
        match outcome.code {
            0 => {}
            3 if raced_delete => {}
            6 => {
                let errors: Vec<&str> = outcome
                    .stderr
                    .lines()
                    .filter(|l| l.starts_with("error:"))
                    .collect();
                assert_eq!(errors.len(), 1, "{}", outcome.stderr);
                assert!(
                    errors[0].contains("safe to") || errors[0].contains("repair --apply"),
                    "{}",
                    outcome.stderr
                );
                failed.push(outcome);
            }
            other => panic!(
                "{:?}: exit {other} is neither success nor retriable:\n{}",
                outcome.args, outcome.stderr
            ),
        }
    }
    eprintln!(
        "faults: flaky proxy: {} connections, {} dropped, {} truncated; {} commands: {} failed with exit 6, \
         {retries} in-process retries (at most attempt {most_attempts}), slowest {:.1}s, wall {:.1}s",
        proxy.count(|s: &Stats| &s.connections),
        proxy.count(|s: &Stats| &s.refused),
        proxy.count(|s: &Stats| &s.truncated),
        outcomes.len(),
        failed.len(),
        slowest.as_secs_f64(),
        wall.as_secs_f64()
    );
    for outcome in failed.iter().take(4) {
        eprintln!(
            "faults: e.g. {}",
            outcome.stderr.lines().last().unwrap_or_default()
        );
    }
    assert!(most_attempts <= 30);
    assert!(
        proxy.count(|s: &Stats| &s.truncated) > 0,
        "no response was cut short"
    );

    // Whatever was cut short, a rerun without faults completes it (a sync or delete of an object
    // a delete removed says it is gone); then repair frees what such deletes left, and the pool is exact.
    drop(proxy);
    for outcome in &failed {
        let args: Vec<&str> = outcome.args.iter().map(String::as_str).collect();
        let run = cli::run(&args);
        let gone = args[0] != "create" && doomed.iter().any(|d| d == args[1]);
        assert!(run.ok() || (gone && run.code == 3), "{run}");
    }
    let run = cli::run(&["repair", "--pool", &pool, "--apply"]);
    assert!(run.ok(), "{run}");
    let holdings = assert_consistent(&client, &pool).await;
    assert_eq!(
        holdings.len(),
        16 - doomed.len(),
        "every object holds its ports, no leak remains"
    );
    assert!(holdings.values().all(|h| h.len() == 6));
}

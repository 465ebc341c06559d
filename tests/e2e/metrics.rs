//! The watcher's `/metrics`, scraped from the process running as the shipped ServiceAccount
//! against a control plane of its own: the figures match the pool and the objects, a stalled
//! object is named while it is stalled, and `promtool check metrics` (Prometheus' own linter,
//! built pinned) finds nothing to say; the same watcher keeps the pool's usage on its status, as
//! `kubectl get portpools` shows it. The PrometheusRule of deploy/monitoring.yaml is checked and
//! unit-tested with `promtool`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use portalloc::api::{PortAllocation, PortPool, PortPoolUsage};
use serde::Deserialize;

use crate::support::apply::apply_yaml;
use crate::support::private_cluster::PrivateCluster;
use crate::support::service_account::watcher_kubeconfig;
use crate::support::watcher_process::WatcherProcess;
use crate::support::{self, tools};

/// A series as printed: its name and its labels (in any order).
type Series = (String, BTreeMap<String, String>);

/// `name{label="value",...}`, or `name` alone, into its name and labels; the rest of the line
/// after it.
fn parse_series(line: &str) -> Option<(Series, &str)> {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, mut rest) = line.split_at(end);
    let mut labels = BTreeMap::new();
    if let Some(mut inner) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = inner.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = inner.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let close = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.insert(label.to_string(), value);
            inner = after[close + 1..].trim_start_matches(',');
        }
    }
    Some(((name.to_string(), labels), rest))
}

/// The value of the sample of `series` (a name and labels as printed, in any label order).
fn sample(text: &str, series: &str) -> Option<f64> {
    let (wanted, _) = parse_series(series)?;
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (found, rest) = parse_series(l)?;
        (found == wanted).then(|| rest.trim().parse().ok())?
    })
}

/// How many samples of the family `name` the scrape has.
fn samples_of(text: &str, name: &str) -> usize {
    text.lines()
        .filter_map(|l| parse_series(l).filter(|_| !l.starts_with('#')))
        .filter(|((found, _), _)| found == name)
        .count()
}

/// Scrape `/metrics` every half second until `done` holds for the body (60 s at most), checking
/// the content type; the body.
async fn scrape_until(watcher: &WatcherProcess, what: &str, done: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    loop {
        let answer = watcher.get("/metrics").unwrap_or_default();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_default();
        if done(body) {
            assert!(head.contains("text/plain; version=0.0.4"), "{head}");
            return body.to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "metrics never showed {what}:\n{answer}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The pool `gpu`'s largest free run in either band, by the scrape.
fn band_run(text: &str) -> i32 {
    ["static", "dynamic"]
        .iter()
        .map(|b| {
            let series =
                format!("portalloc_pool_largest_free_run_ports{{pool=\"gpu\",band=\"{b}\"}}");
            sample(text, &series).unwrap() as i32
        })
        .max()
        .unwrap()
}

/// The pool `gpu`'s usage once the watcher has counted `allocated` ports (60 s at most).
async fn usage_until(pools: &Api<PortPool>, allocated: i32) -> PortPoolUsage {
    let started = Instant::now();
    loop {
        let pool = pools.get("gpu").await.unwrap();
        let usage = pool.status.as_ref().and_then(|s| s.usage.clone());
        if let Some(usage) = usage.filter(|u| u.allocated == allocated) {
            return usage;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the pool's status never counted {allocated} ports: {:?}",
            pool.status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `promtool ARGS` with `input` on stdin: (exit code, stdout + stderr).
fn promtool(args: &[&str], input: &str) -> (Option<i32>, String) {
    let mut command = Command::new(tools::test_tool("promtool"));
    command.args(args);
    let out = tools::run_with_input(command, input);
    (out.status.code(), tools::all_output(&out))
}

#[tokio::test]
async fn the_watcher_exports_metrics_promtool_accepts_and_keeps_the_pools_usage() {
    let Some(cluster) = PrivateCluster::start("metrics", true) else {
        return;
    };
    let client = cluster.client().await;
    assert!(
        cluster
            .run(&["pool", "create", "gpu", "--range", "30100-30199"])
            .ok()
    );
    support::create_namespace(&client, "apps").await;
    let manifests =
        std::fs::read_to_string(support::repo_root().join("deploy/watcher.yaml")).unwrap();
    apply_yaml(&client, &manifests, None).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("watcher");
    watcher_kubeconfig(&client, &cluster.kubeconfig, &kubeconfig).await;

    // One object that fits (2 ports) and one the pool can never hold (PoolFull, Stalled).
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), "apps");
    for (name, replicas) in [("fits", 2), ("too-big", 500)] {
        let yaml = support::simple_allocation(name, "gpu", "web", replicas, &["http"]);
        let pa: PortAllocation = serde_yaml::from_str(&yaml).unwrap();
        api.create(&PostParams::default(), &pa).await.unwrap();
    }
    let watcher = WatcherProcess::start(
        &kubeconfig,
        "watcher",
        &["-A", "--resync", "20s", "-v", "1"],
        dir.path(),
    );
    let text = scrape_until(&watcher, "2 ports held and 1 stalled object", |body| {
        let allocated = ["static", "dynamic"]
            .iter()
            .filter_map(|band| {
                sample(
                    body,
                    &format!("portalloc_pool_allocated_ports{{pool=\"gpu\",band=\"{band}\"}}"),
                )
            })
            .sum::<f64>();
        let stalled = sample(
            body,
            "portalloc_allocations{phase=\"Failed\",reason=\"PoolFull\"}",
        );
        allocated == 2.0 && stalled == Some(1.0)
    })
    .await;
    eprintln!("--- /metrics\n{text}");

    let band = |name: &str| -> f64 {
        ["static", "dynamic"]
            .iter()
            .map(|b| sample(&text, &format!("{name}{{pool=\"gpu\",band=\"{b}\"}}")).unwrap())
            .sum()
    };
    assert_eq!(band("portalloc_pool_ports"), 100.0);
    assert_eq!(band("portalloc_pool_free_ports"), 98.0);
    let dynamic_run = sample(
        &text,
        "portalloc_pool_largest_free_run_ports{pool=\"gpu\",band=\"dynamic\"}",
    );
    assert!(
        dynamic_run.is_some_and(|run| (1.0..=98.0).contains(&run)),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "portalloc_allocations{phase=\"Allocated\",reason=\"\"}"
        ),
        Some(1.0)
    );
    assert!(sample(&text, "portalloc_syncs_total{result=\"changed\"}").unwrap() >= 1.0);
    assert!(sample(&text, "portalloc_syncs_total{result=\"refused\"}").unwrap() >= 1.0);
    let syncs = sample(&text, "portalloc_sync_duration_seconds_count").unwrap();
    assert_eq!(
        sample(&text, "portalloc_sync_duration_seconds_bucket{le=\"+Inf\"}"),
        Some(syncs)
    );
    assert!(syncs >= 2.0, "{text}");
    assert_eq!(
        sample(&text, "portalloc_pool_refresh_errors_total"),
        Some(0.0),
        "the shipped role reads pools and shards"
    );

    let (code, lint) = promtool(&["check", "metrics"], &text);
    assert_eq!(code, Some(0), "promtool check metrics:\n{lint}");
    assert!(lint.trim().is_empty(), "{lint}");

    // The pool's status has the same count, by the shipped role.
    let pools: Api<PortPool> = Api::all(client.clone());
    let usage = usage_until(&pools, 2).await;
    assert_eq!((usage.free, usage.largest_free_run), (98, band_run(&text)));

    // The stalled object by name, and only it.
    let stalled =
        r#"portalloc_allocation_stalled{namespace="apps",name="too-big",reason="PoolFull"}"#;
    assert_eq!(sample(&text, stalled), Some(1.0), "{text}");
    assert_eq!(
        samples_of(&text, "portalloc_allocation_stalled"),
        1,
        "{text}"
    );
    // Fixed as GitOps would fix it, through the API: its spec now asks for what fits. Its
    // series goes with the Stalled condition.
    let mut fixed = api.get("too-big").await.unwrap();
    fixed.spec.roles[0].replicas = 2;
    api.replace("too-big", &PostParams::default(), &fixed)
        .await
        .unwrap();
    let text = scrape_until(&watcher, "both objects allocated", |body| {
        sample(
            body,
            r#"portalloc_allocations{phase="Allocated",reason=""}"#,
        ) == Some(2.0)
    })
    .await;
    assert_eq!(
        samples_of(&text, "portalloc_allocation_stalled"),
        0,
        "{text}"
    );
    assert_eq!(sample(&text, stalled), None, "{text}");
    let (code, lint) = promtool(&["check", "metrics"], &text);
    assert_eq!(code, Some(0), "promtool check metrics:\n{lint}");

    // The pool's status counts the same, counted again after the fix; kubectl shows it.
    let usage = usage_until(&pools, 4).await;
    assert_eq!(usage.free, 96);
    assert!((1..=96).contains(&usage.largest_free_run), "{usage:?}");
    let table = Command::new(tools::kubectl())
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(["get", "portpools", "gpu"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    eprintln!("--- kubectl get portpools gpu\n{table}");
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let header = lines[0].join(" ");
    assert!(
        header.contains("SIZE ALLOCATED FREE LARGEST FREE RUN COUNTED"),
        "{table}"
    );
    assert_eq!(
        lines[1][..6],
        ["gpu", "TCP", "[\"30100-30199\"]", "100", "4", "96"],
        "{table}"
    );

    // Nothing changes: nothing is written, though the watcher counts every 10 s.
    let version = pools.get("gpu").await.unwrap().resource_version();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = pools.get("gpu").await.unwrap();
    assert_eq!(after.resource_version(), version, "{:?}", after.status);

    let (code, _) = watcher.terminate();
    assert_eq!(code, Some(0));
}

/// deploy/monitoring.yaml's PrometheusRule as `rules.yaml` and the fixture's unit tests as
/// `rules-test.yaml` in `dir`, the fixture passed through `edit` first.
fn rule_files(dir: &Path, edit: impl FnOnce(&mut serde_yaml::Value)) -> (PathBuf, PathBuf) {
    let manifests =
        std::fs::read_to_string(support::repo_root().join("deploy/monitoring.yaml")).unwrap();
    let rule = serde_yaml::Deserializer::from_str(&manifests)
        .map(|doc| serde_yaml::Value::deserialize(doc).unwrap())
        .find(|doc| doc["kind"] == "PrometheusRule")
        .expect("a PrometheusRule in deploy/monitoring.yaml");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, serde_yaml::to_string(&rule["spec"]).unwrap()).unwrap();
    let fixture = support::repo_root().join("tests/fixtures/prometheus/rules-test.yaml");
    let mut tests: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    edit(&mut tests);
    let test = dir.join("rules-test.yaml");
    std::fs::write(&test, serde_yaml::to_string(&tests).unwrap()).unwrap();
    (rules, test)
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = tempfile::tempdir().unwrap();
    let (rules, test) = rule_files(dir.path(), |_| {});
    let (code, out) = promtool(&["check", "rules", rules.to_str().unwrap()], "");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("SUCCESS: 3 rules found"), "{out}");
    let (code, out) = promtool(&["test", "rules", test.to_str().unwrap()], "");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The stalled-object alert as Prometheus renders it: the fixture expecting no alert at minute
/// 12, promtool fails and prints the alert it got, labels and annotations filled in.
#[test]
fn the_stalled_alert_names_the_object_and_its_reason_as_promtool_renders_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_, test) = rule_files(dir.path(), |tests| {
        let cases = tests["tests"][0]["alert_rule_test"]
            .as_sequence_mut()
            .unwrap();
        let case = cases
            .iter_mut()
            .find(|c| c["alertname"] == "PortAllocationStalled" && c["eval_time"] == "12m")
            .expect("the fixture checks PortAllocationStalled at 12m");
        case["exp_alerts"] = serde_yaml::Value::Sequence(vec![]);
    });
    let (code, out) = promtool(&["test", "rules", test.to_str().unwrap()], "");
    eprintln!("--- promtool test rules, expecting no alert at 12m\n{out}");
    assert_eq!(code, Some(1), "{out}");
    let got = out
        .split_once("got:[")
        .expect("promtool shows the alerts it got")
        .1;
    for rendered in [
        r#"Labels:{alertname="PortAllocationStalled", name="sglang-pd", namespace="llm", reason="PoolFull", severity="warning"}"#,
        r#"summary="PortAllocation llm/sglang-pd stalled for 10 minutes: PoolFull""#,
        r#"description="Its ports cannot be allocated as its spec asks (PoolFull). `kubectl portalloc describe sglang-pd -n llm` says why and what to change.""#,
    ] {
        assert!(got.contains(rendered), "missing {rendered} in\n{out}");
    }
    // One alert for the object, though both watcher replicas export its series.
    assert_eq!(got.matches("Labels:{").count(), 1, "{out}");
}

//! The watcher's `/metrics`, scraped from the process running as the shipped ServiceAccount
//! against a control plane of its own: the figures match the pool and the objects, and
//! `promtool check metrics` (Prometheus' own linter, built pinned) finds nothing to say. The
//! PrometheusRule of deploy/monitoring.yaml is checked and unit-tested with `promtool`.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use portalloc::api::PortAllocation;
use serde::Deserialize;

use crate::support::apply::apply_yaml;
use crate::support::private_cluster::PrivateCluster;
use crate::support::{self, tools};
use crate::watch::{WatcherProcess, service_account_kubeconfig};

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

/// `promtool ARGS` with `input` on stdin: (exit code, stdout + stderr).
fn promtool(args: &[&str], input: &str) -> (Option<i32>, String) {
    let mut command = Command::new(tools::test_tool("promtool"));
    command.args(args);
    let out = tools::run_with_input(command, input);
    (out.status.code(), tools::all_output(&out))
}

#[tokio::test]
async fn the_watcher_exports_pool_and_sync_metrics_promtool_accepts() {
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
    service_account_kubeconfig(
        &client,
        &cluster.kubeconfig,
        "portalloc-system",
        "portalloc-watcher",
        &kubeconfig,
    )
    .await;

    // One object that fits (2 ports) and one the pool can never hold (PoolFull, Stalled).
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), "apps");
    for (name, replicas) in [("fits", 2), ("too-big", 500)] {
        let yaml = support::simple_allocation(name, "gpu", "web", replicas, &["http"]);
        let pa: PortAllocation = serde_yaml::from_str(&yaml).unwrap();
        api.create(&PostParams::default(), &pa).await.unwrap();
    }
    let watcher = WatcherProcess::start(&kubeconfig);
    let started = Instant::now();
    let text = loop {
        let answer = watcher.get("/metrics").unwrap_or_default();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_default();
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
        if allocated == 2.0 && stalled == Some(1.0) {
            assert!(head.contains("text/plain; version=0.0.4"), "{head}");
            break body.to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "metrics never showed 2 ports held and 1 stalled object:\n{answer}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
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
    let (code, _) = watcher.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = tempfile::tempdir().unwrap();
    let manifests =
        std::fs::read_to_string(support::repo_root().join("deploy/monitoring.yaml")).unwrap();
    let rule = serde_yaml::Deserializer::from_str(&manifests)
        .map(|doc| serde_yaml::Value::deserialize(doc).unwrap())
        .find(|doc| doc["kind"] == "PrometheusRule")
        .expect("a PrometheusRule in deploy/monitoring.yaml");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, serde_yaml::to_string(&rule["spec"]).unwrap()).unwrap();
    let test = dir.path().join("rules-test.yaml");
    std::fs::copy(
        support::repo_root().join("tests/fixtures/prometheus/rules-test.yaml"),
        &test,
    )
    .unwrap();
    let (code, out) = promtool(&["check", "rules", rules.to_str().unwrap()], "");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("SUCCESS: 2 rules found"), "{out}");
    let (code, out) = promtool(&["test", "rules", test.to_str().unwrap()], "");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

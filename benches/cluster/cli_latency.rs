//! Cell 2e: `kubectl portalloc get -A` beside `kubectl get portallocations -A`, and the
//! plugin's start-up time.

use std::process::Command;
use std::time::Duration;

use anyhow::ensure;
use kube::Client;

use crate::controlplane::ControlPlane;
use crate::report::{dash, yes_no};
use crate::{Row, Scale, cli, workload};

pub(crate) async fn cli_latency(
    plane: &ControlPlane,
    admin: &Client,
    scale: &Scale,
) -> anyhow::Result<Vec<Row>> {
    let (ns, pool) = ("listing", "listing");
    workload::create_namespace(admin, ns).await?;
    workload::create_pool(admin, pool, "50000-59999").await?;
    let clients = plane.clients(4).await?;
    let cell = workload::run_ours(&clients, ns, pool, "job", scale.get_objects, 4).await;
    ensure!(
        cell.failures.is_empty(),
        "listing setup: {:?}",
        cell.failures
    );

    let kubeconfig = plane.kubeconfig.clone();
    let cache = tempfile::tempdir()?;
    let ours = || cli::command(&kubeconfig, &["get", "-A"]);
    let theirs = || {
        let mut command = Command::new(cli::KUBECTL);
        command
            .args(["get", "portallocations", "-A", "--cache-dir"])
            .arg(cache.path())
            .env("KUBECONFIG", &kubeconfig);
        command
    };
    let kubectl = cli::kubectl_available();
    // One warm-up each (kubectl fills its discovery cache), then alternate so drift hits both.
    cli::time_runs(1, ours);
    if kubectl {
        cli::time_runs(1, theirs);
    }
    let mut ours_times = Vec::new();
    let mut theirs_times = Vec::new();
    for _ in 0..scale.cli_runs {
        ours_times.extend(cli::time_runs(1, ours));
        if kubectl {
            theirs_times.extend(cli::time_runs(1, theirs));
        }
    }
    let help = cli::time_runs(scale.help_runs, || cli::command(&kubeconfig, &["--help"]));
    let binary = if cli::is_release_binary() {
        "release binary"
    } else {
        "debug binary: not representative"
    };
    let ours_ms = median_ms(&ours_times);
    let (anchor, ratio, met) = if kubectl {
        let theirs_ms = median_ms(&theirs_times);
        let ratio = ours_ms / theirs_ms;
        (
            format!("`kubectl get portallocations -A`: {theirs_ms:.0} ms"),
            format!("{ratio:.2}"),
            yes_no(ratio <= 0.5),
        )
    } else {
        ("n/a (no /usr/bin/kubectl)".into(), dash(), dash())
    };
    Ok(vec![
        Row {
            id: "2e",
            what: format!(
                "`kubectl portalloc get -A` on {} PortAllocations, median of {} runs ({binary})",
                scale.get_objects, scale.cli_runs
            ),
            ours: format!("{ours_ms:.0} ms"),
            anchor,
            ratio,
            target: "≤ 0.5".into(),
            met,
        },
        Row {
            id: "2e",
            what: format!(
                "`kubectl-portalloc --help` start-up, median of {} runs ({binary})",
                scale.help_runs
            ),
            ours: format!(
                "{:.1} ms (first run {:.1} ms)",
                median_ms(&help),
                help[0].as_secs_f64() * 1e3
            ),
            anchor: dash(),
            ratio: dash(),
            target: dash(),
            met: dash(),
        },
    ])
}

fn median_ms(times: &[Duration]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted
        .get(sorted.len() / 2)
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

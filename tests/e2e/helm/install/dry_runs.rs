//! The chart and deploy/ through `kubectl apply --dry-run=server`: every object accepted, the
//! Prometheus Operator's own CRDs validating the monitoring objects.

use std::path::Path;
use std::time::{Duration, Instant};

use super::kubectl;
use crate::helm::{deploy_with_node_agent, documents, show, template_text};
use crate::support::{self, tools};

/// Every option on, the CRDs included: the API server accepts each object (a dry run), with
/// the Prometheus Operator's own schemas for its kinds, which really check: a bad interval is
/// refused. deploy/ too, as `kubectl apply -k deploy` and monitoring.yaml apply it, and with
/// the node agent's component.
pub(super) fn dry_runs(admin: &Path, dir: &Path) {
    let crds = tools::prometheus_operator_crds();
    let applied = kubectl(
        admin,
        &["apply", "--server-side", "-f", crds.to_str().unwrap()],
    );
    assert!(applied.status.success(), "{}", show(&applied));
    // Polled: `kubectl wait` fails on a CRD that has no conditions yet instead of waiting.
    for crd in [
        "servicemonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
    ] {
        let started = Instant::now();
        loop {
            let output = kubectl(
                admin,
                &[
                    "get",
                    "crd",
                    crd,
                    "-o",
                    r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#,
                ],
            );
            if String::from_utf8_lossy(&output.stdout).trim() == "True" {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "CRD {crd} never Established: {}",
                show(&output)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    let rendered = template_text(
        &[
            "monitoring.serviceMonitor.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "argocd.healthChecks.enabled=true",
            "watchNamespace=apps",
            "nodeAgent.enabled=true",
            "nodeAgent.cgroupDriver=systemd",
        ],
        &["--include-crds"],
    );
    let objects = documents(&rendered);
    let file = dir.join("rendered.yaml");
    std::fs::write(&file, &rendered).unwrap();
    let dry_run = |file: &Path| {
        kubectl(
            admin,
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "-f",
                file.to_str().unwrap(),
            ],
        )
    };
    let output = dry_run(&file);
    let text = show(&output);
    assert!(output.status.success(), "dry run of the chart: {text}");
    assert_eq!(
        text.matches("(server dry run)").count(),
        objects.len(),
        "one line per object: {text}"
    );
    let kinds: Vec<&str> = text
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .filter_map(|l| l.split('/').next())
        .collect();
    for kind in [
        "customresourcedefinition.apiextensions.k8s.io",
        "deployment.apps",
        "poddisruptionbudget.policy",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io",
        "servicemonitor.monitoring.coreos.com",
        "prometheusrule.monitoring.coreos.com",
        "configmap",
        "role.rbac.authorization.k8s.io",
        "daemonset.apps",
    ] {
        assert!(kinds.contains(&kind), "no {kind} applied: {text}");
    }
    let broken = dir.join("broken.yaml");
    std::fs::write(
        &broken,
        rendered.replace("interval: 30s", "interval: often"),
    )
    .unwrap();
    let output = dry_run(&broken);
    assert!(
        !output.status.success() && show(&output).contains("interval"),
        "a ServiceMonitor with a bad interval passed: {}",
        show(&output)
    );

    let output = kubectl(
        admin,
        &["apply", "--server-side", "--dry-run=server", "-k", "deploy"],
    );
    assert!(
        output.status.success(),
        "dry run of deploy/: {}",
        show(&output)
    );
    assert!(show(&output).contains("poddisruptionbudget.policy/portalloc-watcher"));
    let overlay = deploy_with_node_agent(&dir.join("with-node-agent"));
    let output = kubectl(
        admin,
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-k",
            overlay.to_str().unwrap(),
        ],
    );
    assert!(
        output.status.success(),
        "dry run of deploy/ with the node-agent component: {}",
        show(&output)
    );
    assert!(
        show(&output).contains("daemonset.apps/portalloc-node-agent"),
        "{}",
        show(&output)
    );
    let output = dry_run(&support::repo_root().join("deploy/monitoring.yaml"));
    assert!(
        output.status.success(),
        "dry run of deploy/monitoring.yaml: {}",
        show(&output)
    );
}

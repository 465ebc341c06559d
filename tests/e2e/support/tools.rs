//! Go-built tools the tests run as processes, each built once from its pinned Go module by a
//! script of ours (cached by the pins) and found through the directory the script prints.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::repo_root;

/// The last line a build script prints: the directory holding what it built.
fn built_by(script: &str) -> PathBuf {
    let output = Command::new(repo_root().join("scripts").join(script))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{script}: {e}"));
    assert!(output.status.success(), "scripts/{script} failed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(stdout.lines().last().expect("a bin dir").trim())
}

/// kubectl, built by `scripts/build-krew.sh`.
pub fn kubectl() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| built_by("build-krew.sh"))
        .join("kubectl")
}

/// kstatus, argocd-lua and promtool, built by `scripts/build-test-tools.sh`.
pub fn test_tool(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| built_by("build-test-tools.sh"))
        .join(name)
}

/// celcost: the API server's own CEL cost estimates for our CRDs, built by
/// `scripts/build-celcost.sh` (the script prints the binary's path).
pub fn celcost() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built_by("build-celcost.sh")).clone()
}

/// Run `command` with `input` on its standard input, to completion.
pub fn run_with_input(mut command: Command, input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Its stdout and stderr, one after the other.
pub fn all_output(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Helm, built by `scripts/build-helm.sh` (the script prints the binary's path).
pub fn helm() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built_by("build-helm.sh")).clone()
}

/// The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, from its Go module by
/// `scripts/fetch-prometheus-operator-crds.sh` (the script prints their directory).
pub fn prometheus_operator_crds() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| built_by("fetch-prometheus-operator-crds.sh"))
        .clone()
}

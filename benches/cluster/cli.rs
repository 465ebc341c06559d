//! Running the `kubectl-portalloc` binary (and kubectl) as users do, and timing it.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary cargo built next to this benchmark: the release profile under `cargo bench`
/// (LTO, as shipped), the dev profile under `cargo test --bench cluster`.
pub const BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");

pub const KUBECTL: &str = "/usr/bin/kubectl";

pub fn is_release_binary() -> bool {
    Path::new(BIN)
        .components()
        .any(|c| c.as_os_str() == "release")
}

pub fn command(kubeconfig: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    command
}

pub fn run(kubeconfig: &Path, args: &[&str]) -> Output {
    command(kubeconfig, args)
        .output()
        .expect("run kubectl-portalloc")
}

/// Runs `make()` `runs` times, each to completion with its output discarded; panics on failure.
pub fn time_runs(runs: usize, mut make: impl FnMut() -> Command) -> Vec<Duration> {
    (0..runs)
        .map(|_| {
            let mut command = make();
            command.stdout(Stdio::null()).stderr(Stdio::piped());
            let started = Instant::now();
            let output = command.output().expect("spawn");
            let elapsed = started.elapsed();
            assert!(
                output.status.success(),
                "{command:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            elapsed
        })
        .collect()
}

pub fn kubectl_available() -> bool {
    Path::new(KUBECTL).is_file()
}

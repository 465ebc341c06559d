//! Running the `kubectl-portalloc` binary as a process, as users and scripts do.

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");

/// What one run printed and how it ended.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.code == 0
    }
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Run the plugin against the test cluster's kubeconfig.
pub fn run(args: &[&str]) -> Run {
    run_with(&super::cluster().kubeconfig, args)
}

/// Run the plugin with `input` on standard input.
pub fn run_stdin(args: &[&str], input: &str) -> Run {
    run_full(&super::cluster().kubeconfig, args, Some(input))
}

pub fn run_with(kubeconfig: &Path, args: &[&str]) -> Run {
    run_full(kubeconfig, args, None)
}

/// Run the plugin against `kubeconfig` with `input` on standard input.
pub fn run_stdin_with(kubeconfig: &Path, args: &[&str], input: &str) -> Run {
    run_full(kubeconfig, args, Some(input))
}

fn run_full(kubeconfig: &Path, args: &[&str], input: Option<&str>) -> Run {
    let mut child = Command::new(BIN)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kubectl-portalloc");
    if let Some(input) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    let output = child
        .wait_with_output()
        .expect("wait for kubectl-portalloc");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

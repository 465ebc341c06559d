//! Help with examples for every subcommand, completion scripts (and kubectl's plugin
//! completion), and output to a closed pipe.

use std::io::Read;
use std::process::{Command, Stdio};

use super::setup;
use crate::support::{self, cli};

#[tokio::test]
async fn every_subcommand_has_help_with_examples() {
    let subcommands = [
        vec!["install"],
        vec!["pool"],
        vec!["pool", "create"],
        vec!["pool", "get"],
        vec!["pool", "describe"],
        vec!["pool", "delete"],
        vec!["create"],
        vec!["sync"],
        vec!["get"],
        vec!["describe"],
        vec!["resolve"],
        vec!["release"],
        vec!["delete"],
        vec!["import"],
        vec!["completion"],
        vec!["version"],
    ];
    for sub in subcommands {
        let mut args = sub.clone();
        args.push("--help");
        let output = Command::new(cli::BIN).args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{sub:?} --help failed");
        assert!(
            text.contains("Examples:"),
            "{sub:?} --help has no examples:\n{text}"
        );
    }
    let top = Command::new(cli::BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&top.stdout);
    for flag in [
        "--kubeconfig",
        "--context",
        "--namespace",
        "--request-timeout",
        "--v",
    ] {
        assert!(text.contains(flag), "global flag {flag} missing");
    }
}

#[tokio::test]
async fn completion_scripts_and_kubectl_plugin_completion() {
    let (_, ns, pool, _) = setup("completion", "34400-34499").await;
    for shell in ["bash", "zsh", "fish"] {
        let run = cli::run(&["completion", shell]);
        assert!(
            run.ok() && run.stdout.contains("kubectl-portalloc") && run.stdout.len() > 1000,
            "{shell}: {run}"
        );
    }
    let script = cli::run(&["completion", "kubectl-plugin"]);
    assert!(script.stdout.starts_with("#!/bin/sh") && script.stdout.contains("__complete \"$@\""));

    // What kubectl 1.26+ asks the kubectl_complete-portalloc executable: the words, last one partial.
    let complete = |words: &[&str]| {
        let mut args = vec!["__complete"];
        args.extend(words);
        cli::run(&args).stdout
    };
    let subcommands = complete(&["re"]);
    assert_eq!(subcommands, "release\nrepair\nresolve\n:4\n");
    let names = complete(&["resolve", "-n", &ns, ""]);
    assert_eq!(names, "pd\n:4\n");
    let roles = complete(&["resolve", "pd", "-n", &ns, "--role", "d"]);
    assert_eq!(roles, "decode\n:4\n");
    let pools = complete(&["pool", "describe", &pool[..pool.len() - 2]]);
    assert_eq!(pools, format!("{pool}\n:4\n"));
    let flags = complete(&["get", "--all-n"]);
    assert_eq!(flags, "--all-namespaces\n:4\n");
    // Closed sets complete to exactly what the subcommand accepts.
    assert_eq!(
        complete(&["get", "-o", ""]),
        "json\nname\ntable\nwide\nyaml\n:4\n"
    );
    assert_eq!(complete(&["resolve", "pd", "-o", "e"]), "env\nexport\n:4\n");
    assert_eq!(
        complete(&["pool", "create", "x", "--protocol", ""]),
        "SCTP\nTCP\nUDP\n:4\n"
    );
    assert_eq!(
        complete(&["completion", ""]),
        "bash\nfish\nkubectl-plugin\nzsh\n:4\n"
    );
    let files = complete(&["create", "-f", ""]);
    assert_eq!(files, ":0\n", "file names are the shell's job");

    // The binary answers the same protocol when installed under kubectl's name for it.
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("kubectl_complete-portalloc");
    std::os::unix::fs::symlink(cli::BIN, &link).unwrap();
    let output = Command::new(&link)
        .args(["resolve", "-n", &ns, "p"])
        .env("KUBECONFIG", &support::cluster().kubeconfig)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "pd\n:4\n");
}

#[tokio::test]
async fn output_to_a_closed_pipe_ends_quietly() {
    let _ = setup("pipe", "34500-34599").await;
    // `kubectl portalloc completion bash | head -1`: the reader leaves after one line.
    let mut child = Command::new(cli::BIN)
        .args(["completion", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // stdout is dropped here, closing the pipe mid-output.
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let shell = Command::new("sh")
        .arg("-c")
        .arg(format!("'{}' get -A -o yaml | head -n 1", cli::BIN))
        .env("KUBECONFIG", &support::cluster().kubeconfig)
        .output()
        .unwrap();
    assert!(shell.status.success());
    assert!(!String::from_utf8_lossy(&shell.stderr).contains("panicked"));
}

//! Every example of every `--help`, run as written: through bash, with the real kubectl finding
//! the plugin on PATH, against a control plane of its own, in the order a newcomer follows them
//! (install, pools, allocations, reading them, repair, deleting). An example that cannot run
//! here is listed in `NOT_RUN` with the test that covers it instead; a new example is run
//! unless it is listed, so help text cannot drift from what the plugin does.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::private_cluster::PrivateCluster;
use crate::support::{self, cli, tools};

/// Subcommands in the order their examples run. Every subcommand `--help` lists must be here.
const ORDER: &[&str] = &[
    "",
    "install",
    "pool",
    "pool create",
    "pool get",
    "pool describe",
    "create",
    "get",
    "describe",
    "resolve",
    "diff",
    "sync",
    "release",
    "import",
    "repair",
    "pool delete",
    "delete",
    "node-agent",
    "completion",
    "version",
];

/// Examples not run here, by their first words, and why.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "kubectl portalloc node-agent",
        "needs root, BPF and a node's cgroups: tests/node runs the agent",
    ),
    (
        "kubectl portalloc sync --watch",
        "serves until stopped on fixed addresses: tests/e2e/watch.rs runs it on free ports",
    ),
    (
        "kubectl-portalloc completion zsh",
        "zsh syntax (${fpath[1]}): verbs::help checks the zsh script",
    ),
];

/// Plugin commands run before an example, for the state it assumes (a pool to delete, say).
const GIVEN: &[(&str, &[&[&str]])] = &[
    (
        "kubectl portalloc delete sglang-pd -n llm --dry-run=server",
        &[&["create", "-f", "sglang-pd.yaml"]],
    ),
    (
        "kubectl portalloc pool delete old-pool",
        &[&["pool", "create", "old-pool", "--range", "19000-19099"]],
    ),
    (
        "kubectl portalloc pool delete old-pool --force",
        &[
            &["pool", "create", "old-pool", "--range", "19000-19099"],
            &["create", "-f", "old-pool-user.yaml"],
        ],
    ),
];

/// Exit codes an example may end with besides 0 (`repair` says 10 when it has something to say).
const ALSO_OK: &[(&str, &[i32])] = &[
    ("kubectl portalloc repair", &[10]),
    // Until `pool create` of an identical existing pool says it is unchanged (issue 41, goal 4).
    (
        "kubectl portalloc pool create default --range 20000-20999",
        &[4],
    ),
];

/// The PortAllocation most examples name, as in examples/quickstart.yaml, drawing from `default`.
fn sglang_pd() -> String {
    let quickstart =
        std::fs::read_to_string(support::repo_root().join("examples/quickstart.yaml")).unwrap();
    let allocation = quickstart
        .split("---\n")
        .find(|doc| doc.contains("kind: PortAllocation"))
        .expect("quickstart.yaml has a PortAllocation");
    allocation.replace("pool: quickstart", "pool: default")
}

/// The pool `create -f pool.yaml --force` changes: `default` as the examples make it, with its
/// static band spelled out.
const POOL: &str = "apiVersion: portalloc.dev/v1alpha1
kind: PortPool
metadata: {name: default}
spec:
  ranges: [\"20000-20999\"]
  staticBand: Auto
";

/// A second PortAllocation, in a subdirectory of `manifests/` (`create -f manifests/ -R`).
const VLLM_RAY: &str = "apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: vllm-ray}
spec:
  pool: default
  roles:
  - name: head
    replicas: 1
    ports:
    - {name: gcs, scope: RoleScoped, env: RAY_GCS_PORT}
";

const OLD_POOL_USER: &str = "apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: old-pool-user}
spec:
  pool: old-pool
  roles:
  - name: web
    replicas: 1
    ports:
    - {name: http, scope: RoleScoped, env: WEB_PORT}
";

fn help(path: &str) -> String {
    let mut args: Vec<&str> = path.split_whitespace().collect();
    args.push("--help");
    let output = Command::new(cli::BIN).args(&args).output().unwrap();
    assert!(output.status.success(), "{path} --help failed");
    String::from_utf8(output.stdout).unwrap()
}

/// The subcommands a `--help` lists under "Commands:".
fn subcommands(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        // A description wrapped onto the next line is indented further than the names.
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        // clap's own `help` subcommand has no --help of its own.
        .filter(|name| name != "help")
        .collect()
}

/// The command lines under "Examples:": indented two spaces, not a comment. An example that
/// clap wrapped (too long for the help's width) would run cut short, so it fails here.
fn examples(path: &str, text: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let mut previous_was_example = false;
    for line in text.lines().skip_while(|l| !l.starts_with("Examples:")) {
        let trimmed = line.trim();
        let indented = line.starts_with("  ") && !trimmed.starts_with('#');
        if indented && trimmed.contains("kubectl") {
            found.push(trimmed.to_string());
            previous_was_example = true;
            continue;
        }
        assert!(
            !(previous_was_example && indented && !trimmed.is_empty()),
            "`{path} --help`: the example `{}` is wrapped onto `{trimmed}`: keep examples under 98 columns",
            found.last().unwrap()
        );
        previous_was_example = false;
    }
    found
}

fn starts_with_words(line: &str, prefix: &str) -> bool {
    line == prefix || line.starts_with(&format!("{prefix} "))
}

#[tokio::test]
async fn every_help_example_runs_as_written() {
    // Every subcommand is in ORDER, and ORDER names only subcommands there are.
    let top = help("");
    let mut listed: Vec<String> = subcommands(&top).into_iter().collect();
    for group in subcommands(&top) {
        let inner = subcommands(&help(&group));
        listed.extend(inner.into_iter().map(|s| format!("{group} {s}")));
    }
    for path in &listed {
        assert!(
            ORDER.contains(&path.as_str()),
            "`{path}` is not in help_examples::ORDER"
        );
    }
    for path in ORDER.iter().filter(|p| !p.is_empty()) {
        assert!(
            listed.iter().any(|l| l == path),
            "`{path}` is no subcommand"
        );
    }

    let Some(cluster) = PrivateCluster::start("help-examples", false) else {
        return;
    };
    let client = cluster.client().await;
    support::create_namespace(&client, "llm").await;
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let bin = dir.join("bin");
    let home = dir.join("home");
    for sub in ["bin", "home/.local/bin", "home/.config/fish/completions"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    symlink(tools::kubectl(), bin.join("kubectl")).unwrap();
    symlink(cli::BIN, bin.join("kubectl-portalloc")).unwrap();
    // The examples' namespace (`-n llm`) is also the kubeconfig's, as a user's would be.
    let kubeconfig = dir.join("kubeconfig");
    std::fs::copy(&cluster.kubeconfig, &kubeconfig).unwrap();
    let set_ns = Command::new(tools::kubectl())
        .args(["config", "set-context", "--current", "--namespace", "llm"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(set_ns.status.success(), "{set_ns:?}");
    std::fs::write(dir.join("sglang-pd.yaml"), sglang_pd()).unwrap();
    std::fs::write(dir.join("rendered.yaml"), sglang_pd()).unwrap();
    std::fs::write(dir.join("old-pool-user.yaml"), OLD_POOL_USER).unwrap();
    std::fs::write(dir.join("pool.yaml"), POOL).unwrap();
    std::fs::create_dir_all(dir.join("manifests/team")).unwrap();
    std::fs::write(dir.join("manifests/sglang-pd.yaml"), sglang_pd()).unwrap();
    std::fs::write(dir.join("manifests/team/vllm-ray.yaml"), VLLM_RAY).unwrap();
    std::fs::copy(
        support::repo_root().join("tests/fixtures/rbg/v1alpha2-pd.yaml"),
        dir.join("rbg.yaml"),
    )
    .unwrap();

    let mut ran = Vec::new();
    for path in ORDER {
        for line in examples(path, &help(path)) {
            if NOT_RUN.iter().any(|(p, _)| starts_with_words(&line, p)) {
                continue;
            }
            for given in GIVEN.iter().filter(|(l, _)| *l == line).flat_map(|g| g.1) {
                let mut args = vec!["--kubeconfig", kubeconfig.to_str().unwrap()];
                args.extend_from_slice(given);
                let run = Command::new(cli::BIN)
                    .args(&args)
                    .current_dir(dir)
                    .output()
                    .unwrap();
                assert!(
                    run.status.success(),
                    "given {given:?} for `{line}`: {run:?}"
                );
            }
            // `eval "$(cmd)"` and `source <(cmd)` succeed whatever cmd does: run cmd alone too.
            if let Some(start) = line.find("$(").or_else(|| line.find("<(")) {
                let inner = &line[start + 2..line.rfind(')').unwrap()];
                let code = run_example(inner, dir, &bin, &home, &kubeconfig);
                assert!(
                    code.0 == 0,
                    "`{line}`: `{inner}` exited {}:\n{}",
                    code.0,
                    code.1
                );
            }
            let code = run_example(&line, dir, &bin, &home, &kubeconfig);
            let also = ALSO_OK
                .iter()
                .find(|(p, _)| *p == line)
                .map_or(&[][..], |a| a.1);
            assert!(
                code.0 == 0 || also.contains(&code.0),
                "`{path} --help` example `{line}` exited {}:\n{}",
                code.0,
                code.1
            );
            ran.push(line);
        }
    }
    eprintln!("ran {} help examples:\n  {}", ran.len(), ran.join("\n  "));
    assert!(ran.len() >= 30, "only {} examples ran", ran.len());
}

/// Run one example line with bash; a watch (`-w`) runs for a few seconds and must print before
/// it is stopped.
fn run_example(
    line: &str,
    dir: &Path,
    bin: &Path,
    home: &Path,
    kubeconfig: &Path,
) -> (i32, String) {
    let watches = line.split_whitespace().any(|w| w == "-w" || w == "--watch");
    let script = if watches {
        format!("timeout {} {line}", Duration::from_secs(5).as_secs())
    } else {
        line.to_string()
    };
    let output = Command::new("bash")
        .args(["-o", "pipefail", "-c", &script])
        .current_dir(dir)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("HOME", home)
        .env("KUBECONFIG", kubeconfig)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = format!(
        "--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let code = output.status.code().unwrap_or(-1);
    if watches && code == 124 && !output.stdout.is_empty() {
        return (0, text);
    }
    (code, text)
}

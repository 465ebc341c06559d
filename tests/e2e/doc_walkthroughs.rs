//! Command blocks of the docs run as written, through bash with the real kubectl (and the
//! plugin on its PATH), against a control plane of their own, with what they print compared to
//! what the docs say they print.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use crate::support::private_cluster::PrivateCluster;
use crate::support::{self, cli, tools};

/// The command lines of the `n`th ```sh block of a Markdown file, a trailing `\` joining lines.
fn sh_block(file: &str, n: usize) -> Vec<String> {
    let text = std::fs::read_to_string(support::repo_root().join(file)).unwrap();
    let block: Vec<&str> = text
        .split("```sh\n")
        .nth(n + 1)
        .unwrap_or_else(|| panic!("{file} has no sh block {n}"))
        .split("\n```")
        .next()
        .unwrap()
        .lines()
        .collect();
    let mut commands = Vec::new();
    let mut pending = String::new();
    for line in block {
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        if !pending.trim().is_empty() {
            commands.push(std::mem::take(&mut pending));
        }
        pending.clear();
    }
    commands
}

/// A working directory holding the repository's crds/ and examples/ (so a doc's relative paths
/// resolve) and a bin/ with kubectl and the plugin.
struct Shell {
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
}

impl Shell {
    fn new(cluster: &PrivateCluster) -> Shell {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        symlink(tools::kubectl(), dir.path().join("bin/kubectl")).unwrap();
        symlink(cli::BIN, dir.path().join("bin/kubectl-portalloc")).unwrap();
        for shared in ["crds", "examples"] {
            symlink(support::repo_root().join(shared), dir.path().join(shared)).unwrap();
        }
        Shell {
            dir,
            kubeconfig: cluster.kubeconfig.clone(),
        }
    }

    /// Run one line; panics with what it printed unless it exits 0.
    fn run(&self, line: &str) -> String {
        let bin: &Path = &self.dir.path().join("bin");
        let output = Command::new("bash")
            .args(["-o", "pipefail", "-c", line])
            .current_dir(self.dir.path())
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "`{line}` exited {}:\n--- stdout\n{stdout}--- stderr\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }
}

/// The PHASE and PORTS columns of `kubectl get portallocations`, cut at the header's offsets
/// (an empty cell leaves no word to split on).
fn phases_and_ports(table: &str) -> Vec<(String, String)> {
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    let cell = |line: &str, name: &str| -> String {
        let Some(start) = header.find(name) else {
            return String::new();
        };
        let end = header[start..]
            .find(|c: char| c.is_whitespace())
            .and_then(|w| {
                header[start + w..]
                    .find(|c: char| !c.is_whitespace())
                    .map(|n| start + w + n)
            })
            .unwrap_or(line.len());
        line.get(start..end.min(line.len()))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    lines
        .map(|l| (cell(l, "PHASE"), cell(l, "PORTS")))
        .collect()
}

/// examples/gitops/README.md: kubectl applies the CRDs, the pool and the allocations, the plugin
/// only allocates, and `kubectl get` shows what the comments say.
#[tokio::test]
async fn the_gitops_walkthrough_runs_as_written() {
    let Some(cluster) = PrivateCluster::start("doc-gitops", false) else {
        return;
    };
    let shell = Shell::new(&cluster);
    let mut gets = Vec::new();
    for line in sh_block("examples/gitops/README.md", 0) {
        let out = shell.run(&line);
        if line.starts_with("kubectl get portallocations") {
            gets.push(phases_and_ports(&out));
        }
        if line.starts_with("kubectl apply --server-side -f crds/") {
            shell.run("kubectl wait --for condition=established --timeout 60s crd --all");
        }
    }
    assert_eq!(gets.len(), 2, "the walkthrough's two `kubectl get`");
    assert!(
        gets[0].iter().all(|(phase, _)| phase == "Pending"),
        "before sync (the walkthrough says PHASE Pending): {:?}",
        gets[0]
    );
    let mut after: Vec<String> = gets[1]
        .iter()
        .map(|(phase, ports)| format!("{phase} {ports}"))
        .collect();
    after.sort();
    assert_eq!(after, ["Allocated 3/3", "Allocated 5/5"], "after sync");
    // The comment beside the second `kubectl get` says the same.
    let walkthrough =
        std::fs::read_to_string(support::repo_root().join("examples/gitops/README.md")).unwrap();
    assert!(walkthrough.contains("# PORTS 5/5 and 3/3, PHASE Allocated"));
}

/// docs/node-agent.md: a pool created with `--guard Audit`, then switched to Enforce by
/// `kubectl patch`, as the guide rolls a guard out.
#[tokio::test]
async fn the_node_agent_guide_sets_the_guard_as_written() {
    let Some(cluster) = PrivateCluster::start("doc-guard", true) else {
        return;
    };
    let shell = Shell::new(&cluster);
    let text = std::fs::read_to_string(support::repo_root().join("docs/node-agent.md")).unwrap();
    let blocks = text.matches("```sh\n").count();
    let mut guard_lines = Vec::new();
    for n in 0..blocks {
        guard_lines.extend(
            sh_block("docs/node-agent.md", n)
                .into_iter()
                .filter(|l| l.contains("portpool gpu") || l.contains("pool create gpu")),
        );
    }
    assert_eq!(guard_lines.len(), 2, "{guard_lines:?}");
    shell.run(&guard_lines[0]);
    let audit = shell.run("kubectl get portpool gpu -o jsonpath={.spec.guard}");
    assert_eq!(audit, "Audit");
    shell.run(&guard_lines[1]);
    let enforce = shell.run("kubectl get portpool gpu -o jsonpath={.spec.guard}");
    assert_eq!(enforce, "Enforce");
}

/// The pool and PortAllocation of docs/gitops.md's dry-run samples: a router and `decode` pods.
fn gitops_pd(decode: u32) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1
kind: PortPool
metadata: {{name: dev}}
spec:
  ranges: [\"26000-26099\"]
---
apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {{name: pd}}
spec:
  pool: dev
  roles:
  - name: router
    replicas: 1
    ports:
    - {{name: http, scope: PodScoped, env: ROUTER_PORT}}
  - name: decode
    replicas: {decode}
    ports:
    - {{name: rpc, scope: PodScoped, env: RPC_PORT}}
"
    )
}

/// docs/gitops.md's `console` blocks of dry runs and diffs, each `$ command` with the lines it
/// prints, are what the plugin prints for the state the doc describes (2 decode pods held).
#[tokio::test]
async fn the_gitops_dry_run_samples_are_what_the_plugin_prints() {
    let Some(cluster) = PrivateCluster::start("doc-dry-run", true) else {
        return;
    };
    let shell = Shell::new(&cluster);
    for (file, decode) in [("pd-1.yaml", 1), ("pd-2.yaml", 2), ("pd-4.yaml", 4)] {
        std::fs::write(shell.dir.path().join(file), gitops_pd(decode)).unwrap();
    }
    shell.run("kubectl portalloc create -f pd-2.yaml");
    let text = std::fs::read_to_string(support::repo_root().join("docs/gitops.md")).unwrap();
    let mut compared = 0;
    for block in text.split("```console\n").skip(1) {
        let block = block.split("\n```").next().unwrap();
        let mut command: Option<&str> = None;
        let mut expected: Vec<&str> = Vec::new();
        let check = |command: &str, expected: &[&str]| {
            // `diff` exits 1 when something would change: the doc shows it with `echo`.
            let printed = shell.run(&format!("{command} || true"));
            let printed: Vec<&str> = printed.lines().collect();
            assert_eq!(printed, expected, "docs/gitops.md: `$ {command}`");
        };
        for line in block.lines() {
            if let Some(next) = line.strip_prefix("$ ") {
                if let Some(previous) = command.replace(next) {
                    check(previous, &expected);
                    compared += 1;
                }
                expected.clear();
            } else {
                expected.push(line);
            }
        }
        if let Some(last) = command {
            check(last, &expected);
            compared += 1;
        }
    }
    assert_eq!(compared, 3, "the dry run and the two diffs");
}

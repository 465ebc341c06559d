//! The watcher from the image's root filesystem: under chroot as UID 65532, with in-cluster
//! configuration as the ServiceAccount `deploy/watcher.yaml` ships (its ClusterRole and binding
//! applied with kubectl, a TokenRequest token and the CA at the service-account paths). Objects
//! are applied, scaled and deleted with kubectl, as GitOps does.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::chroot::{chroot_command, mount_service_account};
use super::{DEBUG_BIN, Privilege, repo, run_ok, show};

/// kubectl, built from its pinned Go module by `scripts/build-krew.sh` (cached).
pub(crate) fn kubectl(kubeconfig: &Path) -> Command {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let stdout = run_ok(
            "scripts/build-krew.sh",
            Command::new(repo().join("scripts/build-krew.sh")).stderr(Stdio::inherit()),
        );
        PathBuf::from(stdout.lines().last().expect("a bin dir").trim())
    });
    let mut command = Command::new(dir.join("kubectl"));
    command.arg("--kubeconfig").arg(kubeconfig);
    command
}

pub(crate) fn kubectl_stdin(kubeconfig: &Path, args: &[&str], input: &str) {
    let mut child = kubectl(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "kubectl {args:?}");
}

/// Poll a kubectl query until it prints `expected`; the time it took.
fn until(kubeconfig: &Path, args: &[&str], expected: &str) -> Duration {
    let started = Instant::now();
    loop {
        let output = kubectl(kubeconfig).args(args).output().unwrap();
        if String::from_utf8_lossy(&output.stdout).trim() == expected {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "kubectl {args:?} never printed {expected:?}: {}",
            show(&output)
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn ready(admin: &Path, name: &str, ports: &str) -> Duration {
    let query = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.status.ports}";
    until(
        admin,
        &["get", "portallocation", name, "-n", "default", "-o", query],
        &format!("True {ports}"),
    )
}

/// Poll until the pool's shards hold `expected` ports in all (each shard counts its own window).
fn allocated(admin: &Path, expected: usize) -> Duration {
    let args = [
        "get",
        "portpoolshards",
        "--field-selector",
        "spec.pool=quickstart",
        "-o",
        "jsonpath={.items[*].status.allocated}",
    ];
    let started = Instant::now();
    loop {
        let output = kubectl(admin).args(args).output().unwrap();
        let held: usize = String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .filter_map(|n| n.parse::<usize>().ok())
            .sum();
        if output.status.success() && held == expected {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the shards of pool quickstart never held {expected} ports: {}",
            show(&output)
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn manifest(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  pool: quickstart\n  roles:\n  - {{name: worker, replicas: {replicas}, ports: [{{name: rpc, scope: PodScoped, env: RPC_PORT}}]}}\n---\n"
    )
}

/// One watcher process in the root filesystem.
struct Watcher(Child);

impl Watcher {
    fn start(privilege: Privilege, rootfs: &Path, env: &[(&str, &str)]) -> Watcher {
        let child = chroot_command(
            privilege,
            rootfs,
            env,
            &["sync", "--watch", "-A", "-v", "1"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the watcher in chroot");
        Watcher(child)
    }

    fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child (as root, env and chroot exec the binary in place;
        // with sudo, sudo relays the signal).
        unsafe { libc::kill(self.0.id() as i32, signal) };
    }

    /// SIGTERM; the exit status and what it logged.
    fn terminate(mut self) -> String {
        self.signal(libc::SIGTERM);
        let status = self.0.wait().unwrap();
        let mut log = String::new();
        self.0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut log)
            .unwrap();
        assert!(status.success(), "watcher in chroot: {status}: {log}");
        log
    }

    fn kill_9(mut self) {
        self.signal(libc::SIGKILL);
        self.0.wait().unwrap();
    }
}

/// The pool `quickstart` holds `sglang-pd`'s 9 ports before this starts.
pub fn in_the_image(privilege: Privilege, rootfs: &Path, admin: &Path) {
    run_ok(
        "kubectl apply deploy/watcher.yaml",
        kubectl(admin)
            .args(["apply", "--server-side", "-f"])
            .arg(repo().join("deploy/watcher.yaml")),
    );
    let port = mount_service_account(
        admin,
        rootfs,
        "portalloc-system",
        "portalloc-watcher",
        false,
    );
    let env = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", port.as_str()),
    ];

    // Apply, scale, delete.
    let watcher = Watcher::start(privilege, rootfs, &env);
    kubectl_stdin(admin, &["apply", "-f", "-"], &manifest("watched", 2));
    let applied = ready(admin, "watched", "2/2");
    kubectl_stdin(admin, &["apply", "-f", "-"], &manifest("watched", 4));
    let scaled = ready(admin, "watched", "4/4");
    run_ok(
        "kubectl delete",
        kubectl(admin).args(["delete", "portallocation", "watched", "-n", "default"]),
    );
    let freed = allocated(admin, 9);
    eprintln!(
        "image watcher: apply -> Ready {applied:?}, scale -> Ready {scaled:?}, delete -> freed {freed:?}"
    );
    let log = watcher.terminate();
    assert!(
        log.contains("synced") && log.contains("deleted: ports freed"),
        "{log}"
    );

    // kill -9 mid-stream; deletions while no watcher runs; a restart frees them.
    let watcher = Watcher::start(privilege, rootfs, &env);
    let six: String = (0..6).map(|i| manifest(&format!("k{i}"), 2)).collect();
    kubectl_stdin(admin, &["apply", "-f", "-"], &six);
    std::thread::sleep(Duration::from_millis(150));
    watcher.kill_9();
    run_ok(
        "kubectl delete",
        kubectl(admin).args([
            "delete",
            "portallocation",
            "k0",
            "k1",
            "k2",
            "-n",
            "default",
        ]),
    );
    let watcher = Watcher::start(privilege, rootfs, &env);
    for i in 3..6 {
        ready(admin, &format!("k{i}"), "2/2");
    }
    allocated(admin, 9 + 6);

    // A second watcher, eight CLI clients and eight GitOps objects at once.
    let rival = Watcher::start(privilege, rootfs, &env);
    let clients: Vec<Child> = (0..8)
        .map(|i| {
            let mut child = Command::new(DEBUG_BIN)
                .args(["create", "-f", "-"])
                .env("KUBECONFIG", admin)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let text = manifest(&format!("cli{i}"), 3);
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            child
        })
        .collect();
    let eight: String = (0..8).map(|i| manifest(&format!("git{i}"), 2)).collect();
    kubectl_stdin(admin, &["apply", "-f", "-"], &eight);
    for mut client in clients {
        assert!(client.wait().unwrap().success(), "a CLI client failed");
    }
    for i in 0..8 {
        ready(admin, &format!("git{i}"), "2/2");
    }
    allocated(admin, 9 + 6 + 24 + 16);
    // No duplicate, no leak, nothing stale: repair finds nothing to do.
    let repair = Command::new(DEBUG_BIN)
        .args(["repair", "--pool", "quickstart"])
        .env("KUBECONFIG", admin)
        .output()
        .unwrap();
    assert!(repair.status.success(), "{}", show(&repair));
    rival.terminate();
    watcher.terminate();
}

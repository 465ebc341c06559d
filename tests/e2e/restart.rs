//! The API server and etcd crash (SIGKILL) and come back in the middle of a concurrent run, on a
//! control plane of the test's own so the other tests keep theirs.
//!
//! Every client either finishes or exits 6 with a one-line message saying a rerun is safe; the
//! rerun then succeeds. Clients caught mid-allocation retry through the outage. Afterwards no
//! port is held twice and the pool's holders are exactly the live holdings.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portalloc::ledger::recorded_holdings;

use crate::support::cli::BIN;
use crate::support::invariants::{allocations_of, assert_consistent};
use crate::support::private_cluster::PrivateCluster;

const WORKERS: usize = 8;
const JOBS_PER_WORKER: usize = 12;
/// How long the control plane stays down before it is started again.
const DOWN_FOR: Duration = Duration::from_secs(2);

struct Op {
    args: Vec<String>,
    started: Instant,
    ended: Instant,
    code: i32,
    stderr: String,
}

fn run(kubeconfig: &std::path::Path, args: &[String]) -> Op {
    let started = Instant::now();
    let output = Command::new(BIN)
        .args(args)
        .arg("-v")
        .arg("1")
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .output()
        .expect("spawn kubectl-portalloc");
    Op {
        args: args.to_vec(),
        started,
        ended: Instant::now(),
        // A signal shows as 128 + its number, as a shell would report it.
        code: output
            .status
            .code()
            .or_else(|| {
                use std::os::unix::process::ExitStatusExt;
                output.status.signal().map(|s| 128 + s)
            })
            .unwrap_or(-1),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn job(name: &str, replicas: usize) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: {name}\n  namespace: restart\nspec:\n  pool: restart\n  roles:\n  - name: web\n    replicas: {replicas}\n    ports:\n    - {{name: http, scope: PodScoped, env: HTTP_PORT}}\n    - {{name: admin, scope: RoleScoped, env: ADMIN_PORT}}\n"
    )
}

/// The last line of stderr that is not a retry report (`-v 1` prints those as it goes).
fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .rfind(|l| l.starts_with("error:"))
        .unwrap_or("")
}

#[tokio::test]
async fn clients_finish_or_fail_retriably_when_the_api_server_restarts() {
    let Some(cluster) = PrivateCluster::start("restart", true) else {
        return;
    };
    let client = cluster.client().await;
    assert!(
        cluster
            .run(&["pool", "create", "restart", "--range", "22000-22499"])
            .ok()
    );
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "restart"}})).unwrap();
    kube::Api::all(client.clone())
        .create(&Default::default(), &ns)
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let ops: Arc<Mutex<Vec<Op>>> = Arc::default();
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let kubeconfig = cluster.kubeconfig.clone();
            let dir = dir.path().to_path_buf();
            let ops = ops.clone();
            std::thread::spawn(move || {
                // Like a script would: run each step until it succeeds, at most 30 times.
                let step = |args: Vec<String>, tolerate_not_found: bool| {
                    for attempt in 0..30 {
                        let op = run(&kubeconfig, &args);
                        let code = op.code;
                        ops.lock().unwrap().push(op);
                        if code == 0 || (code == 3 && tolerate_not_found && attempt > 0) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(250));
                    }
                    panic!("{args:?} never succeeded");
                };
                for k in 0..JOBS_PER_WORKER {
                    let name = format!("job-{w}-{k}");
                    let path = dir.join(format!("{name}.yaml"));
                    std::fs::write(&path, job(&name, 2 + k % 2)).unwrap();
                    let file = path.to_string_lossy().into_owned();
                    step(vec!["create".into(), "-f".into(), file], false);
                    step(
                        vec!["sync".into(), name.clone(), "-n".into(), "restart".into()],
                        false,
                    );
                    if k % 3 == 2 {
                        // A delete retried after its first try went through finds nothing: fine.
                        let victim = format!("job-{w}-{}", k - 1);
                        step(
                            vec!["delete".into(), victim, "-n".into(), "restart".into()],
                            true,
                        );
                    }
                }
            })
        })
        .collect();

    // Let the clients get going, then crash and restart the whole control plane.
    std::thread::sleep(Duration::from_millis(1500));
    let down_at = Instant::now();
    cluster.stop(true);
    std::thread::sleep(DOWN_FOR);
    cluster.resume();
    let up_at = Instant::now();
    for worker in workers {
        worker.join().expect("a worker gave up");
    }
    let wall = started.elapsed();

    let ops = std::mem::take(&mut *ops.lock().unwrap());
    let failed: Vec<&Op> = ops.iter().filter(|op| op.code != 0).collect();
    let mut unclear = Vec::new();
    for op in &failed {
        let line = error_line(&op.stderr);
        let retried_delete = op.code == 3 && op.args[0] == "delete";
        let clear = op.code == 6 && line.contains("safe") && line.lines().count() == 1;
        if !clear && !retried_delete {
            unclear.push(format!(
                "exit {}: {}: {}",
                op.code,
                op.args.join(" "),
                op.stderr
            ));
        }
    }
    let bridged = ops
        .iter()
        .filter(|op| op.code == 0 && op.started < down_at && op.ended > up_at)
        .count();
    let retried_in_process = ops
        .iter()
        .filter(|op| op.code == 0 && op.stderr.contains("; attempt "))
        .count();
    let exhausted = failed
        .iter()
        .filter(|op| op.stderr.contains("gave up after"))
        .count();
    eprintln!(
        "restart: {} operations by {WORKERS} clients, {} failed retriably (exit 6: {}, of which {exhausted} \
         after in-process retries), {bridged} spanned the outage and succeeded, {retried_in_process} \
         succeeded after in-process retries; control plane down {:.1}s (crash to ready), wall {:.1}s",
        ops.len(),
        failed.len(),
        failed.iter().filter(|op| op.code == 6).count(),
        (up_at - down_at).as_secs_f64(),
        wall.as_secs_f64()
    );
    assert!(
        unclear.is_empty(),
        "failures without a clear retriable message:\n{}",
        unclear.join("\n")
    );
    // The outage was exercised when an operation either failed retriably or was in flight across
    // the whole of it and still succeeded (the in-process retries can bridge a short outage).
    assert!(
        bridged > 0 || failed.iter().any(|op| op.code == 6),
        "the restart was not noticed: no operation spanned the outage or failed retriably"
    );
    let sample = failed
        .iter()
        .find(|op| op.code == 6)
        .map(|op| error_line(&op.stderr).to_string());
    eprintln!("restart: e.g. {}", sample.unwrap_or_default());

    // The state: completed statuses after one sync, leaks (deletes cut short) freed by repair,
    // and then the pool's holders are exactly the live holdings.
    assert!(cluster.run(&["sync", "--all", "-A"]).ok());
    let repair = cluster.run(&["repair", "--apply"]);
    assert!(repair.ok(), "{repair}");
    let holdings = assert_consistent(&client, "restart").await;
    let live = allocations_of(&client, "restart").await;
    assert_eq!(
        live.len(),
        WORKERS * (JOBS_PER_WORKER - JOBS_PER_WORKER / 3)
    );
    for (uid, pa) in &live {
        let recorded = pa
            .status
            .as_ref()
            .map(recorded_holdings)
            .unwrap_or_default();
        assert_eq!(holdings.get(uid), Some(&recorded), "{uid}");
    }
    assert_eq!(holdings.len(), live.len(), "no leaked holder remains");
}

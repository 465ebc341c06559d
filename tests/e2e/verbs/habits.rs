//! kubectl's habits: `create -f` of existing pools and of directories, `pool create` of an
//! existing pool, `-o name` alone on stdout, `-l`, `delete` of several objects and of a
//! manifest's, `--ignore-not-found`, and `get -w`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use portalloc::api::{PortAllocation, PortPool};

use crate::support::{self, cli};

fn pool_doc(name: &str, ranges: &str) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata:\n  name: {name}\nspec:\n  ranges: [\"{ranges}\"]\n"
    )
}

fn labelled(doc: String, labels: &str) -> String {
    doc.replacen(
        "metadata:\n",
        &format!("metadata:\n  labels: {{{labels}}}\n"),
        1,
    )
}

#[tokio::test]
async fn create_f_never_rewrites_a_live_pool_by_surprise() {
    let client = support::client().await;
    let ns = support::namespace(&client, "live-pool").await;
    let pool = support::unique_name("live");
    let run = cli::run_stdin(
        &["create", "-f", "-", "-n", &ns],
        &format!(
            "{}---\n{}",
            pool_doc(&pool, "38100-38199"),
            support::simple_allocation("held", &pool, "web", 1, &["http"])
        ),
    );
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout
            .contains(&format!("portpool.portalloc.dev/{pool} created")),
        "{run}"
    );
    let pools: Api<PortPool> = Api::all(client.clone());
    let version = pools.get(&pool).await.unwrap().resource_version();
    let held = Api::<PortAllocation>::namespaced(client.clone(), &ns)
        .get("held")
        .await
        .unwrap()
        .allocated_values("web", "http")[0];

    // The same spec again: unchanged, nothing written.
    let run = cli::run_stdin(&["create", "-f", "-"], &pool_doc(&pool, "38100-38199"));
    assert!(run.ok(), "{run}");
    assert_eq!(
        run.stdout,
        format!("portpool.portalloc.dev/{pool} unchanged\n"),
        "{run}"
    );

    // Another spec: refused with what differs, the pool as it was.
    let run = cli::run_stdin(&["create", "-f", "-"], &pool_doc(&pool, "38100-38299"));
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr.contains(&format!(
            "PortPool \"{pool}\" already exists and differs (spec.ranges: [\"38100-38199\"] -> [\"38100-38299\"])"
        )),
        "{run}"
    );
    assert_eq!(pools.get(&pool).await.unwrap().resource_version(), version);

    // --force, but the holder's port would leave the pool: refused, the holder named.
    let outside = if held < 38150 {
        "38150-38199"
    } else {
        "38100-38149"
    };
    let run = cli::run_stdin(&["create", "-f", "-", "--force"], &pool_doc(&pool, outside));
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr.contains(&format!(
            "would strand 1 holders: {ns}/held (ports {held}: outside the new ranges or excluded)"
        )),
        "{run}"
    );
    let protocol = pool_doc(&pool, "38100-38199") + "  protocol: UDP\n";
    let run = cli::run_stdin(&["create", "-f", "-", "--force"], &protocol);
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr.contains("the protocol would become UDP"),
        "{run}"
    );
    assert_eq!(pools.get(&pool).await.unwrap().resource_version(), version);

    // --force keeping the holder's port: configured.
    let run = cli::run_stdin(
        &["create", "-f", "-", "--force"],
        &pool_doc(&pool, "38100-38299"),
    );
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout
            .contains(&format!("portpool.portalloc.dev/{pool} configured")),
        "{run}"
    );
    assert!(
        run.stderr.contains(&format!(
            "PortPool \"{pool}\" changes: spec.ranges: [\"38100-38199\"] -> [\"38100-38299\"]"
        )),
        "{run}"
    );
    assert_eq!(
        pools.get(&pool).await.unwrap().spec.ranges[0].0,
        "38100-38299"
    );
}

#[tokio::test]
async fn pool_create_of_an_existing_pool_says_it_exists() {
    let pool = support::unique_name("exists");
    let args = ["pool", "create", &pool, "--range", "38300-38309"];
    let run = cli::run(&args);
    assert!(run.ok(), "{run}");
    let again = cli::run(&args);
    assert!(again.ok(), "{again}");
    assert_eq!(
        again.stdout,
        format!("portpool.portalloc.dev/{pool} unchanged (it already exists with this spec)\n")
    );
    let run = cli::run(&["pool", "create", &pool, "--range", "38300-38319"]);
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr.contains(&format!(
            "PortPool \"{pool}\" already exists and differs (spec.ranges: [\"38300-38309\"] -> [\"38300-38319\"])"
        )),
        "{run}"
    );
    assert!(!run.stderr.contains("overlap"), "{run}");
}

#[tokio::test]
async fn create_f_reads_directories_and_prints_only_names_with_o_name() {
    let client = support::client().await;
    let ns = support::namespace(&client, "create-dir").await;
    let pool = support::unique_name("dir");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a-pool.yaml"),
        pool_doc(&pool, "38400-38419"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.yml"),
        support::simple_allocation("b", &pool, "web", 1, &["http"]),
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let c: serde_json::Value =
        serde_yaml::from_str(&support::simple_allocation("c", &pool, "web", 1, &["http"])).unwrap();
    let c = serde_json::to_string(&c).unwrap();
    std::fs::write(dir.path().join("sub").join("c.json"), c).unwrap();
    let path = dir.path().to_str().unwrap();

    let run = cli::run(&["create", "-f", path, "-n", &ns, "-o", "name"]);
    assert!(run.ok(), "{run}");
    assert_eq!(
        run.stdout,
        format!("portpool.portalloc.dev/{pool}\nportallocation.portalloc.dev/b\n"),
        "{run}"
    );
    assert!(run.stderr.contains("portallocation/b"), "{run}");
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    assert!(api.get_opt("c").await.unwrap().is_none());

    let run = cli::run(&["create", "-f", path, "-R", "-n", &ns, "-o", "name"]);
    assert!(run.ok(), "{run}");
    assert_eq!(
        run.stdout,
        format!(
            "portpool.portalloc.dev/{pool}\nportallocation.portalloc.dev/b\nportallocation.portalloc.dev/c\n"
        ),
        "{run}"
    );
    assert!(api.get_opt("c").await.unwrap().is_some());

    let run = cli::run(&["sync", "b", "-n", &ns, "-o", "name"]);
    assert!(run.ok(), "{run}");
    assert_eq!(run.stdout, "portallocation.portalloc.dev/b\n", "{run}");
    assert!(run.stderr.contains("portallocation/b"), "{run}");

    let empty = tempfile::tempdir().unwrap();
    let run = cli::run(&["create", "-f", empty.path().to_str().unwrap()]);
    assert_eq!(run.code, 7, "{run}");
    assert!(
        run.stderr.contains("no *.yaml, *.yml or *.json files"),
        "{run}"
    );
}

#[tokio::test]
async fn get_and_delete_take_selectors_several_names_and_files() {
    let client = support::client().await;
    let ns = support::namespace(&client, "select").await;
    let pool = support::unique_name("select");
    let docs = [
        labelled(
            support::simple_allocation("a1", &pool, "web", 1, &["http"]),
            "team: a",
        ),
        labelled(
            support::simple_allocation("a2", &pool, "web", 1, &["http"]),
            "team: a",
        ),
        labelled(
            support::simple_allocation("b1", &pool, "web", 1, &["http"]),
            "team: b",
        ),
        support::simple_allocation("c1", &pool, "web", 1, &["http"]),
        support::simple_allocation("c2", &pool, "web", 1, &["http"]),
    ];
    let file = format!(
        "{}---\n{}",
        pool_doc(&pool, "38500-38519"),
        docs.join("---\n")
    );
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &file);
    assert!(run.ok(), "{run}");

    let run = cli::run(&["get", "-n", &ns, "-l", "team=a", "-o", "name"]);
    assert!(run.ok(), "{run}");
    assert_eq!(
        run.stdout,
        "portallocation.portalloc.dev/a1\nportallocation.portalloc.dev/a2\n"
    );
    let run = cli::run(&["get", "gone", "-n", &ns, "--ignore-not-found"]);
    assert!(
        run.ok() && run.stdout.is_empty() && run.stderr.is_empty(),
        "{run}"
    );

    let run = cli::run(&["delete", "-n", &ns, "-l", "team=a", "-o", "name"]);
    assert!(run.ok(), "{run}");
    assert_eq!(
        run.stdout,
        "portallocation.portalloc.dev/a1\nportallocation.portalloc.dev/a2\n"
    );
    let run = cli::run(&["delete", "b1", "c1", "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout
            .contains("portallocation.portalloc.dev/b1 deleted (1 ports released"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("portallocation.portalloc.dev/c1 deleted"),
        "{run}"
    );

    // A missing one fails the command, after the others are deleted; unless ignored.
    let run = cli::run(&["delete", "b1", "-n", &ns]);
    assert_eq!(run.code, 3, "{run}");
    let run = cli::run(&["delete", "b1", "-n", &ns, "--ignore-not-found"]);
    assert!(run.ok(), "{run}");

    // The manifest's objects: c2 (a1, a2, b1, c1 already gone), then the pool, now free.
    let path = std::env::temp_dir().join(format!("{pool}.yaml"));
    std::fs::write(&path, &file).unwrap();
    let path = path.to_str().unwrap();
    let run = cli::run(&[
        "delete",
        "-f",
        path,
        "-n",
        &ns,
        "--ignore-not-found",
        "-o",
        "name",
    ]);
    assert!(run.ok(), "{run}");
    assert_eq!(
        run.stdout,
        format!("portallocation.portalloc.dev/c2\nportpool.portalloc.dev/{pool}\n"),
        "{run}"
    );
    let pools: Api<PortPool> = Api::all(client.clone());
    assert!(pools.get_opt(&pool).await.unwrap().is_none());
    let remaining = Api::<PortAllocation>::namespaced(client, &ns)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        remaining.items.is_empty(),
        "{:?}",
        remaining
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
    );
}

/// A line of the watcher's stdout, or a failure naming what was awaited: the watch is a
/// process of its own, so a missing line must fail the test rather than hang it.
fn next_line(lines: &mpsc::Receiver<String>, what: &str) -> String {
    lines
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("get -w printed no line for {what}"))
}

#[tokio::test]
async fn get_w_prints_the_table_then_a_line_per_change() {
    let client = support::client().await;
    let ns = support::namespace(&client, "get-watch").await;
    let pool = support::unique_name("watch");
    support::create_pool(&pool, "38600-38619");
    let first = support::simple_allocation("first", &pool, "web", 1, &["http"]);
    assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &first).ok());

    let mut child = Command::new(cli::BIN)
        .args(["get", "-w", "-n", &ns])
        .env("KUBECONFIG", &support::cluster().kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    let header = next_line(&lines, "the header");
    assert!(header.starts_with("NAME"), "{header}");
    let row = next_line(&lines, "the first object");
    assert!(row.starts_with("first "), "{row}");

    let second = support::simple_allocation("second", &pool, "web", 1, &["http"]);
    assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &second).ok());
    // Created, then its status written: each change is a line; the last says Allocated.
    let mut seen = next_line(&lines, "the second object");
    while !seen.contains("Allocated") {
        assert!(seen.starts_with("second "), "{seen}");
        seen = next_line(&lines, "the second object allocated");
    }
    assert!(seen.starts_with("second "), "{seen}");
    assert!(cli::run(&["delete", "first", "-n", &ns]).ok());
    let deleted = next_line(&lines, "the deleted object");
    assert!(deleted.starts_with("first "), "{deleted}");
    // Ctrl-C ends it, as a success.
    let interrupt = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupt.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "get -w after Ctrl-C: {status}");
}

#[tokio::test]
async fn a_create_that_fails_part_way_names_what_it_wrote() {
    use k8s_openapi::api::core::v1::Namespace;
    let client = support::client().await;
    let ns = support::namespace(&client, "part-way").await;
    // A namespace being deleted exists, so every check passes, but refuses new objects (no
    // namespace controller runs here to finish the delete: it stays Terminating).
    let closing = support::namespace(&client, "part-way-closing").await;
    Api::<Namespace>::all(client.clone())
        .delete(&closing, &Default::default())
        .await
        .unwrap();
    let pool = support::unique_name("part-way");
    support::create_pool(&pool, "38700-38709");
    let file = format!(
        "{}---\n{}",
        support::simple_allocation("written", &pool, "web", 1, &["http"]).replace(
            "  name: written\n",
            &format!("  name: written\n  namespace: {ns}\n")
        ),
        support::simple_allocation("refused", &pool, "web", 1, &["http"]).replace(
            "  name: refused\n",
            &format!("  name: refused\n  namespace: {closing}\n")
        ),
    );
    let run = cli::run_stdin(&["create", "-f", "-"], &file);
    assert_ne!(run.code, 0, "{run}");
    let error = run.stderr.lines().last().unwrap_or_default();
    assert!(
        error.starts_with(
            "error: create -f stopped part way; written before this failed: portallocation.portalloc.dev/written: "
        ),
        "{run}"
    );
    let api: Api<PortAllocation> = Api::namespaced(client, &ns);
    assert!(api.get_opt("written").await.unwrap().is_some());
}

#[tokio::test]
async fn pool_get_w_prints_a_line_when_the_pool_changes() {
    let pool = support::unique_name("pool-watch");
    support::create_pool(&pool, "38800-38809");
    let mut child = Command::new(cli::BIN)
        .args(["pool", "get", &pool, "-w"])
        .env("KUBECONFIG", &support::cluster().kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    let header: Vec<String> = next_line(&lines, "the header")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(
        header[..6],
        ["NAME", "PROTOCOL", "RANGES", "SIZE", "ALLOCATED", "FREE"]
    );
    let row = next_line(&lines, "the pool");
    assert!(
        row.starts_with(&format!("{pool} ")) && row.contains("38800-38809"),
        "{row}"
    );
    let run = cli::run_stdin(
        &["create", "-f", "-", "--force"],
        &pool_doc(&pool, "38800-38819"),
    );
    assert!(run.ok(), "{run}");
    let mut changed = next_line(&lines, "the changed pool");
    while !changed.contains("38800-38819") {
        changed = next_line(&lines, "the pool with its new range");
    }
    assert!(changed.starts_with(&format!("{pool} ")), "{changed}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The checks before the first write read only for files of several objects: `create -f` of
/// one PortAllocation (the path whose requests cell 2a counts) sends the requests it sent
/// before, none for its namespace or pool; a file of a pool and a PortAllocation reads the
/// namespace once, and the pool, before writing.
#[tokio::test]
async fn checks_before_writing_add_no_request_to_a_single_allocation() {
    let client = support::client().await;
    let ns = support::namespace(&client, "precheck-requests").await;
    let pool = support::unique_name("precheck");
    let namespace_get = format!("GET /api/v1/namespaces/{ns} ");
    let pool_get = format!("GET /apis/portalloc.dev/v1alpha1/portpools/{pool} ");
    let both = format!(
        "{}---\n{}",
        pool_doc(&pool, "38900-38909"),
        support::simple_allocation("first", &pool, "web", 1, &["http"])
    );
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns, "-v", "2"], &both);
    assert!(run.ok(), "{run}");
    let count = |text: &str, request: &str| text.lines().filter(|l| l.contains(request)).count();
    assert_eq!(count(&run.stderr, &namespace_get), 1, "{run}");
    assert!(count(&run.stderr, &pool_get) >= 1, "{run}");

    let one = support::simple_allocation("second", &pool, "web", 1, &["http"]);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns, "-v", "2"], &one);
    assert!(run.ok(), "{run}");
    assert_eq!(count(&run.stderr, &namespace_get), 0, "{run}");
    assert_eq!(count(&run.stderr, "GET /api/v1/namespaces"), 0, "{run}");
    let requests = count(&run.stderr, " /api");
    eprintln!("create -f of one 1-port PortAllocation, warm cache: {requests} requests");
    assert!(requests <= 4, "{run}");
}

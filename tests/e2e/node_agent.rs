//! The node agent end to end: a control plane of its own with the pod webhook, one simulated
//! node (a network namespace of its own, and a cgroup v2 tree laid out as kubelet's), the agent
//! binary running inside that namespace (reaching the API server through a relay over a UNIX
//! socket), Pods created with their `nodeName` through the webhook, and real processes binding
//! from inside the pods' cgroups. The node is tests/common/agent_node.rs, which the node
//! benchmark (benches/node) shares.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use portalloc::ledger::node_report::NODE_AGENT_NAMESPACE;
use portalloc::node::reserved_ports;

use crate::support::agent_node::{AgentNode, script};
use crate::support::private_cluster::PrivateCluster;
use crate::support::webhook::start_webhook;

const NODE: &str = "node-a";
const POOL_RANGE: (u16, u16) = (45_000, 45_009);
const RESERVED: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";
/// Capability numbers (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
const CAP_BPF: u32 = 39;

/// Entries someone else reserved on a node, in no order and of every length: several KiB,
/// none in 46000-46009, and most of the ephemeral range left free.
fn others_reserved_ports() -> String {
    let mut entries = vec!["30000-32767".to_string(), "33000-33009".to_string()];
    for i in 0..1200u32 {
        let port = 20_000 + (i * 7) % 9_000;
        entries.push(if i % 2 == 0 {
            port.to_string()
        } else {
            format!("{port}-{}", port + 2)
        });
    }
    entries.push("8080".into());
    entries.join(",")
}

/// Poll `check` every 100 ms until it is true or `within` passes.
fn eventually(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> bool,
    log: impl Fn() -> String,
) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < within,
            "{what} did not happen within {within:?}; agent log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process killed when the test ends, failed or not: a webhook left running would
/// outlive its control plane.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        }
    }))
    .unwrap()
}

/// The port the webhook gave a pod (its `portalloc.dev/ports` annotation, `http=PORT`).
fn given_port(pod: &Pod) -> u16 {
    let annotation = &pod.metadata.annotations.as_ref().unwrap()["portalloc.dev/ports"];
    annotation.strip_prefix("http=").unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reserves_pool_ports_and_lets_only_holders_bind_them() {
    let Some(cluster) = PrivateCluster::start("node-agent", true) else {
        return;
    };
    let client = cluster.client().await;
    let range = format!("{}-{}", POOL_RANGE.0, POOL_RANGE.1);
    let run = cluster.run(&[
        "pool", "create", "guarded", "--range", &range, "--guard", "Enforce",
    ]);
    assert!(run.ok(), "{run}");
    crate::support::create_namespace(&client, "team").await;
    crate::support::create_namespace(&client, "portalloc-system").await;
    crate::support::create_namespace(&client, NODE_AGENT_NAMESPACE).await;
    let manifest = crate::support::simple_allocation("srv", "guarded", "web", 2, &["http"]);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), manifest).unwrap();
    let run = cluster.run(&["create", "-n", "team", "-f", file.path().to_str().unwrap()]);
    assert!(run.ok(), "{run}");
    let _webhook = KillOnDrop(
        start_webhook(&cluster.kubeconfig, &client, "portalloc-system")
            .await
            .unwrap(),
    );

    let mut node = AgentNode::start(&cluster.kubeconfig, "agent-e2e");
    // The chart's capabilities and no more: no CAP_SYS_ADMIN, so the guard is linked, pinned
    // and taken over after the restart below by pin alone.
    node.capabilities = Some(vec!["bpf", "net_admin"]);
    let agent_args = [
        "-v",
        "1",
        "--node-name",
        NODE,
        "--round",
        "100ms",
        // Holder entries lapse 2 s after the agent's last round.
        "--guard-lease",
        "2s",
        "--metrics-address",
        "127.0.0.1:19464",
    ];
    node.start_agent(&agent_args);
    // Every pool's ports leave the kernel's ephemeral choice within a second or so.
    eventually(
        Duration::from_secs(15),
        "reserving the pool",
        || node.sh("cat /proc/sys/net/ipv4/ip_local_reserved_ports") == range,
        || node.log(),
    );

    // Pods through the webhook, bound to the node; their cgroups as kubelet makes them.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team");
    let labels =
        serde_json::json!({"portalloc.dev/allocation": "srv", "portalloc.dev/role": "web"});
    let mut cgroup = Vec::new();
    let mut port = Vec::new();
    for name in ["srv-web-0", "srv-web-1"] {
        let created = pods
            .create(&PostParams::default(), &pod(name, labels.clone()))
            .await
            .unwrap();
        port.push(given_port(&created));
        cgroup.push(
            node.cgroups
                .pod(Some("burstable"), &created.metadata.uid.unwrap()),
        );
    }
    let intruder = pods
        .create(
            &PostParams::default(),
            &pod("intruder", serde_json::json!({})),
        )
        .await
        .unwrap();
    let intruder_cg = node
        .cgroups
        .pod(None, intruder.metadata.uid.as_deref().unwrap());
    // A pod cgroup with no Pod in the API (a static pod whose mirror pod is missing): its
    // ports cannot be read, so it is never judged a pod that holds nothing.
    let unknown_uid = "5f5f5f5f-6e6e-7d7d-8c8c-9b9b9b9b9b9b";
    let unknown_cg = node.cgroups.pod(None, unknown_uid);
    // A pod binding at the instant its cgroup appears gets its port: the guard never refuses
    // a pod it has not seen yet a port no seen pod holds.
    assert_eq!(node.bind(Some(&cgroup[0]), port[0]), "ok");

    eventually(
        Duration::from_secs(20),
        "the guard refusing the intruder",
        || node.bind(Some(&intruder_cg), port[0]) == "EPERM",
        || node.log(),
    );
    assert_eq!(
        node.bind(Some(&cgroup[0]), port[0]),
        "ok",
        "the holder binds its port"
    );
    assert_eq!(
        node.agent_capabilities(),
        (1 << CAP_BPF) | (1 << CAP_NET_ADMIN),
        "the agent ran with CAP_BPF and CAP_NET_ADMIN only"
    );
    assert_eq!(node.bind(Some(&cgroup[1]), port[1]), "ok");
    assert_eq!(
        node.bind(Some(&cgroup[0]), port[1]),
        "EPERM",
        "another pod's port"
    );
    assert_eq!(
        node.bind(Some(&intruder_cg), POOL_RANGE.1 + 7),
        "ok",
        "a port outside every pool"
    );
    assert_eq!(
        node.bind(None, port[0]),
        "ok",
        "processes outside pods are never touched"
    );
    // Detached under the running agent (bpftool, or node-agent --detach too early): the next
    // round attaches the guard again, with its maps written afresh.
    assert_eq!(
        portalloc::node::bind_guard::BindGuard::detach(
            &node.cgroups.kubepods(),
            &node.cgroups.pins()
        )
        .unwrap(),
        2
    );
    eventually(
        Duration::from_secs(20),
        "the guard attached again and refusing the intruder",
        || node.bind(Some(&intruder_cg), port[0]) == "EPERM",
        || node.log(),
    );
    assert!(
        node.log()
            .contains("the bind guard is no longer attached whole (0 of its 2 links)"),
        "{}",
        node.log()
    );
    assert_eq!(
        node.bind(Some(&cgroup[0]), port[0]),
        "ok",
        "the holder still binds"
    );

    // The refusal is an Event on the intruder, naming the port, the pool and the holder.
    let events: Api<Event> = Api::namespaced(client.clone(), "team");
    let deadline = Instant::now() + Duration::from_secs(15);
    let note = loop {
        let list = events.list(&ListParams::default()).await.unwrap();
        let found = list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("PortBindRefused")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("intruder")
        });
        if let Some(event) = found {
            break event.note.unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "no PortBindRefused Event; agent log:\n{}",
            node.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(note.contains(&format!("port {}/TCP", port[0])), "{note}");
    assert!(note.contains("PortPool guarded (guard Enforce)"), "{note}");
    assert!(
        note.contains("pod team/srv-web-0 (PortAllocation team/srv)"),
        "{note}"
    );

    // pool describe says which nodes guard the pool, from the agents' Leases.
    let described = cluster.run(&["pool", "describe", "guarded"]);
    assert!(described.ok(), "{described}");
    assert!(
        described.stdout.contains("Guard:        Enforce"),
        "{described}"
    );
    assert!(
        described.stdout.contains("guard it (Enforce): node-a"),
        "{described}"
    );

    // And a series of the agent's metrics, scraped where Prometheus would (the node's address).
    let metrics = node.sh("curl -sf http://127.0.0.1:19464/metrics");
    assert!(
        metrics.contains(r#"portalloc_node_guard_binds_total{pool="guarded",verdict="refused"}"#),
        "{metrics}"
    );
    assert_eq!(node.sh("curl -sf http://127.0.0.1:19464/readyz"), "ok");

    // Outgoing connections in a namespace whose ephemeral range covers the pool take none of
    // its ports.
    node.sh("echo '44000 54999' > /proc/sys/net/ipv4/ip_local_port_range");
    let inside = node.sh(&format!(
        "python3 '{}' 10000 {} {}",
        script("ephemeral.py"),
        POOL_RANGE.0,
        POOL_RANGE.1
    ));
    assert_eq!(inside, "0", "outgoing connections took pool ports");

    // Past the agent's grace for it, the unknown cgroup is said in the log, and still binds a
    // pool port no pod here holds (claims it) rather than be refused.
    eventually(
        Duration::from_secs(30),
        "the agent saying the cgroup has no Pod",
        || {
            node.log().contains(&format!(
                "the pod cgroup of UID {unknown_uid} has no Pod in the API"
            ))
        },
        || node.log(),
    );
    let free = (POOL_RANGE.0..=POOL_RANGE.1)
        .find(|p| !port.contains(p))
        .unwrap();
    assert_eq!(
        node.bind(Some(&unknown_cg), free),
        "ok",
        "an unreadable pod is not refused"
    );
    assert_eq!(
        node.bind(Some(&intruder_cg), free),
        "EPERM",
        "but claims it"
    );

    // Killed with SIGKILL: the guard holds while no agent runs. A pod the agent has seen stays
    // refused; the holder always binds.
    node.kill_agent();
    let killed = Instant::now();
    assert_eq!(
        node.bind(Some(&intruder_cg), port[0]),
        "EPERM",
        "guarding with no agent"
    );
    assert_eq!(node.bind(Some(&cgroup[0]), port[0]), "ok");
    // A StatefulSet pod replaced while the agent is away. Grace period 0: what kubelet
    // confirms once the containers are gone (no kubelet here).
    pods.delete("srv-web-1", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    std::fs::remove_dir(&cgroup[1]).unwrap();
    std::fs::remove_dir(cgroup[1].parent().unwrap()).unwrap();
    let again = pods
        .create(&PostParams::default(), &pod("srv-web-1", labels.clone()))
        .await
        .unwrap();
    assert_eq!(
        given_port(&again),
        port[1],
        "the replacement keeps the pod's port"
    );
    let replacement = node
        .cgroups
        .pod(Some("burstable"), again.metadata.uid.as_deref().unwrap());
    // The deleted pod's holder entry lapses a lease (2 s here) after the agent's last round:
    // the replacement binds its port with no agent running.
    eventually(
        Duration::from_secs(20),
        "the replacement binding its port with the agent away",
        || node.bind(Some(&replacement), port[1]) == "ok",
        || node.log(),
    );
    eprintln!(
        "the replacement bound its port {:?} after the agent was killed",
        killed.elapsed()
    );
    assert_eq!(node.bind(Some(&intruder_cg), port[1]), "EPERM");
    // The trade-off: a pod new to the node in that window may take a held port while its
    // holder is not bound to it (as the holder's first claim would)...
    let latecomer = pods
        .create(
            &PostParams::default(),
            &pod("latecomer", serde_json::json!({})),
        )
        .await
        .unwrap();
    let latecomer_cg = node
        .cgroups
        .pod(None, latecomer.metadata.uid.as_deref().unwrap());
    assert_eq!(node.bind(Some(&latecomer_cg), port[0]), "ok");
    assert_eq!(
        node.bind(Some(&cgroup[0]), port[0]),
        "ok",
        "the holder is never refused"
    );
    // ...and is reported at once when the agent is back, then refused.
    node.start_agent(&agent_args);
    eventually(
        Duration::from_secs(20),
        "the restarted agent taking over",
        || node.log().contains("took_over=true"),
        || node.log(),
    );
    assert_eq!(
        node.agent_capabilities(),
        (1 << CAP_BPF) | (1 << CAP_NET_ADMIN),
        "taken over by pin without CAP_SYS_ADMIN"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let list = events.list(&ListParams::default()).await.unwrap();
        let reported = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("PortTakenBeforeGuarded")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("latecomer")
        });
        if reported {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no PortTakenBeforeGuarded Event on the latecomer; agent log:\n{}",
            node.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(node.bind(Some(&latecomer_cg), port[0]), "EPERM");
    assert_eq!(node.bind(Some(&intruder_cg), port[0]), "EPERM");
    assert_eq!(node.bind(Some(&cgroup[0]), port[0]), "ok");
    assert_eq!(node.bind(Some(&replacement), port[1]), "ok");
    assert_eq!(node.bind(Some(&intruder_cg), port[1]), "EPERM");

    // The pool deleted: its reservation goes, and so does its guard.
    let run = cluster.run(&["pool", "delete", "guarded", "--force"]);
    assert!(run.ok(), "{run}");
    eventually(
        Duration::from_secs(15),
        "releasing the pool's reservation",
        || {
            node.sh("cat /proc/sys/net/ipv4/ip_local_reserved_ports")
                .is_empty()
        },
        || node.log(),
    );
    assert_eq!(
        node.bind(Some(&intruder_cg), port[0]),
        "ok",
        "no pool, no guard"
    );

    drop(node);
}

/// A node without cgroup v2 (here: a cgroup root that is a plain directory) gets one line
/// saying so and keeps reserving; a pool port a process on the node already listens on is
/// reported, in the agent's log and in `pool describe`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cgroup_v2_the_agent_reserves_and_reports_listeners_on_pool_ports() {
    let Some(cluster) = PrivateCluster::start("node-agent-plain", true) else {
        return;
    };
    let client = cluster.client().await;
    let node = AgentNode::start(&cluster.kubeconfig, "agent-plain");
    // Something of the node's own listens on a port the pool will cover.
    let pid = node.sh(&format!(
        "python3 '{}' 46003 tcp 4 120 >/dev/null 2>&1 & echo $!",
        script("binder.py")
    ));
    let run = cluster.run(&[
        "pool",
        "create",
        "plain",
        "--range",
        "46000-46009",
        "--guard",
        "Audit",
    ]);
    assert!(run.ok(), "{run}");
    // No guard on SCTP, whose binds no cgroup bind hook sees: refused before the API server
    // is asked (which refuses it too, tests/e2e/crd_validation.rs).
    let run = cluster.run(&[
        "pool",
        "create",
        "sctp",
        "--range",
        "47000-47009",
        "--protocol",
        "SCTP",
        "--guard",
        "Enforce",
    ]);
    assert_eq!(run.code, 7, "{run}");
    assert!(
        run.stderr.contains("spec.guard: guard Enforce cannot be set on an SCTP pool: the kernel hands an SCTP bind to sctp_bind"),
        "{run}"
    );
    // A pool of every port would leave the node no source port for any connection (the
    // agent's own to the API server included): it is not reserved, and said so.
    let run = cluster.run(&[
        "pool",
        "create",
        "everything",
        "--range",
        "1-65535",
        "--protocol",
        "UDP",
        "--allow-overlap",
    ]);
    assert!(run.ok(), "{run}");
    let plain_root = tempfile::tempdir().unwrap();
    let log_path = plain_root.path().join("agent.log");
    // Others' entries before the agent starts, several KiB of them (a NodePort range among
    // them): far past the 32 bytes a first small read of the setting sees.
    let others = others_reserved_ports();
    let value_file = plain_root.path().join("others");
    std::fs::write(&value_file, format!("{others}\n")).unwrap();
    node.sh(&format!(
        "python3 -c 'import os,sys; b=open(sys.argv[1],\"rb\").read(); fd=os.open(\"{RESERVED}\",os.O_WRONLY)\nwhile b: b=b[os.write(fd,b):]' '{}'",
        value_file.display()
    ));
    let expected = format!("{others},46000-46009");
    assert_eq!(
        reserved_ports::parse(&node.sh(&format!("cat {RESERVED}"))),
        reserved_ports::parse(&others),
        "the test's own value is in place"
    );
    let _agent = KillOnDrop(
        node.nsenter()
            .arg(env!("CARGO_BIN_EXE_kubectl-portalloc"))
            .args([
                "node-agent",
                "-v",
                "1",
                "--node-name",
                "node-plain",
                "--round",
                "100ms",
            ])
            .args(["--report-every", "1s"])
            .arg("--cgroup-root")
            .arg(plain_root.path())
            .arg("--state-dir")
            .arg(plain_root.path().join("state"))
            .env("KUBECONFIG", &cluster.kubeconfig)
            .stdin(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    eventually(
        Duration::from_secs(15),
        "reserving the pool without a guard, beside every entry of others",
        || {
            reserved_ports::parse(&node.sh(&format!("cat {RESERVED}")))
                == reserved_ports::parse(&expected)
        },
        log,
    );
    let said = log();
    assert!(
        !said.contains(RESERVED) && !said.contains("reserved-ports"),
        "no failed read or write of the setting:\n{said}"
    );
    // The Lease's namespace does not exist yet: said once when it starts, however many
    // rounds (100 ms) and retries (every --report-every, 1 s) pass, and once when it ends.
    let lease_fails =
        format!("renewing the node agent's Lease in namespace {NODE_AGENT_NAMESPACE}");
    eventually(
        Duration::from_secs(15),
        "the missing Lease namespace said",
        || log().contains(&lease_fails),
        log,
    );
    std::thread::sleep(Duration::from_secs(3));
    crate::support::create_namespace(&client, NODE_AGENT_NAMESPACE).await;
    eventually(
        Duration::from_secs(15),
        "the Lease renewed once its namespace exists",
        || log().contains("the node agent's Lease is renewed again"),
        log,
    );
    let said = log();
    assert_eq!(
        said.matches(lease_fails.as_str()).count(),
        2,
        "once as a warning, once in the line that it ended:\n{said}"
    );
    assert_eq!(
        said.matches("binds are not guarded on this node").count(),
        1,
        "one line, not one per round:\n{said}"
    );
    assert!(said.contains("no cgroup v2 hierarchy at"), "{said}");
    assert_eq!(
        said.matches("port 46003/TCP of PortPool plain is already listened on")
            .count(),
        1,
        "{said}"
    );
    eventually(
        Duration::from_secs(15),
        "pool describe naming the node without a guard and the listener",
        || {
            let out = cluster.run(&["pool", "describe", "plain"]).stdout;
            out.contains("reserve its ports, no guard: node-plain (no cgroup v2 hierarchy at")
                && out.contains("warning: node-plain: port 46003/TCP of PortPool plain")
                && cluster
                    .run(&["pool", "describe", "everything"])
                    .stdout
                    .contains("PortPool everything is not reserved on this node")
        },
        log,
    );
    let _ = node.sh(&format!("kill {pid}"));
}

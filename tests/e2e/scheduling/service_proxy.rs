//! The real kube-proxy in front of pods whose ports differ: Service `web` (service.rs) sends
//! what reaches its cluster IP on port 80 to each pod on the port that pod holds. kube-proxy
//! (iptables mode) runs in node-0's network namespace of the node simulation; every pod's
//! listener runs in its own node's namespace, on the node's address and its own port only, and
//! says who it is. A client in node-0 then connects to the cluster IP until every pod answered.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::Api;

use crate::simulation::netns::NodeNetworks;
use crate::support::kube_proxy::KubeProxy;
use crate::support::nodes::NodeShape;

use super::harness::ScheduledCluster;
use super::service::{Backend, serve};

/// Connections made to the cluster IP. kube-proxy picks an endpoint at random for each, so
/// one pod of three goes unanswered with probability 3 x (2/3)^60, about 1e-10.
const CONNECTIONS: usize = 60;
/// How long kube-proxy may take to write a rule for every endpoint after its first sync.
const RULES_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves one pod's port: accepts on `IP PORT` and answers each connection with `NAME IP:PORT`;
/// exits when process `OWNER` (the test) is gone.
const LISTENER: &str = r#"
import os, socket, sys, threading, time
ip, port, name, owner = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def watch():
    while True:
        try:
            os.kill(owner, 0)
        except OSError:
            os._exit(0)
        time.sleep(1)
threading.Thread(target=watch, daemon=True).start()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((ip, port))
s.listen(64)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(f"{name} {ip}:{port}\n".encode())
    c.close()
"#;

/// Connects to `IP PORT` `N` times, one line each: what the server said, or `error: ...`.
const CLIENT: &str = r#"
import socket, sys
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    try:
        with socket.create_connection((ip, port), timeout=2) as c:
            print(c.makefile().readline().strip() or "error: empty answer", flush=True)
    except OSError as e:
        print(f"error: {e}", flush=True)
"#;

#[tokio::test]
async fn kube_proxy_sends_the_cluster_ips_traffic_to_every_pod_on_its_own_port() {
    let Some(sc) = ScheduledCluster::start("sched-proxy", 3, &NodeShape::gpu_server()).await else {
        return;
    };
    let ns = "served";
    let backends = serve(&sc, ns).await;
    let service: Api<Service> = Api::namespaced(sc.client.clone(), ns);
    let service = service.get("web").await.unwrap();
    let cluster_ip = service.spec.and_then(|s| s.cluster_ip).unwrap();

    let addresses = sc.node_addresses();
    let networks = NodeNetworks::new(addresses.iter().map(|(n, ip)| (n.as_str(), *ip)));
    // As on a real node, what is not on the node network leaves by the default route; without
    // one, a connection to the cluster IP fails before kube-proxy's rules see it.
    let client = "node-0";
    networks.ip(client, &["route", "add", "default", "dev", "eth0"]);
    let _listeners: Vec<Listener> = backends
        .iter()
        .map(|b| Listener::start(&networks.netns(&b.node), b))
        .collect();

    let proxy = KubeProxy::start(&sc.cluster.kubeconfig, &networks.netns(client), client)
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_for_rules(&proxy, &backends);

    let out = proxy
        .nsenter()
        .args([
            "python3",
            "-c",
            CLIENT,
            &cluster_ip,
            "80",
            &CONNECTIONS.to_string(),
        ])
        .output()
        .expect("run the client in node-0's namespace");
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        *answers.entry(line.to_string()).or_default() += 1;
    }
    let want: BTreeSet<String> = backends
        .iter()
        .map(|b| format!("{} {}:{}", b.pod, b.ip, b.port))
        .collect();
    let got: BTreeSet<String> = answers.keys().cloned().collect();
    eprintln!("{CONNECTIONS} connections to {cluster_ip}:80 from {client}: {answers:?}");
    assert_eq!(
        got,
        want,
        "answers to {CONNECTIONS} connections to {cluster_ip}:80 (count each: {answers:?}; client \
         stderr: {}); kube-proxy's nat rules:\n{}\n--- kube-proxy (last lines)\n{}",
        String::from_utf8_lossy(&out.stderr),
        proxy.nat_rules(),
        proxy.log_tail(20)
    );

    // The machine's own namespace never saw a rule of this Service.
    let host = Command::new("iptables-save").output().unwrap();
    let host = String::from_utf8_lossy(&host.stdout);
    assert!(
        !host.contains(&format!("{ns}/web")),
        "kube-proxy wrote rules in this machine's own network namespace:\n{host}"
    );
}

/// Until kube-proxy's nat table sends Service web to each backend's address and port; fails
/// with the table and kube-proxy's log if it does not within [`RULES_TIMEOUT`].
fn wait_for_rules(proxy: &KubeProxy, backends: &[Backend]) {
    let started = Instant::now();
    loop {
        let rules = proxy.nat_rules();
        let missing: Vec<String> = backends
            .iter()
            .map(|b| format!("--to-destination {}:{}", b.ip, b.port))
            .filter(|dnat| !rules.contains(dnat))
            .collect();
        if missing.is_empty() {
            return;
        }
        if started.elapsed() > RULES_TIMEOUT {
            panic!(
                "kube-proxy wrote no rule {missing:?} within {}s; its nat rules:\n{rules}\n--- \
                 kube-proxy (last lines)\n{}",
                RULES_TIMEOUT.as_secs(),
                proxy.log_tail(30)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// One pod's listener, in its node's namespace; killed on drop.
struct Listener(Child);

impl Listener {
    fn start(netns: &Path, backend: &Backend) -> Listener {
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(["--", "python3", "-c", LISTENER, &backend.ip])
            .arg(backend.port.to_string())
            .arg(&backend.pod)
            .arg(std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a pod's listener in its node's namespace");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "the listener of {} on {}:{} did not start",
            backend.pod,
            backend.ip,
            backend.port
        );
        Listener(child)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

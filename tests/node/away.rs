//! The guard while no agent keeps its maps (stopped, crash-looping, rolled out): holder entries
//! lapse after the agent's last heartbeat, so a pod new to the node (a StatefulSet's
//! replacement) binds its port; pods the agent has seen stay refused; and at the first attach
//! after a reboot no pod claims a port for its whole QoS class.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use portalloc::node::bind_guard::BindGuard;
use portalloc::node::bind_program::{MODE_ENFORCE, POD_SEEN, QOS_DIR, slot};
use portalloc::node::cgroups::{self, CgroupDriver};
use portalloc::node::netns_cookie;

use crate::common::node_cgroups::{NodeCgroups, bind_in, own_network_namespace};

const HOLDER: &str = "21212121-3232-4343-5454-656565656565";
const SEEN: &str = "76767676-8787-9898-a9a9-bababababab0";
const REPLACEMENT: &str = "cbcbcbcb-dcdc-eded-fefe-0f0f0f0f0f0f";
const NEWCOMER: &str = "1a1a1a1a-2b2b-3c3c-4d4d-5e5e5e5e5e5e";

fn pod_id(container: &Path) -> u64 {
    cgroups::cgroup_id(container.parent().unwrap()).unwrap()
}

fn attach(node: &NodeCgroups) -> BindGuard {
    let level = cgroups::level(&node.kubepods()).unwrap() + 1;
    BindGuard::attach(
        &node.kubepods(),
        &node.pins(),
        level,
        netns_cookie().unwrap(),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The pods map as the agent writes it: the QoS directories, and every pod it has read.
fn seen_pods(node: &NodeCgroups) -> BTreeMap<u64, u32> {
    let found = cgroups::scan(&node.kubepods(), node.driver).unwrap();
    let mut pods: BTreeMap<u64, u32> = found.qos_dirs.iter().map(|&id| (id, QOS_DIR)).collect();
    pods.extend(found.pods.values().map(|&id| (id, POD_SEEN)));
    pods
}

/// Bind from `cgroup` until the kernel says "ok" (every 50 ms, for at most `within`); how long
/// it took.
fn until_bound(cgroup: &Path, port: u16, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let answer = bind_in(Some(cgroup), port, "tcp", "4");
        if answer == "ok" {
            return start.elapsed();
        }
        assert_eq!(answer, "EPERM");
        assert!(
            start.elapsed() < within,
            "still refused after {within:?} without an agent"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn with_the_agent_away_a_replacement_binds_its_port_and_a_seen_pod_stays_refused() {
    own_network_namespace();
    let node = NodeCgroups::new("away", CgroupDriver::Cgroupfs);
    let port = 41_361;
    let holder = node.pod(Some("burstable"), HOLDER);
    let seen = node.pod(None, SEEN);
    let guard = attach(&node);
    guard.set_pods(&seen_pods(&node)).unwrap();
    guard
        .set_owners(&BTreeMap::from([(slot(0, port), pod_id(&holder))]))
        .unwrap();
    guard
        .set_modes(&BTreeMap::from([(slot(0, port), MODE_ENFORCE)]))
        .unwrap();
    // The agent runs: its heartbeat keeps the holder entry, so a pod it has not seen yet is
    // refused a port a seen pod holds, as is a seen pod.
    guard.heartbeat(Duration::from_secs(3600)).unwrap();
    assert_eq!(bind_in(Some(&holder), port, "tcp", "4"), "ok");
    let early = node.pod(None, NEWCOMER);
    assert_eq!(
        bind_in(Some(&early), port, "tcp", "4"),
        "EPERM",
        "an intruder new to the agent, while it runs"
    );
    assert_eq!(bind_in(Some(&seen), port, "tcp", "4"), "EPERM");
    std::fs::remove_dir(&early).unwrap();
    std::fs::remove_dir(early.parent().unwrap()).unwrap();

    // The agent's last round, then it is killed: its lease of a second runs out with nobody
    // renewing it. The holder pod is deleted and its StatefulSet's replacement (a new UID, the
    // same port) starts on the node.
    let lease = Duration::from_secs(1);
    let stopped = Instant::now();
    guard.heartbeat(lease).unwrap();
    drop(guard);
    std::fs::remove_dir(&holder).unwrap();
    std::fs::remove_dir(holder.parent().unwrap()).unwrap();
    let replacement = node.pod(Some("burstable"), REPLACEMENT);
    until_bound(&replacement, port, Duration::from_secs(30));
    let after = stopped.elapsed();
    eprintln!(
        "the replacement bound its port {after:?} after the agent's last heartbeat (lease {lease:?})"
    );
    assert!(after >= lease, "bound before the lease ran out: {after:?}");
    assert_eq!(
        bind_in(Some(&replacement), port, "tcp", "4"),
        "ok",
        "and keeps it"
    );

    // In the window, a pod the agent has seen is still refused, and a second pod new to the
    // node finds the port claimed.
    assert_eq!(bind_in(Some(&seen), port, "tcp", "4"), "EPERM");
    let newcomer = node.pod(None, NEWCOMER);
    assert_eq!(bind_in(Some(&newcomer), port, "tcp", "4"), "EPERM");

    // The agent returns: the claim is there for it to check against the record (and report
    // if it was not the replacement's), with the refusals counted meanwhile.
    let back = attach(&node);
    assert!(back.took_over);
    assert_eq!(
        back.claims().unwrap().get(&slot(0, port)),
        Some(&pod_id(&replacement))
    );
    BindGuard::detach(&node.kubepods(), &node.pins()).unwrap();
}

#[test]
fn qos_directories_marked_before_any_mode_keep_claims_to_one_pod() {
    own_network_namespace();
    for driver in [CgroupDriver::Cgroupfs, CgroupDriver::Systemd] {
        let node = NodeCgroups::new(&format!("qos-{driver:?}"), driver);
        let port = 41_371;
        // The first attach after a reboot: fresh maps, two Burstable pods the agent has not
        // read yet, binding at once.
        let guard = attach(&node);
        let qos: Vec<u64> = cgroups::qos_dirs(&node.kubepods(), driver)
            .unwrap()
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        assert_eq!(qos.len(), 2, "{driver:?}");
        guard.set_qos_dirs(&qos).unwrap();
        guard
            .set_modes(&BTreeMap::from([(slot(0, port), MODE_ENFORCE)]))
            .unwrap();
        let first = node.pod(Some("burstable"), HOLDER);
        let second = node.pod(Some("burstable"), SEEN);
        assert_eq!(bind_in(Some(&first), port, "tcp", "4"), "ok", "{driver:?}");
        assert_eq!(
            bind_in(Some(&second), port, "tcp", "4"),
            "EPERM",
            "{driver:?}: the claim is the first pod's, not its QoS class's"
        );
        assert_eq!(
            guard.claims().unwrap(),
            BTreeMap::from([(slot(0, port), pod_id(&first))]),
            "{driver:?}"
        );
        drop(guard);
        BindGuard::detach(&node.kubepods(), &node.pins()).unwrap();
    }
}

#[test]
fn a_lease_shorter_than_two_rounds_is_refused_before_anything_runs() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-portalloc"))
        .args(["node-agent", "--node-name", "n1", "--round", "1s"])
        .args(["--guard-lease", "1500ms"])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run kubectl-portalloc");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--guard-lease 1.5s is shorter than twice --round 1s"),
        "{stderr}"
    );
}

//! `kubectl portalloc node-agent --detach`, the binary itself, on a node of the test's own (a
//! network namespace and a cgroup tree laid out as kubelet's): the guard and the agent's
//! reserved ports go, everyone else's entries stay.

use std::collections::BTreeMap;
use std::process::Command;

use portalloc::node::bind_guard::BindGuard;
use portalloc::node::bind_program::{MODE_ENFORCE, POD_SEEN, QOS_DIR, slot};
use portalloc::node::cgroups::{self, CgroupDriver};
use portalloc::node::netns_cookie;
use portalloc::node::reserved_ports::{ReservedPorts, SYSCTL, parse, read_whole};

use crate::common::node_cgroups::{NodeCgroups, bind_in, own_network_namespace};

const HOLDER: &str = "13131313-2424-3535-4646-575757575757";
const OTHER: &str = "68686868-7979-8a8a-9b9b-acacacacacac";

/// `node-agent --detach` for `node`, run from this thread (so in its network namespace).
fn detach(node: &NodeCgroups, state: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-portalloc"))
        .args(["node-agent", "--detach", "--cgroup-root"])
        .arg(&node.root)
        .arg("--state-dir")
        .arg(state)
        .arg("--bpf-dir")
        .arg(node.bpf_dir())
        .env_remove("NODE_NAME")
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run kubectl-portalloc");
    assert!(
        out.status.success(),
        "--detach failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn detach_removes_the_guard_and_only_the_agents_reserved_ports() {
    for driver in [CgroupDriver::Systemd, CgroupDriver::Cgroupfs] {
        own_network_namespace();
        let node = NodeCgroups::new(&format!("detach-{driver:?}"), driver);
        let holder = node.pod(None, HOLDER);
        let other = node.pod(Some("besteffort"), OTHER);
        let port = 41_351;
        // The guard as an agent leaves it: attached, the port held by HOLDER, under Enforce.
        let level = cgroups::level(&node.kubepods()).unwrap() + 1;
        let guard = BindGuard::attach(
            &node.kubepods(),
            &node.pins(),
            level,
            netns_cookie().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let found = cgroups::scan(&node.kubepods(), driver).unwrap();
        let mut pods: BTreeMap<u64, u32> = found.qos_dirs.iter().map(|&id| (id, QOS_DIR)).collect();
        pods.extend(found.pods.values().map(|&id| (id, POD_SEEN)));
        guard.set_pods(&pods).unwrap();
        let tcp = slot(0, port);
        guard
            .set_modes(&BTreeMap::from([(tcp, MODE_ENFORCE)]))
            .unwrap();
        let holder_id = cgroups::cgroup_id(holder.parent().unwrap()).unwrap();
        guard
            .set_owners(&BTreeMap::from([(tcp, holder_id)]))
            .unwrap();
        drop(guard);
        assert_eq!(
            bind_in(Some(&other), port, "tcp", "4"),
            "EPERM",
            "{driver:?}: guarded"
        );
        // Others' entries (a long value), and the agent's beside them.
        let others = format!(
            "30000-32767,{}",
            (0..600)
                .map(|i| (2000 + i * 3).to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        std::fs::write(SYSCTL, format!("{others}\n")).unwrap();
        let state = tempfile::tempdir().unwrap();
        let sysctl = std::path::Path::new(SYSCTL);
        ReservedPorts::at(sysctl, state.path())
            .apply(&parse("41351,45000-45009,31000").unwrap())
            .unwrap();

        let said = detach(&node, state.path());
        assert!(
            said.contains("detached 2 bind guard programs from"),
            "{said}"
        );
        assert!(
            said.contains("took 11 ports the agent had reserved out of"),
            "{said}"
        );
        assert_eq!(
            bind_in(Some(&other), port, "tcp", "4"),
            "ok",
            "{driver:?}: unguarded"
        );
        assert!(!node.pins().exists(), "the pins went with the links");
        assert_eq!(
            BindGuard::detach(&node.kubepods(), &node.pins()).unwrap(),
            0,
            "nothing left"
        );
        assert_eq!(
            parse(&read_whole(sysctl).unwrap()).unwrap(),
            parse(&others).unwrap(),
            "exactly others' entries, 31000 among them"
        );
        // Again: nothing to do, and said so.
        let said = detach(&node, state.path());
        assert!(said.contains("detached 0 bind guard programs"), "{said}");
        assert!(said.contains("took 0 ports"), "{said}");
    }
}

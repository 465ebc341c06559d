//! The bind guard's decisions, made by the kernel for real processes in kubelet's cgroup tree.

use std::collections::BTreeMap;
use std::time::Duration;

use portalloc::node::bind_guard::BindGuard;
use portalloc::node::bind_program::{
    MODE_AUDIT, MODE_ENFORCE, POD_SEEN, QOS_DIR, VERDICT_AUDITED, VERDICT_CLAIMED, VERDICT_REFUSED,
    slot,
};
use portalloc::node::cgroups::{self, CgroupDriver};
use portalloc::node::netns_cookie;

use crate::common::node_cgroups::{NodeCgroups, bind_in, own_network_namespace};

const HOLDER: &str = "11111111-2222-3333-4444-555555555555";
const OTHER: &str = "66666666-7777-8888-9999-aaaaaaaaaaaa";
const NEW_ONE: &str = "bbbbbbbb-cccc-dddd-eeee-ffffffffffff";
const NEW_TWO: &str = "12121212-3434-5656-7878-909090909090";

fn id_of(container: &std::path::Path) -> u64 {
    cgroups::cgroup_id(container.parent().unwrap()).unwrap()
}

/// One node's guard with the ports it is told about: `enforced` and `audited` held by HOLDER,
/// in a network namespace of the test's own.
fn guarded(node: &NodeCgroups, enforced: &[u16], audited: &[u16]) -> (BindGuard, Pods) {
    own_network_namespace();
    let holder = node.pod(Some("burstable"), HOLDER);
    let other = node.pod(None, OTHER);
    let level = cgroups::level(&node.kubepods()).unwrap() + 1;
    let guard = BindGuard::attach(
        &node.kubepods(),
        &node.pins(),
        level,
        netns_cookie().unwrap(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let found = cgroups::scan(&node.kubepods(), node.driver).unwrap();
    assert_eq!(
        (found.pods.len(), found.qos_dirs.len()),
        (2, 2),
        "{found:?}"
    );
    let mut pods: BTreeMap<u64, u32> = found.qos_dirs.iter().map(|&id| (id, QOS_DIR)).collect();
    pods.extend(found.pods.values().map(|&id| (id, POD_SEEN)));
    guard.set_pods(&pods).unwrap();
    let mut modes = BTreeMap::new();
    let mut owners = BTreeMap::new();
    for (ports, mode) in [(enforced, MODE_ENFORCE), (audited, MODE_AUDIT)] {
        for &port in ports {
            for protocol in [0, 1] {
                modes.insert(slot(protocol, port), mode);
                owners.insert(slot(protocol, port), id_of(&holder));
            }
        }
    }
    guard.set_modes(&modes).unwrap();
    guard.set_owners(&owners).unwrap();
    // An agent keeping the maps: holder entries count.
    guard.heartbeat(Duration::from_secs(3600)).unwrap();
    (guard, Pods { holder, other })
}

struct Pods {
    holder: std::path::PathBuf,
    other: std::path::PathBuf,
}

#[test]
fn under_enforce_only_the_holder_binds_its_port() {
    for driver in [CgroupDriver::Cgroupfs, CgroupDriver::Systemd] {
        let node = NodeCgroups::new(&format!("enforce-{driver:?}"), driver);
        let port = 41_311;
        let (guard, pods) = guarded(&node, &[port], &[]);
        for (proto, family) in [
            ("tcp", "4"),
            ("tcp", "6"),
            ("tcp", "mapped"),
            ("udp", "4"),
            ("udp", "6"),
        ] {
            let what = format!("{driver:?} {proto}/{family}");
            assert_eq!(
                bind_in(Some(&pods.holder), port, proto, family),
                "ok",
                "holder, {what}"
            );
            assert_eq!(
                bind_in(Some(&pods.other), port, proto, family),
                "EPERM",
                "other pod, {what}"
            );
            assert_eq!(
                bind_in(None, port, proto, family),
                "ok",
                "outside pods, {what}"
            );
            assert_eq!(
                bind_in(Some(&pods.other), port + 1, proto, family),
                "ok",
                "port outside pools, {what}"
            );
        }
        let verdicts = guard.take_verdicts().unwrap();
        let refused: u64 = verdicts
            .iter()
            .filter(|(k, _)| k.verdict == VERDICT_REFUSED && k.cgroup == id_of(&pods.other))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(refused, 5, "{verdicts:?}");
        assert!(guard.take_verdicts().unwrap().is_empty(), "taken once");
        drop(guard);
        assert_eq!(
            BindGuard::detach(&node.kubepods(), &node.pins()).unwrap(),
            2
        );
    }
}

#[test]
fn under_audit_a_foreign_bind_succeeds_and_is_counted() {
    let node = NodeCgroups::new("audit", CgroupDriver::Cgroupfs);
    let port = 41_321;
    let (guard, pods) = guarded(&node, &[], &[port]);
    assert_eq!(bind_in(Some(&pods.other), port, "tcp", "4"), "ok");
    let verdicts = guard.take_verdicts().unwrap();
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");
    let (key, count) = verdicts[0];
    assert_eq!(
        (key.verdict, key.cgroup, key.slot, count),
        (VERDICT_AUDITED, id_of(&pods.other), slot(0, port), 1)
    );
    BindGuard::detach(&node.kubepods(), &node.pins()).unwrap();
}

#[test]
fn a_pod_not_seen_yet_claims_a_free_port_and_a_second_one_is_refused() {
    let node = NodeCgroups::new("claims", CgroupDriver::Systemd);
    let held = 41_331;
    let unowned = 41_332;
    let (guard, _pods) = guarded(&node, &[held], &[]);
    let mut modes = BTreeMap::from([
        (slot(0, held), MODE_ENFORCE),
        (slot(0, unowned), MODE_ENFORCE),
    ]);
    modes.insert(slot(1, held), MODE_ENFORCE);
    guard.set_modes(&modes).unwrap();
    // Pods whose cgroups appear after the agent last looked: binding at their first instant.
    let first = node.pod(Some("besteffort"), NEW_ONE);
    let second = node.pod(None, NEW_TWO);
    assert_eq!(
        bind_in(Some(&first), unowned, "tcp", "4"),
        "ok",
        "the first unseen pod claims it"
    );
    assert_eq!(
        bind_in(Some(&first), unowned, "tcp", "6"),
        "ok",
        "and keeps it"
    );
    assert_eq!(
        bind_in(Some(&second), unowned, "tcp", "4"),
        "EPERM",
        "claimed by another"
    );
    assert_eq!(
        bind_in(Some(&second), held, "tcp", "4"),
        "EPERM",
        "held by a seen pod"
    );
    let claims = guard.claims().unwrap();
    assert_eq!(claims.get(&slot(0, unowned)), Some(&id_of(&first)));
    let verdicts = guard.take_verdicts().unwrap();
    assert!(
        verdicts
            .iter()
            .any(|(k, _)| k.verdict == VERDICT_CLAIMED && k.cgroup == id_of(&first))
    );
    BindGuard::detach(&node.kubepods(), &node.pins()).unwrap();
}

#[test]
fn a_restarted_agent_takes_over_the_attached_guard_and_its_maps() {
    let node = NodeCgroups::new("takeover", CgroupDriver::Cgroupfs);
    let port = 41_341;
    let (guard, pods) = guarded(&node, &[port], &[]);
    drop(guard); // the agent is gone; the programs stay attached
    assert_eq!(
        bind_in(Some(&pods.other), port, "tcp", "4"),
        "EPERM",
        "guarding with no agent"
    );
    let level = cgroups::level(&node.kubepods()).unwrap() + 1;
    let again = BindGuard::attach(
        &node.kubepods(),
        &node.pins(),
        level,
        netns_cookie().unwrap(),
    )
    .unwrap();
    assert!(again.took_over);
    assert_eq!(
        again.take_verdicts().unwrap().len(),
        1,
        "the verdict counted while no agent ran"
    );
    assert_eq!(bind_in(Some(&pods.holder), port, "tcp", "4"), "ok");
    assert_eq!(
        BindGuard::detach(&node.kubepods(), &node.pins()).unwrap(),
        2,
        "one program per family, never two"
    );
}

//! The guard pinned in bpffs: taken over by pin, upgraded in place when its program's version
//! or its maps' layout changes (a link update that notices a racing writer), and refused where
//! the directory is not on a bpffs. Each test mounts a bpffs of its own.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use portalloc::node::bind_guard::{self, BindGuard, GuardError};
use portalloc::node::bind_program::{MODE_ENFORCE, POD_SEEN, QOS_DIR, slot};
use portalloc::node::cgroups::{self, CgroupDriver};
use portalloc::node::netns_cookie;

use crate::common::node_cgroups::{NodeCgroups, bind_in, own_network_namespace};

const HOLDER: &str = "31313131-4242-5353-6464-757575757575";
const OTHER: &str = "86868686-9797-a8a8-b9b9-cacacacacaca";

fn attach(node: &NodeCgroups) -> Result<BindGuard, GuardError> {
    let level = cgroups::level(&node.kubepods()).unwrap() + 1;
    BindGuard::attach(
        &node.kubepods(),
        &node.pins(),
        level,
        netns_cookie().unwrap(),
    )
}

fn pod_id(container: &Path) -> u64 {
    cgroups::cgroup_id(container.parent().unwrap()).unwrap()
}

/// Fill `guard`'s maps as an agent's round does: both pods seen, `port` under Enforce and held
/// by `owner`.
fn fill(guard: &BindGuard, node: &NodeCgroups, port: u16, owner: &Path) {
    let found = cgroups::scan(&node.kubepods(), node.driver).unwrap();
    let mut pods: BTreeMap<u64, u32> = found.qos_dirs.iter().map(|&id| (id, QOS_DIR)).collect();
    pods.extend(found.pods.values().map(|&id| (id, POD_SEEN)));
    guard
        .set_owners(&BTreeMap::from([(slot(0, port), pod_id(owner))]))
        .unwrap();
    guard.set_pods(&pods).unwrap();
    guard
        .set_modes(&BTreeMap::from([(slot(0, port), MODE_ENFORCE)]))
        .unwrap();
    guard.heartbeat(Duration::from_secs(3600)).unwrap();
}

fn pin_names(node: &NodeCgroups) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(node.pins())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Rename the pins of this release's programs and links as an agent of another release would
/// have named them.
fn as_another_version(node: &NodeCgroups, version: &str) {
    let current = bind_guard::program_version();
    for kind in ["link", "prog"] {
        for family in ["4", "6"] {
            std::fs::rename(
                node.pins().join(format!("{kind}{family}_{current}")),
                node.pins().join(format!("{kind}{family}_{version}")),
            )
            .unwrap();
        }
    }
}

/// Rename the maps' pins as if their layout were `layout`.
fn as_another_layout(node: &NodeCgroups, layout: &str) {
    let prefix = format!("map_{}_", bind_guard::layout());
    for name in pin_names(node) {
        if let Some(map) = name.strip_prefix(&prefix) {
            std::fs::rename(
                node.pins().join(&name),
                node.pins().join(format!("map_{layout}_{map}")),
            )
            .unwrap();
        }
    }
}

#[test]
fn the_guard_is_pinned_under_its_versions_and_taken_over_by_pin() {
    own_network_namespace();
    let node = NodeCgroups::new("pinned", CgroupDriver::Cgroupfs);
    let holder = node.pod(None, HOLDER);
    let other = node.pod(Some("burstable"), OTHER);
    let port = 41_361;
    let guard = attach(&node).unwrap_or_else(|e| panic!("{e}"));
    assert!(!guard.took_over && !guard.upgrading());
    fill(&guard, &node, port, &holder);
    drop(guard);
    let version = bind_guard::program_version();
    let layout = bind_guard::layout();
    let names = pin_names(&node);
    for family in ["4", "6"] {
        assert!(
            names.contains(&format!("link{family}_{version}")),
            "{names:?}"
        );
        assert!(
            names.contains(&format!("prog{family}_{version}")),
            "{names:?}"
        );
    }
    assert!(
        names.contains(&format!("map_{layout}_pa_owners")),
        "{names:?}"
    );
    assert_eq!(
        names.len(),
        10,
        "two links, two programs, six maps: {names:?}"
    );
    assert_eq!(bind_in(Some(&other), port, "tcp", "4"), "EPERM", "no agent");

    let again = attach(&node).unwrap_or_else(|e| panic!("{e}"));
    assert!(again.took_over && !again.upgrading(), "taken over by pin");
    assert_eq!(pin_names(&node), names, "the same pins, nothing added");
    assert_eq!(bind_in(Some(&holder), port, "tcp", "4"), "ok");
    assert_eq!(bind_in(Some(&other), port, "tcp", "4"), "EPERM");
    assert_eq!(
        BindGuard::attached(&node.kubepods(), &node.pins()).unwrap(),
        2
    );
    assert_eq!(
        BindGuard::detach(&node.kubepods(), &node.pins()).unwrap(),
        2
    );
    assert_eq!(bind_in(Some(&other), port, "tcp", "4"), "ok", "detached");
}

#[test]
fn another_version_s_program_is_replaced_in_place_keeping_its_maps() {
    own_network_namespace();
    let node = NodeCgroups::new("upgrade", CgroupDriver::Systemd);
    let holder = node.pod(None, HOLDER);
    let other = node.pod(Some("besteffort"), OTHER);
    let port = 41_362;
    let guard = attach(&node).unwrap_or_else(|e| panic!("{e}"));
    fill(&guard, &node, port, &holder);
    drop(guard);
    // As an agent of another release left it: its program's version in the names.
    as_another_version(&node, "0123456789abcdef");
    let old: Vec<String> = pin_names(&node);
    assert!(
        old.contains(&"link4_0123456789abcdef".to_string()),
        "{old:?}"
    );

    let upgraded = attach(&node).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        upgraded.took_over && !upgraded.upgrading(),
        "same layout: done at once"
    );
    let version = bind_guard::program_version();
    let names = pin_names(&node);
    assert!(names.contains(&format!("link4_{version}")), "{names:?}");
    assert!(names.contains(&format!("prog6_{version}")), "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains("0123456789abcdef")),
        "{names:?}"
    );
    assert_eq!(names.len(), 10, "{names:?}");
    // The maps kept their contents across the swap.
    assert_eq!(bind_in(Some(&holder), port, "tcp", "4"), "ok");
    assert_eq!(bind_in(Some(&other), port, "tcp", "4"), "EPERM");
    BindGuard::detach(&node.kubepods(), &node.pins()).unwrap();
}

#[test]
fn a_new_map_layout_is_filled_before_the_program_is_swapped_and_a_racing_writer_is_noticed() {
    own_network_namespace();
    let node = NodeCgroups::new("layout", CgroupDriver::Cgroupfs);
    let holder = node.pod(None, HOLDER);
    let other = node.pod(Some("burstable"), OTHER);
    let port = 41_363;
    let guard = attach(&node).unwrap_or_else(|e| panic!("{e}"));
    fill(&guard, &node, port, &holder);
    drop(guard);
    // Another release's program over maps of another layout.
    as_another_layout(&node, "deadbeef");
    as_another_version(&node, "0123456789abcdef");
    let names = pin_names(&node);
    assert!(
        names.contains(&"map_deadbeef_pa_owners".to_string()),
        "{names:?}"
    );

    let mut upgrading = attach(&node).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        upgrading.upgrading() && !upgrading.took_over,
        "new maps, not swapped yet"
    );
    // A second agent racing this one (a rollout overlapping) swaps first.
    let mut racer = attach(&node).unwrap_or_else(|e| panic!("{e}"));
    assert!(racer.upgrading());
    // Until the swap, the old program judges by the old maps: the holder binds.
    assert_eq!(bind_in(Some(&holder), port, "tcp", "4"), "ok");
    assert_eq!(bind_in(Some(&other), port, "tcp", "4"), "EPERM");
    // The racer fills its new maps the other way round (OTHER holds the port), then swaps.
    fill(&racer, &node, port, &other);
    assert!(racer.finish_upgrade().unwrap_or_else(|e| panic!("{e}")));
    assert!(!racer.upgrading() && racer.took_over);
    assert_eq!(
        bind_in(Some(&other), port, "tcp", "4"),
        "ok",
        "new maps judge"
    );
    assert_eq!(bind_in(Some(&holder), port, "tcp", "4"), "EPERM");
    // The first agent's swap finds the link no longer running the program it found: refused.
    fill(&upgrading, &node, port, &holder);
    match upgrading.finish_upgrade() {
        Err(e @ GuardError::Replace { .. }) => {
            assert!(e.to_string().contains("another writer"), "{e}")
        }
        other => panic!(
            "expected a refused replace, got {:?}",
            other.map_err(|e| e.to_string())
        ),
    }
    assert_eq!(
        bind_in(Some(&other), port, "tcp", "4"),
        "ok",
        "the racer's swap stands"
    );
    let layout = bind_guard::layout();
    let names = pin_names(&node);
    assert!(
        names.contains(&format!("map_{layout}_pa_modes")),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.contains("deadbeef")), "{names:?}");
    assert_eq!(
        names.len(),
        10,
        "the pins left as the racer made them: {names:?}"
    );
    drop((upgrading, racer));
    let next = attach(&node).unwrap_or_else(|e| panic!("{e}"));
    assert!(next.took_over && !next.upgrading(), "taken over whole");
    assert_eq!(bind_in(Some(&other), port, "tcp", "4"), "ok");
    assert_eq!(bind_in(Some(&holder), port, "tcp", "4"), "EPERM");
    BindGuard::detach(&node.kubepods(), &node.pins()).unwrap();
}

#[test]
fn a_directory_not_on_a_bpffs_is_refused_with_the_mount_to_make() {
    own_network_namespace();
    let node = NodeCgroups::new("no-bpffs", CgroupDriver::Cgroupfs);
    let plain = tempfile::tempdir().unwrap();
    let level = cgroups::level(&node.kubepods()).unwrap() + 1;
    let pins = plain.path().join("kubectl-portalloc").join("node");
    let refused = BindGuard::attach(&node.kubepods(), &pins, level, netns_cookie().unwrap());
    let message = match refused {
        Err(e @ GuardError::NotBpffs { .. }) => e.to_string(),
        other => panic!("expected NotBpffs, got {:?}", other.map(|g| g.took_over)),
    };
    assert!(
        message.contains("mount -t bpf bpf /sys/fs/bpf"),
        "{message}"
    );
    assert!(!pins.exists(), "nothing made outside a bpffs");
    assert_eq!(
        BindGuard::attached(&node.kubepods(), &pins).unwrap(),
        0,
        "and nothing attached"
    );
}

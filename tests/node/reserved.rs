//! The reserved-ports setting of a network namespace of the test's own, read and written by the
//! agent's code against the real kernel: values far longer than one small read.

use std::collections::BTreeSet;
use std::io::Read;

use portalloc::node::reserved_ports::{self, ReservedPorts, SYSCTL, read_whole};

use crate::common::node_cgroups::own_network_namespace;

/// The setting as one read of a buffer far past its limit sees it.
fn kernel_value() -> String {
    let mut buf = vec![0u8; 1 << 20];
    let n = std::fs::File::open(SYSCTL).unwrap().read(&mut buf).unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

fn write(value: &str) {
    std::fs::write(SYSCTL, value).unwrap_or_else(|e| panic!("write {SYSCTL}: {e}"));
}

fn ports(text: &str) -> BTreeSet<u16> {
    reserved_ports::parse(text).unwrap()
}

#[test]
fn the_kernel_answers_only_the_first_read_so_the_whole_value_is_read_at_once() {
    own_network_namespace();
    let value = "30000-32767,33000-33009,34000-34099,35000,36000-36010\n";
    write(value);
    let mut file = std::fs::File::open(SYSCTL).unwrap();
    let mut first = [0u8; 32];
    assert_eq!(file.read(&mut first).unwrap(), 32);
    let mut rest = Vec::new();
    assert_eq!(
        file.read_to_end(&mut rest).unwrap(),
        0,
        "end-of-file after a partial read"
    );
    assert_eq!(read_whole(std::path::Path::new(SYSCTL)).unwrap(), value);
    // Near the kernel's longest: pairs of five-digit ports, a gap between them.
    let pairs: Vec<String> = (10_000u32..65_534)
        .step_by(3)
        .map(|p| format!("{p}-{}", p + 1))
        .collect();
    let longest = format!("{}\n", pairs.join(","));
    assert!(longest.len() > 200_000, "{}", longest.len());
    write(&longest);
    assert_eq!(kernel_value(), longest, "the kernel prints it as written");
    assert_eq!(read_whole(std::path::Path::new(SYSCTL)).unwrap(), longest);
}

#[test]
fn a_long_value_of_others_is_kept_whole_around_the_pools_ports() {
    own_network_namespace();
    // Cilium's NodePort range and many more entries of every length: several KiB.
    let mut others = vec!["30000-32767".to_string(), "33000-33009".to_string()];
    others.extend((0..1500u32).map(|i| match i % 2 {
        0 => (1024 + i * 13).to_string(),
        _ => format!("{}-{}", 1024 + i * 13, 1024 + i * 13 + 4),
    }));
    let others = others.join(",");
    assert!(others.len() > 8 * 1024, "{} bytes", others.len());
    write(&format!("{others}\n"));
    let state = tempfile::tempdir().unwrap();
    let agent = ReservedPorts::at(std::path::Path::new(SYSCTL), state.path());
    let pools = ports("45000-45009,31000,50000");
    let done = agent.apply(&pools).unwrap();
    assert!(done.written);
    let all: BTreeSet<u16> = ports(&others).union(&pools).copied().collect();
    assert_eq!(ports(&kernel_value()), all);
    assert_eq!(done.ours, ports("45000-45009,50000"), "31000 is Cilium's");
    // The pools go: exactly the others' entries stay, 31000 among them.
    agent.apply(&BTreeSet::new()).unwrap();
    assert_eq!(ports(&kernel_value()), ports(&others));
}

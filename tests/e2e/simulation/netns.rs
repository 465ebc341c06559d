//! One network namespace per simulated node, joined by a bridge: what hostNetwork pods on
//! different nodes see. A node's pods share its namespace (so two of them binding one port
//! collide, as on a real node); pods on other nodes reach them at the node's address.
//!
//! Nothing here touches this machine's own network: the bridge lives in a namespace of its
//! own, each node's end of its link is created straight into the node's namespace, and every
//! namespace is held by a process of ours that ends with the test process. When the holders
//! end, the namespaces and links go with them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A process that holds a new network namespace open (`unshare --net`) until it is killed or
/// the test process ends.
struct Holder(Child);

impl Holder {
    fn start() -> Holder {
        // It says `ready` once it runs inside the new namespace.
        let script = format!(
            "echo ready; while kill -0 {} 2>/dev/null; do sleep 1; done",
            std::process::id()
        );
        let mut child = Command::new("unshare")
            .args(["--net", "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare --net (the node simulation needs network namespaces)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "unshare --net did not start (this machine must allow network namespaces)"
        );
        Holder(child)
    }

    fn netns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.0.id()))
    }

    /// Run `ip ARGS` in this namespace.
    fn ip(&self, args: &[&str]) {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.netns().display()))
            .arg("--")
            .arg("ip")
            .args(args)
            .output()
            .expect("nsenter ... ip");
        assert!(
            out.status.success(),
            "ip {} in a node simulation namespace: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The simulated nodes' networks.
pub struct NodeNetworks {
    nodes: BTreeMap<String, (Holder, Ipv4Addr)>,
    // Dropped last: the bridge outlives the links on it.
    _fabric: Holder,
}

impl NodeNetworks {
    /// A namespace per node with the node's address (`10.200.x.y`, as `nodes.rs` gives it:
    /// one /16, one bridge) on its `eth0`, and loopback up.
    pub fn new<'a>(nodes: impl IntoIterator<Item = (&'a str, Ipv4Addr)>) -> NodeNetworks {
        let fabric = Holder::start();
        fabric.ip(&["link", "set", "lo", "up"]);
        fabric.ip(&["link", "add", "br0", "type", "bridge"]);
        fabric.ip(&["link", "set", "br0", "up"]);
        let mut out = BTreeMap::new();
        for (i, (name, address)) in nodes.into_iter().enumerate() {
            let node = Holder::start();
            let link = format!("n{i}");
            let pid = node.0.id().to_string();
            fabric.ip(&[
                "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &pid,
            ]);
            fabric.ip(&["link", "set", &link, "master", "br0", "up"]);
            node.ip(&["addr", "add", &format!("{address}/16"), "dev", "eth0"]);
            node.ip(&["link", "set", "eth0", "up"]);
            node.ip(&["link", "set", "lo", "up"]);
            out.insert(name.to_string(), (node, address));
        }
        NodeNetworks {
            nodes: out,
            _fabric: fabric,
        }
    }

    /// Run `ip ARGS` in the namespace of `node` (e.g. a default route for a client of cluster
    /// IPs).
    pub fn ip(&self, node: &str, args: &[&str]) {
        self.holder(node).ip(args);
    }

    fn holder(&self, node: &str) -> &Holder {
        &self
            .nodes
            .get(node)
            .unwrap_or_else(|| panic!("no simulated network for node {node}"))
            .0
    }

    /// The namespace of `node`, for `nsenter --net=`.
    pub fn netns(&self, node: &str) -> PathBuf {
        self.holder(node).netns()
    }
}

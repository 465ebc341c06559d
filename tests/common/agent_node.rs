//! A simulated node for the node agent: a network namespace of its own (held by the relay
//! process that `unshare --net` starts), or one the caller already holds (the node
//! simulation's, `AgentNode::start_in`), a cgroup v2 tree laid out as kubelet's, and the agent
//! binary running inside that namespace. The agent reaches the API server on the host's
//! loopback through a relay over a UNIX socket: the filesystem is shared across network
//! namespaces, loopback is not. The end-to-end test (tests/e2e/node_agent.rs) and the node
//! benchmark (benches/node) share it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub use super::node_cgroups::NodeCgroups;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");

/// A helper script of the kernel-level tests (tests/node/*.py).
pub fn script(name: &str) -> String {
    format!("{}/tests/node/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The API server's port, from the kubeconfig's `server: https://127.0.0.1:PORT`.
pub fn apiserver_port(kubeconfig: &Path) -> u16 {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://127.0.0.1:"))
        .expect("a loopback server in the kubeconfig");
    server.trim().parse().unwrap()
}

/// The host side of the relay: each connection on the UNIX socket, carried to the API server.
fn host_relay(socket: &Path, port: u16) {
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let Ok(upstream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            let (mut a, mut b) = (conn.try_clone().unwrap(), upstream.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut a, &mut b);
                let _ = b.shutdown(std::net::Shutdown::Both);
            });
            let (mut c, mut d) = (upstream, conn);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c, &mut d);
                let _ = d.shutdown(std::net::Shutdown::Both);
            });
        }
    });
}

/// The API server, reachable inside a network namespace at the kubeconfig's own address
/// (`127.0.0.1:PORT`): relay.py listens there and carries each connection over a UNIX socket
/// to the host side, which connects it on. Its process holds the namespace it made, if it made
/// one; it is killed on drop.
pub struct ApiRelay {
    process: Child,
    _dir: tempfile::TempDir,
}

impl ApiRelay {
    /// In a new network namespace of its own (`netns` None), or in the existing `netns` (a
    /// `/proc/PID/ns/net` of a process that holds it, its loopback up).
    pub fn start(kubeconfig: &Path, netns: Option<&Path>) -> ApiRelay {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("api.sock");
        let port = apiserver_port(kubeconfig);
        host_relay(&socket, port);
        let relay = format!(
            "exec python3 '{}' {port} '{}'",
            script("relay.py"),
            socket.display()
        );
        let mut command = match netns {
            None => {
                let mut unshare = Command::new("unshare");
                unshare.args([
                    "--net",
                    "--",
                    "sh",
                    "-c",
                    &format!("ip link set lo up && {relay}"),
                ]);
                unshare
            }
            Some(netns) => {
                let mut nsenter = Command::new("nsenter");
                nsenter
                    .arg(format!("--net={}", netns.display()))
                    .args(["--", "sh", "-c", &relay]);
                nsenter
            }
        };
        let mut process = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the relay (unshare --net, or nsenter --net)");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(process.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready", "the relay did not start");
        ApiRelay { process, _dir: dir }
    }

    /// The relay's pid: `/proc/PID/ns/net` names its namespace.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }
}

impl Drop for ApiRelay {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The node: a network namespace the relay runs in (and, from `start`, holds), whose pid
/// names it.
pub struct AgentNode {
    relay: ApiRelay,
    pub cgroups: NodeCgroups,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    agent: Option<Child>,
    /// The only capabilities the agent runs with (`setpriv` names: `bpf`, `net_admin`), as
    /// the chart grants them; `None`: the test's own (all of root's).
    pub capabilities: Option<Vec<&'static str>>,
}

impl AgentNode {
    /// A node whose cgroup tree is named `name` (kubelet's cgroupfs layout), for the cluster
    /// of `kubeconfig`.
    pub fn start(kubeconfig: &Path, name: &str) -> AgentNode {
        Self::start_with(kubeconfig, name, None)
    }

    /// The same in the existing network namespace `netns` (a `/proc/PID/ns/net` of a process
    /// that holds it, its loopback up): the relay joins it, and the caller keeps holding it.
    pub fn start_in(kubeconfig: &Path, name: &str, netns: &Path) -> AgentNode {
        Self::start_with(kubeconfig, name, Some(netns))
    }

    fn start_with(kubeconfig: &Path, name: &str, netns: Option<&Path>) -> AgentNode {
        AgentNode {
            relay: ApiRelay::start(kubeconfig, netns),
            cgroups: NodeCgroups::new(name, portalloc::node::cgroups::CgroupDriver::Cgroupfs),
            dir: tempfile::tempdir().unwrap(),
            kubeconfig: kubeconfig.to_path_buf(),
            agent: None,
            capabilities: None,
        }
    }

    /// A command run inside the node's network namespace (`nsenter` execs it: same pid).
    pub fn nsenter(&self) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/proc/{}/ns/net", self.relay.pid()))
            .arg("--");
        command
    }

    /// Start `kubectl-portalloc node-agent ARGS` in the node (its cgroup root and a state
    /// directory of the node's own added), logging to the node's `agent.log`.
    pub fn start_agent(&mut self, args: &[&str]) {
        let log = std::fs::File::create(self.dir.path().join("agent.log")).unwrap();
        let mut command = self.nsenter();
        if let Some(caps) = &self.capabilities {
            // Inheritable, ambient and bounding sets: root's exec keeps exactly these.
            let set = format!(
                "-all,{}",
                caps.iter()
                    .map(|c| format!("+{c}"))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            command.args([
                "setpriv",
                &format!("--inh-caps={set}"),
                &format!("--ambient-caps={set}"),
                &format!("--bounding-set={set}"),
                "--",
            ]);
        }
        let child = command
            .arg(BIN)
            .arg("node-agent")
            .args(args)
            .arg("--cgroup-root")
            .arg(&self.cgroups.root)
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .arg("--bpf-dir")
            .arg(self.cgroups.bpf_dir())
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the node agent");
        self.agent = Some(child);
    }

    /// The running agent's pid.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(Child::id)
    }

    /// The running agent's effective capabilities (`CapEff` of /proc/PID/status).
    pub fn agent_capabilities(&self) -> u64 {
        let pid = self.agent_pid().expect("an agent running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .expect("CapEff in /proc/PID/status");
        u64::from_str_radix(hex.trim(), 16).unwrap()
    }

    /// SIGTERM to the agent, as kubelet stops a container; its exit, waited for (at most 30 s,
    /// a pod's default grace period).
    pub fn terminate_agent(&mut self) -> std::process::ExitStatus {
        let mut agent = self.agent.take().expect("an agent running");
        // SAFETY: kill(2) on the pid of a child we started and have not waited for.
        unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = agent.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > std::time::Duration::from_secs(30) {
                let _ = agent.kill();
                panic!(
                    "the agent did not exit within 30 s of SIGTERM:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    pub fn kill_agent(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let _ = agent.kill(); // SIGKILL: no clean-up at all
            let _ = agent.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// Run a shell line in the node's namespace; its standard output.
    pub fn sh(&self, line: &str) -> String {
        let out = self.nsenter().args(["sh", "-c", line]).output().unwrap();
        assert!(
            out.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Bind `port` from a process in `cgroup` (None: outside pods), in the node's namespace.
    pub fn bind(&self, cgroup: Option<&Path>, port: u16) -> String {
        let enter = cgroup.map_or(String::new(), |cg| {
            format!("echo $$ > '{}/cgroup.procs' && ", cg.display())
        });
        self.sh(&format!(
            "{enter}exec python3 '{}' {port} tcp 4",
            script("binder.py")
        ))
    }
}

impl Drop for AgentNode {
    fn drop(&mut self) {
        self.kill_agent();
        let _ = portalloc::node::bind_guard::BindGuard::detach(
            &self.cgroups.kubepods(),
            &self.cgroups.pins(),
        );
        // The relay (and the namespace it holds) goes with the fields.
    }
}

//! Running the pods on this machine, as if on one node: one process per container with its own
//! command line and env, the ConfigMap's files mounted where the container mounts them (a
//! private mount namespace per container, so /etc/portalloc and /tmp are its own), the engine
//! stand-in first on PATH. Then reading what the stand-ins logged.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::netns::NodeNetworks;
use super::pods::{Pod, Source};
use crate::support::repo_root;

/// What one container did.
pub struct ContainerRun {
    pub pod: Pod,
    pub container: String,
    child: Child,
    log: PathBuf,
    output: PathBuf,
    pub exit: Option<i32>,
    pub events: Vec<Value>,
}

impl ContainerRun {
    fn refresh(&mut self) {
        self.read_log();
        if self.exit.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exit = Some(status.code().unwrap_or(-1));
        }
    }

    fn read_log(&mut self) {
        self.events = std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
    }

    fn events_of<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.events.iter().filter(move |e| e["event"] == kind)
    }

    /// Stand-in invocations that have not reported up (or failed).
    fn pending(&self) -> usize {
        let started: BTreeSet<&str> = self
            .events_of("start")
            .map(|e| e["id"].as_str().unwrap())
            .collect();
        let up: BTreeSet<&str> = self
            .events_of("up")
            .map(|e| e["id"].as_str().unwrap())
            .collect();
        started.difference(&up).count()
    }

    /// Every engine it started is serving and the container is still running.
    pub fn up(&self) -> bool {
        self.exit.is_none() && self.events_of("start").next().is_some() && self.pending() == 0
    }

    /// Why it failed, if it did: a stand-in's failure, or the container ending.
    pub fn failures(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .events_of("fail")
            .map(|e| format!("{}: {}", e["prog"].as_str().unwrap_or("?"), e["error"]))
            .collect();
        if let Some(code) = self.exit {
            out.push(format!("container exited with {code}"));
        }
        out
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    /// Ports bound, with the flag each came from.
    pub fn binds(&self) -> Vec<(u64, String)> {
        self.events_of("bind")
            .filter(|e| e["ok"] == true)
            .map(|e| {
                (
                    e["port"].as_u64().unwrap(),
                    e["why"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// Connections made: (host:port, pod that answered).
    pub fn connects(&self) -> Vec<(String, String)> {
        self.events_of("connect")
            .filter(|e| e["ok"] == true)
            .map(|e| {
                (
                    format!("{}:{}", e["host"].as_str().unwrap(), e["port"]),
                    e["reached"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    pub fn processes(&self) -> usize {
        self.events_of("start").count()
    }
}

/// Ports by the flag they came from, runs of consecutive ports as `first-last`:
/// `61000(--port) 61010-61073(--min-worker-port..--max-worker-port)`.
fn compact(binds: &[(u64, String)]) -> String {
    let mut runs: Vec<(u64, u64, &str)> = Vec::new();
    for (port, why) in binds {
        match runs.last_mut() {
            Some((_, last, w)) if *w == why.as_str() && *last + 1 == *port => *last = *port,
            _ => runs.push((*port, *port, why)),
        }
    }
    runs.iter()
        .map(|(first, last, why)| {
            let why = why.split(' ').next().unwrap();
            if first == last {
                format!("{first}({why})")
            } else {
                format!("{first}-{last}({why})")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The outcome of one simulated run.
pub struct Outcome {
    /// Logs, outputs and mounts of the run; removed when the outcome is dropped, unless a test
    /// is failing (then it stays, for a look).
    pub dir: PathBuf,
    pub runs: Vec<ContainerRun>,
    pub elapsed: Duration,
    pub all_up: bool,
}

impl Outcome {
    pub fn pod(&self, name: &str) -> &ContainerRun {
        self.runs
            .iter()
            .find(|r| r.pod.name == name)
            .unwrap_or_else(|| panic!("no pod {name} in the simulation"))
    }

    /// The pods a pod's connections reached.
    pub fn reached(&self, name: &str) -> BTreeSet<String> {
        self.pod(name)
            .connects()
            .into_iter()
            .map(|(_, reached)| reached)
            .collect()
    }

    pub fn binds(&self) -> usize {
        self.runs.iter().map(|r| r.binds().len()).sum()
    }

    pub fn connects(&self) -> usize {
        self.runs.iter().map(|r| r.connects().len()).sum()
    }

    /// Every bind that failed (EADDRINUSE or another error), as `pod: port (flag): error`.
    pub fn refused_binds(&self) -> Vec<String> {
        self.runs
            .iter()
            .flat_map(|r| {
                r.events_of("bind").filter(|e| e["ok"] == false).map(|e| {
                    format!(
                        "{}: {} ({}): {}",
                        r.pod.name,
                        e["port"],
                        e["why"].as_str().unwrap_or("?"),
                        e["error"].as_str().unwrap_or("?")
                    )
                })
            })
            .collect()
    }

    /// One line per pod, and the totals.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for run in &self.runs {
            let binds = compact(&run.binds());
            let connects: Vec<String> = run
                .connects()
                .iter()
                .map(|(to, pod)| format!("{to}->{pod}"))
                .collect();
            let group = run
                .pod
                .group
                .map(|g| format!(" group {g}"))
                .unwrap_or_default();
            writeln!(
                out,
                "{} [{}{group}] on {} {}: {} process(es); bound {}; reached {}",
                run.pod.name,
                run.pod.workload,
                run.pod.node,
                if run.up() { "up" } else { "NOT UP" },
                run.processes(),
                binds,
                if connects.is_empty() {
                    "-".to_string()
                } else {
                    connects.join(" ")
                }
            )
            .unwrap();
        }
        writeln!(
            out,
            "{} pods, {} processes, {} ports bound, {} connections, all up in {:.1}s: {}",
            self.runs.len(),
            self.runs.iter().map(ContainerRun::processes).sum::<usize>(),
            self.binds(),
            self.connects(),
            self.elapsed.as_secs_f64(),
            self.all_up
        )
        .unwrap();
        out
    }

    /// Every pod started and serving; no bind failed (EADDRINUSE or other), no connection
    /// failed or reached the wrong pod, no container ended.
    pub fn assert_clean(&self) {
        let mut problems = String::new();
        for run in &self.runs {
            let failures = run.failures();
            if !failures.is_empty() || !run.up() {
                writeln!(
                    problems,
                    "{} (container {}): {}\n  output: {}",
                    run.pod.name,
                    run.container,
                    if failures.is_empty() {
                        "never came up".to_string()
                    } else {
                        failures.join("; ")
                    },
                    run.output().trim_end().replace('\n', "\n          ")
                )
                .unwrap();
            }
        }
        assert!(
            problems.is_empty() && self.all_up,
            "simulation failed:\n{problems}\n{}",
            self.summary()
        );
    }
}

/// A fresh directory for one run, under /var/tmp: never under /tmp, which each container
/// replaces with its own (a checkout in /tmp would vanish from the containers' view, stand-ins,
/// logs and env files with it).
fn run_dir() -> PathBuf {
    let dir = PathBuf::from("/var/tmp/kubectl-portalloc-simulation")
        .join(crate::support::unique_name("run"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The stand-in, under each name the examples call.
fn install_standin(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // A copy in the run directory: the checkout may lie under /tmp, out of the containers' view.
    let standin = dir.join("standin.py");
    std::fs::copy(repo_root().join("tests/simulation/standin.py"), &standin).unwrap();
    for name in ["python3", "ray", "vllm"] {
        std::os::unix::fs::symlink(&standin, bin.join(name)).unwrap();
    }
    bin
}

/// Start every container of every pod at once, wait until all serve (or one fails, or
/// `timeout`), then kill them all. `configmaps` holds the data of the ConfigMaps that exist.
/// All on this machine's loopback, as on one node.
pub fn run(
    pods: &[Pod],
    dns: &BTreeMap<String, BTreeSet<String>>,
    configmaps: &BTreeMap<String, BTreeMap<String, String>>,
    timeout: Duration,
) -> Outcome {
    run_in(pods, dns, configmaps, None, &BTreeMap::new(), timeout)
}

/// The same, each pod in the network namespace of its node (`pod.node`), where the stand-ins
/// bind every address (as engines given `--host 0.0.0.0`) and reach other nodes' pods at their
/// node's address: a port collides only with the ports of pods on the same node.
pub fn run_on_nodes(
    pods: &[Pod],
    dns: &BTreeMap<String, BTreeSet<String>>,
    configmaps: &BTreeMap<String, BTreeMap<String, String>>,
    nodes: &NodeNetworks,
    timeout: Duration,
) -> Outcome {
    run_in(
        pods,
        dns,
        configmaps,
        Some(nodes),
        &BTreeMap::new(),
        timeout,
    )
}

/// The same, each pod named in `cgroups` started inside that cgroup (a directory of a cgroup v2
/// tree, as kubelet and the runtime make a container's): its container's first process enters
/// it before anything else runs, so the pod's every process (daemons `ray start` leaves
/// included) is the pod's, as a node agent's bind guard judges pods.
pub fn run_on_nodes_in_cgroups(
    pods: &[Pod],
    dns: &BTreeMap<String, BTreeSet<String>>,
    configmaps: &BTreeMap<String, BTreeMap<String, String>>,
    nodes: &NodeNetworks,
    cgroups: &BTreeMap<String, PathBuf>,
    timeout: Duration,
) -> Outcome {
    run_in(pods, dns, configmaps, Some(nodes), cgroups, timeout)
}

fn run_in(
    pods: &[Pod],
    dns: &BTreeMap<String, BTreeSet<String>>,
    configmaps: &BTreeMap<String, BTreeMap<String, String>>,
    nodes: Option<&NodeNetworks>,
    cgroups: &BTreeMap<String, PathBuf>,
    timeout: Duration,
) -> Outcome {
    let dir = run_dir();
    let bin = install_standin(&dir);
    // A name leads to its pods' node (the first one's, for a name of several pods on several
    // nodes: the stand-in checks that the pod it reaches is one of them).
    let host_ip = |pod_names: &BTreeSet<String>| -> String {
        let first = pod_names
            .iter()
            .next()
            .and_then(|name| pods.iter().find(|p| &p.name == name));
        match (nodes, first) {
            (Some(_), Some(pod)) => pod.host_ip.clone(),
            _ => "127.0.0.1".to_string(),
        }
    };
    let hosts: BTreeMap<&String, Value> = dns
        .iter()
        .map(|(name, pods)| (name, serde_json::json!({"ip": host_ip(pods), "pods": pods})))
        .collect();
    let cluster_hosts = dir.join("hosts.json");
    std::fs::write(&cluster_hosts, serde_json::to_string(&hosts).unwrap()).unwrap();
    let node_hosts = dir.join("node-hosts.json");
    std::fs::write(&node_hosts, "{}").unwrap();
    for (name, data) in configmaps {
        let cm = dir.join("configmaps").join(name);
        std::fs::create_dir_all(&cm).unwrap();
        for (key, text) in data {
            std::fs::write(cm.join(key), text).unwrap();
        }
    }
    let started = Instant::now();
    let mut runs = Vec::new();
    for pod in pods {
        for container in &pod.containers {
            let id = format!("{}-{}", pod.name, container.name);
            let tmp = dir.join(&id).join("tmp");
            std::fs::create_dir_all(&tmp).unwrap();
            let mut mounts = Vec::new();
            for mount in &container.mounts {
                let source = match &mount.source {
                    Source::ConfigMap { name, optional } => {
                        let path = dir.join("configmaps").join(name);
                        assert!(
                            path.exists() || *optional,
                            "{}: ConfigMap {name} does not exist and is not optional: the pod would not start",
                            pod.name
                        );
                        std::fs::create_dir_all(&path).unwrap();
                        path
                    }
                    Source::EmptyDir => {
                        let path = dir.join(&id).join(mount.path.replace('/', "_"));
                        std::fs::create_dir_all(&path).unwrap();
                        path
                    }
                };
                mounts.push((source, mount.path.clone()));
            }
            // The container's own /tmp last: every source above may lie under /tmp (a
            // checkout in /tmp), and it is gone from view once /tmp is replaced.
            mounts.push((tmp.clone(), "/tmp".to_string()));
            let mut script = String::from("set -e\n");
            if let Some(cgroup) = cgroups.get(&pod.name) {
                // This shell execs the container's command: same process, same cgroup.
                let procs = quote(cgroup.join("cgroup.procs").to_str().unwrap());
                writeln!(script, "echo $$ > {procs}").unwrap();
            }
            for (source, target) in &mounts {
                let (source, target) = (quote(source.to_str().unwrap()), quote(target));
                writeln!(script, "mkdir -p {target}\nmount --bind {source} {target}").unwrap();
            }
            script.push_str("exec \"$@\"\n");
            let log = dir.join(format!("{id}.jsonl"));
            let output = dir.join(format!("{id}.out"));
            let out = std::fs::File::create(&output).unwrap();
            let mut path = format!(
                "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                bin.display()
            );
            let mut command = match nodes {
                Some(nodes) => {
                    let mut enter = Command::new("nsenter");
                    enter
                        .arg(format!("--net={}", nodes.netns(&pod.node).display()))
                        .arg("--")
                        .arg("unshare");
                    enter
                }
                None => Command::new("unshare"),
            };
            command
                .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
                .arg(&script)
                .arg("sim-mount")
                .args(&container.argv)
                .env_clear()
                .env(
                    "PORTALLOC_SIM_BIND",
                    if nodes.is_some() {
                        "0.0.0.0"
                    } else {
                        "127.0.0.1"
                    },
                )
                .env("HOSTNAME", &pod.name)
                .env("HOME", "/root")
                .env("PORTALLOC_SIM_POD", &pod.name)
                .env("PORTALLOC_SIM_LOG", &log)
                .env(
                    "PORTALLOC_SIM_HOSTS",
                    if pod.cluster_dns {
                        &cluster_hosts
                    } else {
                        &node_hosts
                    },
                )
                .env("PORTALLOC_SIM_TIMEOUT", timeout.as_secs().to_string());
            for (key, value) in &container.env {
                if key == "PATH" {
                    path = format!("{}:{value}", bin.display());
                } else {
                    command.env(key, value);
                }
            }
            let child = command
                .env("PATH", path)
                .current_dir("/")
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .process_group(0)
                .spawn()
                .expect("spawn unshare");
            runs.push(ContainerRun {
                pod: pod.clone(),
                container: container.name.clone(),
                child,
                log,
                output,
                exit: None,
                events: Vec::new(),
            });
        }
    }
    let deadline = started + timeout + Duration::from_secs(5);
    let mut settled_at = None;
    let all_up = loop {
        std::thread::sleep(Duration::from_millis(100));
        runs.iter_mut().for_each(ContainerRun::refresh);
        let failed = runs.iter().any(|r| !r.failures().is_empty());
        let up = runs.iter().all(ContainerRun::up);
        if failed || Instant::now() > deadline {
            break false;
        }
        if up {
            // Stay a moment longer: a late failure (a second bind, a process exiting) counts.
            let at = *settled_at.get_or_insert_with(Instant::now);
            if at.elapsed() > Duration::from_millis(500) {
                break true;
            }
        }
    };
    let elapsed = match settled_at {
        Some(at) if all_up => at - started,
        _ => started.elapsed(),
    };
    for run in &mut runs {
        // The container's whole process group: daemons it left (`ray start`) included.
        unsafe {
            libc::killpg(run.child.id() as i32, libc::SIGKILL);
        }
        let _ = run.child.wait();
        run.read_log();
    }
    Outcome {
        dir,
        runs,
        elapsed,
        all_up,
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

//! The node agent on a real node: the chart's node-agent DaemonSet, from the project's own image,
//! run by a real kubelet with containerd and runc (tests/image/kubelet_node.rs), placed by the
//! real DaemonSet controller and scheduler, over a control plane with the ServiceAccount plugin
//! on (the agent's token is kubelet's projected one). Pods are hostNetwork busybox containers of
//! a small image built here: the holder's `nc -l -p $HTTP_PORT` binds the port the pod webhook
//! gave it, in the cgroup kubelet made.
//!
//! The one stand-in: no kube-proxy runs on the node, so the agent's `KUBERNETES_SERVICE_HOST`
//! and `_PORT` (chart value `nodeAgent.env`) name the relay to the API server, as a cluster
//! without kube-proxy sets them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use portalloc::ledger::node_report::NODE_AGENT_NAMESPACE as AGENT_NAMESPACE;
use serde_json::Value;

use super::agent_node::apiserver_port;
use super::control_plane::{ControlPlane, install_crds};
use super::controllers::{Controllers, ControllersOptions};
use super::kubelet_node::{KubeletNode, PAUSE_IMAGE, node_failure};
use super::watcher::{kubectl, kubectl_stdin};
use super::{DEBUG_BIN, VERSION, build_image, repo, run_ok, unable};

const NODE: &str = "real-node";
const AGENT_IMAGE: &str = "portalloc.test/kubectl-portalloc";
const BUSYBOX_IMAGE: &str = "portalloc.test/busybox:1";
const POOL_RANGE: &str = "45100-45109";

/// A small image of Debian's static busybox, as a docker-archive for `ctr images import`,
/// named both as the test pods' image and as the sandboxes' pause image.
fn busybox_archives(dir: &Path) -> Vec<PathBuf> {
    let busybox = Path::new("/bin/busybox");
    let kind = run_ok("file", Command::new("file").arg("-L").arg(busybox));
    if !kind.contains("statically linked") {
        unable(
            "real node",
            "/bin/busybox is not statically linked: install busybox-static (scripts/install-deps.sh)",
        );
    }
    let layout = dir.join("busybox-oci");
    let bundle = dir.join("busybox-bundle");
    let image = format!("{}:1", layout.display());
    run_ok(
        "umoci init",
        Command::new("umoci")
            .args(["init", "--layout"])
            .arg(&layout),
    );
    run_ok(
        "umoci new",
        Command::new("umoci").args(["new", "--image", &image]),
    );
    run_ok(
        "umoci unpack",
        Command::new("umoci")
            .args(["unpack", "--rootless", "--image", &image])
            .arg(&bundle),
    );
    let bin = bundle.join("rootfs/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    for applet in ["sh", "sleep", "nc"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    run_ok(
        "umoci repack",
        Command::new("umoci")
            .args(["repack", "--image", &image])
            .arg(&bundle),
    );
    run_ok(
        "umoci config",
        Command::new("umoci").args([
            "config",
            "--image",
            &image,
            "--config.cmd",
            "/bin/sleep",
            "--config.cmd",
            "infinity",
        ]),
    );
    [BUSYBOX_IMAGE, PAUSE_IMAGE]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let archive = dir.join(format!("busybox-{i}.tar"));
            docker_archive(&format!("oci:{image}"), &archive, name);
            archive
        })
        .collect()
}

fn docker_archive(from: &str, to: &Path, name: &str) {
    run_ok(
        "skopeo copy",
        Command::new("skopeo").args([
            "copy",
            "-q",
            from,
            &format!("docker-archive:{}:{name}", to.display()),
        ]),
    );
}

fn helm() -> PathBuf {
    let out = run_ok(
        "scripts/build-helm.sh",
        Command::new(repo().join("scripts/build-helm.sh")).stderr(Stdio::inherit()),
    );
    PathBuf::from(out.lines().last().expect("a path").trim())
}

/// The chart's node-agent objects only, for this node: its image, cgroup tree, state and bpffs.
fn render_agent(node: &KubeletNode, kubeconfig: &Path, tag: &str) -> String {
    let cgroups = node.netns.cgroups.root.display().to_string();
    let state = node.dir.path().join("agent-state").display().to_string();
    let port = apiserver_port(kubeconfig).to_string();
    // Strings all (`--set-string`): an env value must stay "6443", not become a number.
    let sets = [
        format!("image.repository={AGENT_IMAGE}"),
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".to_string(),
        format!("nodeAgent.hostCgroupRoot={cgroups}"),
        format!("nodeAgent.hostStateDir={state}"),
        // A bpffs of the test's own: the machine's /sys/fs/bpf is never touched.
        format!(
            "nodeAgent.hostBpfDir={}",
            node.netns.cgroups.bpf.path().display()
        ),
        "nodeAgent.env[0].name=KUBERNETES_SERVICE_HOST".to_string(),
        "nodeAgent.env[0].value=127.0.0.1".to_string(),
        "nodeAgent.env[1].name=KUBERNETES_SERVICE_PORT".to_string(),
        format!("nodeAgent.env[1].value={port}"),
    ];
    let mut command = Command::new(helm());
    command
        .args(["template", "portalloc", "charts/kubectl-portalloc"])
        .args([
            "-n",
            "portalloc-system",
            "--show-only",
            "templates/node-agent.yaml",
        ])
        .args(["--set", "nodeAgent.enabled=true"])
        .current_dir(repo());
    for set in &sets {
        command.args(["--set-string", set]);
    }
    run_ok("helm template", &mut command)
}

fn get_json(kubeconfig: &Path, args: &[&str]) -> Value {
    let out = run_ok(
        "kubectl get",
        kubectl(kubeconfig)
            .arg("get")
            .args(args)
            .args(["-o", "json"]),
    );
    serde_json::from_str(&out).unwrap()
}

/// Poll `check` every 250 ms until it gives a value, or fail after `within` with `why()`.
fn wait_for<T>(
    within: Duration,
    what: &str,
    why: impl Fn() -> String,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            started.elapsed() < within,
            "{what} within {within:?}\n{}",
            why()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The running agent pod's name and uid, once it is Ready.
fn ready_agent(kubeconfig: &Path) -> Option<(String, String)> {
    let pods = get_json(kubeconfig, &["pods", "-n", AGENT_NAMESPACE]);
    pods["items"].as_array()?.iter().find_map(|p| {
        let ready = p["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let deleting = p["metadata"]["deletionTimestamp"].is_string();
        (ready && !deleting).then(|| {
            let m = &p["metadata"];
            (
                m["name"].as_str().unwrap().to_string(),
                m["uid"].as_str().unwrap().to_string(),
            )
        })
    })
}

fn no_agent_pod(kubeconfig: &Path) -> bool {
    get_json(kubeconfig, &["pods", "-n", AGENT_NAMESPACE])["items"]
        .as_array()
        .is_some_and(|a| a.is_empty())
}

/// A hostNetwork busybox pod on the node binding `port` (a shell expression) with `nc -l`.
fn busybox_pod(name: &str, labels: &str, port: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: team
  labels: {{{labels}}}
spec:
  nodeName: {NODE}
  hostNetwork: true
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo binding {port}; exec nc -l -p {port}"]
"#
    )
}

const HOLDER_LABELS: &str = "portalloc.dev/allocation: srv, portalloc.dev/role: web";

/// The agent's `PortBindRefused` Event about pod `team/pod`, once there is one.
fn refusal_event(kubeconfig: &Path, pod: &str) -> Option<Value> {
    let events = get_json(kubeconfig, &["events.events.k8s.io", "-n", "team"]);
    events["items"]
        .as_array()?
        .iter()
        .find(|e| e["regarding"]["name"] == pod && e["reason"] == "PortBindRefused")
        .cloned()
}

/// The port the webhook gave pod `name` (`portalloc.dev/ports: http=PORT`).
fn given_port(kubeconfig: &Path, name: &str) -> u16 {
    let pod = get_json(kubeconfig, &["pod", "-n", "team", name]);
    let ports = pod["metadata"]["annotations"]["portalloc.dev/ports"]
        .as_str()
        .unwrap_or_else(|| panic!("pod {name} has no portalloc.dev/ports annotation: {pod}"));
    ports.strip_prefix("http=").unwrap().parse().unwrap()
}

/// The pod webhook (`sync --watch --webhook-address`) on a loopback port, registered by URL.
struct WebhookProcess(Child);

impl WebhookProcess {
    fn start(kubeconfig: &Path, log: &Path) -> WebhookProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("https://127.0.0.1:{port}");
        let child = Command::new(DEBUG_BIN)
            .args(["sync", "--watch", "-n", "quiet"])
            .args(["--webhook-address", &format!("127.0.0.1:{port}")])
            .args([
                "--webhook-namespace",
                "portalloc-system",
                "--webhook-url",
                &url,
            ])
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let webhook = WebhookProcess(child);
        let why = || std::fs::read_to_string(log).unwrap_or_default();
        wait_for(
            Duration::from_secs(60),
            "the pod webhook registered",
            why,
            || {
                let out = kubectl(kubeconfig)
                    .args([
                        "get",
                        "mutatingwebhookconfiguration",
                        "portalloc",
                        "-o",
                        "json",
                    ])
                    .output()
                    .ok()?;
                let config: Value = serde_json::from_slice(&out.stdout).ok()?;
                let hook = &config["webhooks"][0]["clientConfig"];
                (hook["url"] == format!("{url}/mutate") && hook["caBundle"].is_string())
                    .then_some(())
            },
        );
        webhook
    }
}

impl Drop for WebhookProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn portalloc(kubeconfig: &Path, args: &[&str]) -> String {
    run_ok(
        "kubectl-portalloc",
        Command::new(DEBUG_BIN)
            .args(args)
            .env("KUBECONFIG", kubeconfig),
    )
}

/// A pod's container is running and has bound its port, without a refusal in its log.
fn bound(node: &KubeletNode, pod: &str, port: u16) -> Option<()> {
    let log = node.container_log("team", pod);
    (log.contains(&format!("binding {port}")) && node.listening(port)).then_some(())
}

#[test]
#[ignore = "needs root, containerd, runc, busybox-static, umoci, skopeo and the static release binary: .ci/run runs it"]
fn a_real_kubelet_runs_the_agent_whose_guard_refuses_intruders_but_never_holders() {
    let test = "real node";
    if unsafe { libc::geteuid() } != 0 {
        unable(test, "kubelet, containerd and cgroup BPF need root");
    }
    super::require_tools(test, false);
    let Some(binary) = super::release_binary() else {
        unable(
            test,
            "PORTALLOC_RELEASE_BINARY is not set: the image needs the static binary (scripts/build-image.sh --build-only)",
        );
    };
    let work = tempfile::tempdir().unwrap();
    let image = build_image(&binary, work.path(), &[], None);
    let tag = format!("v{VERSION}");
    let agent_archive = work.path().join("agent.tar");
    docker_archive(
        &format!("oci-archive:{}:{tag}", image.archive.display()),
        &agent_archive,
        &format!("{AGENT_IMAGE}:{tag}"),
    );
    let mut archives = busybox_archives(work.path());
    archives.push(agent_archive);

    let plane = ControlPlane::up_with(
        "real-node",
        &["--enable-admission-plugins", "ServiceAccount"],
    )
    .unwrap();
    let kubeconfig = plane.kubeconfig.clone();
    install_crds(&kubeconfig).unwrap();
    let ca = kubeconfig.parent().unwrap().join("pki/ca.crt");
    let options = ControllersOptions {
        controllers: [
            "daemonset-controller",
            "root-ca-certificate-publisher-controller",
            "serviceaccount-controller",
        ]
        .map(String::from)
        .to_vec(),
        controller_manager_args: vec![format!("--root-ca-file={}", ca.display())],
        ..ControllersOptions::default()
    };
    let _controllers = Controllers::start_with(&kubeconfig, &options).unwrap();
    let node = KubeletNode::start(&kubeconfig, NODE, &archives);
    let why = || node_failure(&node, "");
    wait_for(
        Duration::from_secs(60),
        "kubelet registered its Node",
        why,
        || {
            kubectl(&kubeconfig)
                .args(["get", "node", NODE])
                .output()
                .ok()?
                .status
                .success()
                .then_some(())
        },
    );

    for ns in ["portalloc-system", "team", "quiet"] {
        run_ok(
            "kubectl create namespace",
            kubectl(&kubeconfig).args(["create", "namespace", ns]),
        );
    }
    let agent = render_agent(&node, &kubeconfig, &tag);
    kubectl_stdin(&kubeconfig, &["apply", "-f", "-"], &agent);
    let (first_agent, _) = wait_for(
        Duration::from_secs(120),
        "the agent's DaemonSet pod Ready on the node",
        why,
        || ready_agent(&kubeconfig),
    );

    portalloc(
        &kubeconfig,
        &[
            "pool", "create", "guarded", "--range", POOL_RANGE, "--guard", "Enforce",
        ],
    );
    let allocation = "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: srv\n  namespace: team\nspec:\n  pool: guarded\n  roles:\n  - name: web\n    replicas: 2\n    ports: [{name: http, scope: PodScoped, env: HTTP_PORT}]\n";
    let file = work.path().join("srv.yaml");
    std::fs::write(&file, allocation).unwrap();
    portalloc(&kubeconfig, &["create", "-f", file.to_str().unwrap()]);
    let _webhook = WebhookProcess::start(&kubeconfig, &work.path().join("webhook.log"));

    // The holder binds its port, in the cgroup kubelet made for it.
    kubectl_stdin(
        &kubeconfig,
        &["apply", "-f", "-"],
        &busybox_pod("srv-web-0", HOLDER_LABELS, "$HTTP_PORT"),
    );
    let port = given_port(&kubeconfig, "srv-web-0");
    wait_for(
        Duration::from_secs(60),
        "the holder srv-web-0 listening on its port",
        why,
        || bound(&node, "srv-web-0", port),
    );
    let other = if port == 45109 { 45108 } else { port + 1 };

    // An intruder on a pool port it does not hold: EPERM, and an Event saying why.
    kubectl_stdin(
        &kubeconfig,
        &["apply", "-f", "-"],
        &busybox_pod("intruder", "", &other.to_string()),
    );
    wait_for(
        Duration::from_secs(60),
        "the intruder refused with EPERM",
        why,
        || {
            node.container_log("team", "intruder")
                .contains("Operation not permitted")
                .then_some(())
        },
    );
    assert!(!node.listening(other), "the intruder bound {other}");
    let refused = wait_for(
        Duration::from_secs(30),
        "a PortBindRefused Event about the intruder",
        why,
        || refusal_event(&kubeconfig, "intruder"),
    );
    assert!(
        refused["note"]
            .as_str()
            .unwrap()
            .contains(&format!("bind of port {other}/TCP was refused with EPERM")),
        "{refused}"
    );
    run_ok(
        "kubectl delete",
        kubectl(&kubeconfig).args(["delete", "pod", "-n", "team", "intruder", "--wait=true"]),
    );

    // The agent away (its DaemonSet kept off the node), the holder replaced as a StatefulSet
    // replaces a pod: the new pod, in a new cgroup, binds its port all the same.
    run_ok(
        "kubectl patch",
        kubectl(&kubeconfig).args([
            "patch",
            "daemonset",
            "-n",
            AGENT_NAMESPACE,
            "portalloc-node-agent",
            "-p",
            r#"{"spec":{"template":{"spec":{"nodeSelector":{"portalloc.test/nowhere":"x"}}}}}"#,
        ]),
    );
    wait_for(Duration::from_secs(60), "the agent's pod gone", why, || {
        no_agent_pod(&kubeconfig).then_some(())
    });
    run_ok(
        "kubectl delete",
        kubectl(&kubeconfig).args(["delete", "pod", "-n", "team", "srv-web-0", "--wait=true"]),
    );
    kubectl_stdin(
        &kubeconfig,
        &["apply", "-f", "-"],
        &busybox_pod("srv-web-0", HOLDER_LABELS, "$HTTP_PORT"),
    );
    assert_eq!(
        given_port(&kubeconfig, "srv-web-0"),
        port,
        "the replacement got another port"
    );
    wait_for(
        Duration::from_secs(120),
        "the replacement srv-web-0 listening on its port with the agent away",
        why,
        || bound(&node, "srv-web-0", port),
    );

    // The agent back on the node: it takes the guard over.
    run_ok(
        "kubectl patch",
        kubectl(&kubeconfig).args([
            "patch",
            "daemonset",
            "-n",
            AGENT_NAMESPACE,
            "portalloc-node-agent",
            "--type",
            "json",
            "-p",
            r#"[{"op":"remove","path":"/spec/template/spec/nodeSelector"}]"#,
        ]),
    );
    let (returned_agent, _) = wait_for(
        Duration::from_secs(120),
        "the agent back on the node and Ready",
        why,
        || ready_agent(&kubeconfig).filter(|(name, _)| *name != first_agent),
    );

    // Upgraded (a new image tag, the same binary): a rollout of the chart's DaemonSet. The new
    // agent takes over the guard: an intruder is refused again, the holder keeps its port.
    let next = format!("{tag}-next");
    node.ctr(&[
        "images",
        "tag",
        &format!("{AGENT_IMAGE}:{tag}"),
        &format!("{AGENT_IMAGE}:{next}"),
    ]);
    kubectl_stdin(
        &kubeconfig,
        &["apply", "-f", "-"],
        &render_agent(&node, &kubeconfig, &next),
    );
    let (second_agent, _) = wait_for(
        Duration::from_secs(120),
        "the upgraded agent Ready",
        why,
        || ready_agent(&kubeconfig).filter(|(name, _)| *name != returned_agent),
    );
    let pod = get_json(&kubeconfig, &["pod", "-n", AGENT_NAMESPACE, &second_agent]);
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        format!("{AGENT_IMAGE}:{next}")
    );
    kubectl_stdin(
        &kubeconfig,
        &["apply", "-f", "-"],
        &busybox_pod("intruder-2", "", &other.to_string()),
    );
    wait_for(
        Duration::from_secs(60),
        "the second intruder refused with EPERM",
        why,
        || {
            node.container_log("team", "intruder-2")
                .contains("Operation not permitted")
                .then_some(())
        },
    );
    assert!(
        node.listening(port),
        "the holder lost its port through the agent's upgrade"
    );
    let reserved = node
        .netns
        .sh("cat /proc/sys/net/ipv4/ip_local_reserved_ports");
    assert!(
        reserved.contains(POOL_RANGE),
        "the node's reserved ports: {reserved}"
    );
}

//! The chart's node agent (`nodeAgent.enabled`), as `helm template` renders it.

use serde_json::Value;

use portalloc::ledger::node_report::NODE_AGENT_NAMESPACE as AGENT_NAMESPACE;

use super::{NAMESPACE, get, strings, template};

/// The node agent: nothing of it by default; on, a DaemonSet with exactly what docs/node-agent.md
/// says it needs on a node, and the rights it uses.
#[test]
fn the_node_agent_only_when_enabled_with_what_it_needs_on_the_node() {
    let defaults = template(&[]);
    assert!(!defaults.iter().any(|o| o["kind"] == "DaemonSet"));
    assert!(
        !defaults
            .iter()
            .any(|o| o["metadata"]["name"] == "portalloc-node-agent")
    );

    let objects = template(&["nodeAgent.enabled=true", "createNamespace=true"]);
    let daemonset = get(&objects, "DaemonSet", "portalloc-node-agent");
    let spec = &daemonset["spec"];
    assert_eq!(spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 1);
    assert_eq!(
        spec["template"]["metadata"]["labels"],
        spec["selector"]["matchLabels"]
    );
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 0);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(
        pod["tolerations"],
        serde_json::json!([{"operator": "Exists"}])
    );
    assert_eq!(pod["serviceAccountName"], "portalloc-node-agent");
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert!(security["privileged"].is_null(), "{security}");
    assert_eq!(
        strings(&security["capabilities"]["add"]),
        ["BPF", "NET_ADMIN"],
        "no SYS_ADMIN: the guard is taken over by its pins"
    );
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(
        container["image"],
        get(&objects, "Deployment", "portalloc-watcher")["spec"]["template"]["spec"]["containers"]
            [0]["image"]
    );
    let args = strings(&container["args"]);
    assert_eq!(args[0], "node-agent");
    let flag = |name: &str| {
        let at = args.iter().position(|a| a == name);
        at.map(|at| args[at + 1].clone())
    };
    assert_eq!(flag("--metrics-address").as_deref(), Some("0.0.0.0:9464"));
    assert_eq!(flag("--cgroup-driver"), None, "auto: the agent finds it");
    let reserved = flag("--reserved-ports-file").expect("--reserved-ports-file");
    let env: Vec<(String, String)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let path = e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap();
            (e["name"].as_str().unwrap().to_string(), path.to_string())
        })
        .collect();
    assert!(
        env.contains(&("NODE_NAME".into(), "spec.nodeName".into())),
        "{env:?}"
    );
    assert!(
        env.contains(&("POD_NAMESPACE".into(), "metadata.namespace".into())),
        "{env:?}"
    );
    assert!(
        env.contains(&("POD_NAME".into(), "metadata.name".into())),
        "{env:?}"
    );
    // Each host path, mounted as the agent is told to find it.
    let volumes = pod["volumes"].as_array().unwrap();
    let mounts = container["volumeMounts"].as_array().unwrap();
    let mount_of = |host: &str| -> (&Value, &Value) {
        let volume = volumes
            .iter()
            .find(|v| v["hostPath"]["path"] == host)
            .unwrap_or_else(|| panic!("no hostPath {host}"));
        let mount = mounts
            .iter()
            .find(|m| m["name"] == volume["name"])
            .unwrap_or_else(|| panic!("{host} not mounted"));
        (volume, mount)
    };
    let (cgroup, cgroup_mount) = mount_of("/sys/fs/cgroup");
    assert_eq!(cgroup_mount["readOnly"], true);
    assert_eq!(
        Some(cgroup_mount["mountPath"].as_str().unwrap()),
        flag("--cgroup-root").as_deref()
    );
    assert_eq!(cgroup["hostPath"]["type"], "Directory");
    let (state, state_mount) = mount_of("/run/kubectl-portalloc");
    assert_eq!(state["hostPath"]["type"], "DirectoryOrCreate");
    assert!(state_mount["readOnly"].is_null());
    assert_eq!(
        Some(state_mount["mountPath"].as_str().unwrap()),
        flag("--state-dir").as_deref()
    );
    let (file, file_mount) = mount_of("/proc/sys/net/ipv4/ip_local_reserved_ports");
    assert_eq!(file["hostPath"]["type"], "File");
    assert!(file_mount["readOnly"].is_null());
    assert_eq!(file_mount["mountPath"], reserved);
    let (bpffs, bpffs_mount) = mount_of("/sys/fs/bpf");
    assert_eq!(bpffs["hostPath"]["type"], "Directory");
    assert_eq!(bpffs_mount["mountPropagation"], "HostToContainer");
    let bpf_dir = flag("--bpf-dir").expect("--bpf-dir");
    assert!(
        bpf_dir.starts_with(&format!("{}/", bpffs_mount["mountPath"].as_str().unwrap())),
        "{bpf_dir} is on the mounted bpffs"
    );
    // Its pods are admitted only at Pod Security's privileged level, in a namespace of their
    // own: the release's namespace, the watcher's and webhook's, stays restricted.
    let own = get(&objects, "Namespace", AGENT_NAMESPACE);
    assert_eq!(
        own["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    assert_eq!(daemonset["metadata"]["namespace"], AGENT_NAMESPACE);
    let enforced = |objects: &[Value], name: &str| {
        get(objects, "Namespace", name)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
            .clone()
    };
    assert_eq!(enforced(&objects, NAMESPACE), "restricted");
    assert_eq!(
        enforced(&template(&["createNamespace=true"]), NAMESPACE),
        "restricted"
    );
    let existing = template(&["nodeAgent.enabled=true", "nodeAgent.createNamespace=false"]);
    assert!(
        !existing.iter().any(|o| o["kind"] == "Namespace"),
        "a namespace that exists is not rendered"
    );
    // Set to the release's namespace: that one is privileged, as it must be for the agent.
    let shared = template(&[
        "nodeAgent.enabled=true",
        "nodeAgent.namespace=",
        "createNamespace=true",
    ]);
    assert_eq!(enforced(&shared, NAMESPACE), "privileged");
    assert_eq!(
        get(&shared, "DaemonSet", "portalloc-node-agent")["metadata"]["namespace"],
        NAMESPACE
    );
    assert_eq!(
        shared.iter().filter(|o| o["kind"] == "Namespace").count(),
        1
    );

    // Its rights: read pools, shards, PortAllocations by name and pods; Events; its Lease and
    // its DaemonSet in its own namespace only.
    let rules = |role: &Value| -> Vec<(String, String, Vec<String>)> {
        let mut all = Vec::new();
        for rule in role["rules"].as_array().unwrap() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    all.push((group.clone(), resource, strings(&rule["verbs"])));
                }
            }
        }
        all
    };
    let verbs = |list: &[&str]| list.iter().map(|v| v.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules(get(&objects, "ClusterRole", "portalloc-node-agent")),
        [
            ("".into(), "pods".into(), verbs(&["get", "list", "watch"])),
            (
                "portalloc.dev".into(),
                "portpools".into(),
                verbs(&["get", "list", "watch"])
            ),
            (
                "portalloc.dev".into(),
                "portallocations".into(),
                verbs(&["get"])
            ),
            (
                "portalloc.dev".into(),
                "portpoolshards".into(),
                verbs(&["get", "list"])
            ),
            ("".into(), "events".into(), verbs(&["create", "patch"])),
            (
                "events.k8s.io".into(),
                "events".into(),
                verbs(&["create", "patch"])
            ),
        ]
    );
    let role = get(&objects, "Role", "portalloc-node-agent");
    assert_eq!(role["metadata"]["namespace"], AGENT_NAMESPACE);
    assert_eq!(
        rules(role),
        [
            (
                "coordination.k8s.io".into(),
                "leases".into(),
                verbs(&["get", "create", "update"])
            ),
            // Its own DaemonSet, to tell an uninstall from a rollout on SIGTERM.
            ("apps".into(), "daemonsets".into(), verbs(&["get"])),
        ]
    );
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        let binding = get(&objects, kind, "portalloc-node-agent");
        assert_eq!(binding["subjects"][0]["name"], "portalloc-node-agent");
        assert_eq!(binding["subjects"][0]["namespace"], AGENT_NAMESPACE);
    }
    // Its Lease only, and Events as its node (tests/e2e/node_agent_lease.rs runs both
    // policies): each matches the release's agent and denies.
    for name in ["portalloc-node-agent-lease", "portalloc-node-agent-events"] {
        let policy = get(&objects, "ValidatingAdmissionPolicy", name);
        assert_eq!(
            policy["spec"]["matchConditions"][0]["expression"],
            format!(
                "request.userInfo.username == 'system:serviceaccount:{AGENT_NAMESPACE}:portalloc-node-agent'"
            ),
            "{name}"
        );
        let binding = get(&objects, "ValidatingAdmissionPolicyBinding", name);
        assert_eq!(binding["spec"]["policyName"], name);
        assert_eq!(strings(&binding["spec"]["validationActions"]), ["Deny"]);
        assert!(!defaults.iter().any(|o| o["metadata"]["name"] == name));
    }

    // Values reach it.
    let objects = template(&[
        "nodeAgent.enabled=true",
        "nodeAgent.cgroupDriver=systemd",
        "nodeAgent.metricsPort=19464",
        "nodeAgent.nodeSelector.pool=gpu",
        "nodeAgent.priorityClassName=",
        "image.tag=dev",
    ]);
    let pod = &get(&objects, "DaemonSet", "portalloc-node-agent")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = strings(&container["args"]);
    let at = args.iter().position(|a| a == "--cgroup-driver").unwrap();
    assert_eq!(args[at + 1], "systemd");
    assert!(args.contains(&"0.0.0.0:19464".to_string()), "{args:?}");
    assert_eq!(container["ports"][0]["containerPort"], 19464);
    assert_eq!(
        container["image"],
        "ghcr.io/portalloc/kubectl-portalloc:dev"
    );
    assert_eq!(pod["nodeSelector"]["pool"], "gpu");
    assert!(pod["priorityClassName"].is_null());
}

/// `nodeAgent.hostBpfDir`: the node's bpffs elsewhere is what the agent's /sys/fs/bpf mounts.
#[test]
fn the_node_agent_pins_in_the_bpffs_the_values_name() {
    let objects = template(&["nodeAgent.enabled=true", "nodeAgent.hostBpfDir=/run/bpffs"]);
    let pod = &get(&objects, "DaemonSet", "portalloc-node-agent")["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "bpffs")
        .expect("the bpffs volume");
    assert_eq!(volume["hostPath"]["path"], "/run/bpffs");
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    let mount = mounts.iter().find(|m| m["name"] == "bpffs").unwrap();
    assert_eq!(mount["mountPath"], "/sys/fs/bpf");
}

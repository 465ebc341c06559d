//! The plugin as users meet it: every verb and output format, errors and exit codes, help,
//! completion, colour rules and pipes. The binary runs as a process against the real server.

mod habits;
mod help;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use portalloc::api::PortAllocation;

use crate::support::{self, cli};

const PD: &str = r#"apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata:
  name: pd
spec:
  pool: POOL
  roles:
  - name: router
    replicas: 2
    ports:
    - {name: http, scope: RoleScoped, env: ROUTER_PORT}
  - name: prefill
    replicas: 2
    ports:
    - {name: bootstrap, scope: PodScoped, env: BOOTSTRAP_PORT}
  - name: decode
    replicas: 3
    ports:
    - {name: http, scope: PodScoped, env: DECODE_PORT}
    references:
    - {env: ROUTER_PORT, from: router.http}
    - {env: PREFILL_BOOTSTRAP_PORTS, from: "prefill.bootstrap[*]"}
    - {env: FIRST_BOOTSTRAP, from: "prefill.bootstrap[1]"}
"#;

/// A namespace with a pool and the PD allocation in it.
async fn setup(test: &str, range: &str) -> (kube::Client, String, String, PortAllocation) {
    let client = support::client().await;
    let ns = support::namespace(&client, test).await;
    let pool = support::unique_name(test);
    support::create_pool(&pool, range);
    let run = cli::run_stdin(
        &["create", "-f", "-", "-n", &ns],
        &PD.replace("POOL", &pool),
    );
    assert!(run.ok(), "{run}");
    let pa = Api::<PortAllocation>::namespaced(client.clone(), &ns)
        .get("pd")
        .await
        .unwrap();
    (client, ns, pool, pa)
}

fn value(pa: &PortAllocation, role: &str, port: &str, index: usize) -> String {
    pa.allocated_values(role, port)[index].to_string()
}

#[tokio::test]
async fn get_in_every_format() {
    let (_, ns, pool, pa) = setup("get-formats", "34000-34099").await;
    let table = cli::run(&["get", "-n", &ns]);
    assert!(table.ok(), "{table}");
    let lines: Vec<&str> = table.stdout.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        vec!["NAME", "POOL", "ROLES", "PORTS", "PHASE", "AGE"]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        &row[..5],
        &[
            "pd",
            pool.as_str(),
            "router:2,prefill:2,decode:3",
            "6/6",
            "Allocated"
        ]
    );

    let wide = cli::run(&["get", "-n", &ns, "-o", "wide"]);
    assert!(
        wide.stdout
            .contains(&format!("router.http={}", value(&pa, "router", "http", 0))),
        "{wide}"
    );

    let all = cli::run(&["get", "-A"]);
    assert!(
        all.stdout.lines().next().unwrap().starts_with("NAMESPACE"),
        "{all}"
    );
    assert!(all.stdout.contains(&ns));

    let json = cli::run(&["get", "pd", "-n", &ns, "-o", "json"]);
    let object: PortAllocation = serde_json::from_str(&json.stdout).expect("one object as JSON");
    assert_eq!(object.status, pa.status);
    let list: serde_json::Value =
        serde_json::from_str(&cli::run(&["get", "-n", &ns, "-o", "json"]).stdout).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let yaml = cli::run(&["get", "pd", "-n", &ns, "-o", "yaml"]);
    let object: PortAllocation = serde_yaml::from_str(&yaml.stdout).expect("one object as YAML");
    assert_eq!(object.spec, pa.spec);
    assert_eq!(
        cli::run(&["get", "-n", &ns, "-o", "name"]).stdout,
        "portallocation.portalloc.dev/pd\n"
    );

    let pools = cli::run(&["pool", "get", &pool]);
    let header: Vec<&str> = pools
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        vec![
            "NAME",
            "PROTOCOL",
            "RANGES",
            "SIZE",
            "ALLOCATED",
            "FREE",
            "HOLDERS",
            "AGE"
        ]
    );
    let row: Vec<&str> = pools
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..7],
        &[pool.as_str(), "TCP", "34000-34099", "100", "6", "94", "1"]
    );
    assert_eq!(
        cli::run(&["pool", "get", &pool, "-o", "name"]).stdout,
        format!("portpool.portalloc.dev/{pool}\n")
    );
    let pool_json: serde_json::Value =
        serde_json::from_str(&cli::run(&["pool", "get", &pool, "-o", "json"]).stdout).unwrap();
    // The object as stored: its usage lives in its shards (the table above sums them).
    assert_eq!(pool_json["status"]["size"], 100);
}

#[tokio::test]
async fn describe_shows_every_pod_port_env_and_reference() {
    let (_, ns, _, pa) = setup("describe", "34100-34199").await;
    let run = cli::run(&["describe", "pd", "-n", &ns]);
    assert!(run.ok(), "{run}");
    let out = &run.stdout;
    for needle in [
        "Phase:        Allocated".to_string(),
        "Ports:        6/6".to_string(),
        "decode (3 replicas)".to_string(),
        format!("2      http             PodScoped   {:<7} DECODE_PORT", value(&pa, "decode", "http", 2)),
        format!("all    http             RoleScoped  {:<7} ROUTER_PORT", value(&pa, "router", "http", 0)),
        format!(
            "PREFILL_BOOTSTRAP_PORTS = {},{}  (from prefill.bootstrap[*])",
            value(&pa, "prefill", "bootstrap", 0),
            value(&pa, "prefill", "bootstrap", 1)
        ),
        format!("FIRST_BOOTSTRAP = {}  (from prefill.bootstrap[1])", value(&pa, "prefill", "bootstrap", 1)),
        "Allocated=True  reason Allocated".to_string(),
        "role router has RoleScoped ports shared by all its pods: on hostNetwork give the role pod anti-affinity".to_string(),
    ] {
        assert!(out.contains(&needle), "{needle:?} missing from:\n{out}");
    }
    assert!(
        !out.contains('\x1b'),
        "no colour when stdout is not a terminal"
    );
}

#[tokio::test]
async fn pool_describe_shows_bands_usage_holders_and_hazards() {
    let (client, ns, pool, _) = setup("pool-describe", "30600-30699").await;
    // A NodePort Service that sits on a pool port.
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"port": 80, "nodePort": 30650}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    // A LoadBalancer Service has node ports too; a ClusterIP Service has none.
    for (name, kind, node_port) in [
        ("lb", "LoadBalancer", Some(30660)),
        ("internal", "ClusterIP", None),
    ] {
        let mut port = serde_json::json!({"port": 80});
        if let Some(node_port) = node_port {
            port["nodePort"] = node_port.into();
        }
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"type": kind, "selector": {"app": name}, "ports": [port]}
        }))
        .unwrap();
        Api::<Service>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &service)
            .await
            .unwrap();
    }
    let run = cli::run(&["pool", "describe", &pool, "-v", "2"]);
    assert!(run.ok(), "{run}");
    // The server leaves out the Services that cannot hold node ports, a page at a time.
    let services = request_lines(&run.stderr, "GET /api/v1/services?");
    assert_eq!(services.len(), 1, "{run}");
    assert!(
        services[0]
            .contains("fieldSelector=spec.type%21%3DClusterIP%2Cspec.type%21%3DExternalName")
            && services[0].contains("limit=500")
            && services[0].contains(" 200 "),
        "{run}"
    );
    assert!(
        run.stdout
            .contains(&format!("port 30660 is a NodePort of Service {ns}/lb")),
        "{run}"
    );
    assert_eq!(run.stdout, cli::run(&["pool", "describe", &pool]).stdout);
    for needle in [
        "Size:         100 ports".to_string(),
        "static   30600-30615".to_string(),
        "dynamic  30616-30699".to_string(),
        format!("{ns}/pd  (6 ports"),
        "overlap the default NodePort range 30000-32767".to_string(),
        format!("port 30650 is a NodePort of Service {ns}/web"),
    ] {
        assert!(
            run.stdout.contains(&needle),
            "{needle:?} missing from:\n{}",
            run.stdout
        );
    }
}

/// The `-v 2` lines for requests whose method and path start with `prefix`, each checked to end
/// in an HTTP status and a duration (`GET /path 200 4.1ms`).
fn request_lines<'a>(stderr: &'a str, prefix: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(prefix)).collect();
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [.., status, took] = words.as_slice() else {
            panic!("{line:?}")
        };
        let number = ["ns", "µs", "ms", "s"]
            .iter()
            .find_map(|unit| took.strip_suffix(unit));
        assert!(
            status.len() == 3
                && status.parse::<u16>().is_ok()
                && number.is_some_and(|n| n.parse::<f64>().is_ok()),
            "no status and duration in {line:?}"
        );
    }
    lines
}

#[tokio::test]
async fn v2_logs_each_request_and_v0_none() {
    let (_, ns, _, _) = setup("request-log", "34600-34699").await;
    let list = format!("GET /apis/portalloc.dev/v1alpha1/namespaces/{ns}/portallocations");
    let run = cli::run(&["-v", "2", "get", "-n", &ns]);
    assert!(run.ok(), "{run}");
    let lines = request_lines(&run.stderr, &list);
    assert_eq!(lines.len(), 1, "{run}");
    assert!(lines[0].contains(" 200 "), "{run}");
    // A 404 is a line like any other, and the path carries its query.
    let run = cli::run(&["get", "nothing", "-n", &ns, "--v=2"]);
    assert_eq!(run.code, 3, "{run}");
    assert_eq!(
        request_lines(&run.stderr, &format!("{list}/nothing 404 ")).len(),
        1,
        "{run}"
    );
    for quiet in ["0", "1"] {
        let run = cli::run(&["get", "-n", &ns, "-v", quiet]);
        assert!(run.ok(), "{run}");
        assert!(!run.stderr.contains("GET /"), "-v {quiet}: {run}");
    }
    assert_eq!(
        cli::run(&["get", "-n", &ns]).stderr,
        "",
        "no log lines by default"
    );
}

#[tokio::test]
async fn closed_sets_list_what_they_accept_and_durations_read_as_kubectl() {
    let (_, ns, pool, _) = setup("closed-sets", "34700-34799").await;
    let refused = [
        (
            vec![
                "pool",
                "create",
                "x",
                "--range",
                "1-2",
                "--protocol",
                "HTTP",
            ],
            "[possible values: TCP, UDP, SCTP]",
        ),
        (
            vec![
                "pool",
                "create",
                "x",
                "--range",
                "1-2",
                "--static-band",
                "some",
            ],
            "[possible values: Auto, None, COUNT]",
        ),
        (
            vec!["resolve", "pd", "--all", "-o", "ini"],
            "[possible values: env, export, json, yaml, configmap]",
        ),
        (
            vec!["version", "-o", "yaml"],
            "[possible values: text, json]",
        ),
        (
            vec!["completion", "powershell"],
            "[possible values: bash, zsh, fish, kubectl-plugin]",
        ),
        (
            vec!["get", "--request-timeout", "1x"],
            "write e.g. 30s, 1m30s, 1.5s, 300ms",
        ),
    ];
    for (args, values) in refused {
        let run = cli::run(&args);
        assert_eq!(run.code, 2, "{args:?}: {run}");
        assert!(run.stderr.contains(values), "{args:?}: {run}");
    }
    for timeout in ["1m30s", "1.5s", "300ms", "1h2m", "0", "30"] {
        let run = cli::run(&["get", "pd", "-n", &ns, "--request-timeout", timeout]);
        assert!(run.ok(), "--request-timeout {timeout}: {run}");
    }
    // What is accepted is what the pool records.
    let udp = format!("{pool}-udp");
    let run = cli::run(&[
        "pool",
        "create",
        &udp,
        "--range",
        "34800-34899",
        "--protocol",
        "UDP",
        "--static-band",
        "8",
    ]);
    assert!(run.ok(), "{run}");
    let json: serde_json::Value =
        serde_json::from_str(&cli::run(&["pool", "get", &udp, "-o", "json"]).stdout).unwrap();
    assert_eq!(
        (&json["spec"]["protocol"], &json["spec"]["staticBand"]),
        (&"UDP".into(), &8.into())
    );
    let run = cli::run(&["pool", "delete", &udp]);
    assert!(run.ok(), "{run}");
}

#[tokio::test]
async fn resolve_in_every_format_and_its_errors() {
    let (_, ns, _, pa) = setup("resolve", "34200-34299").await;
    let expected = format!(
        "DECODE_PORT={}\nROUTER_PORT={}\nPREFILL_BOOTSTRAP_PORTS={},{}\nFIRST_BOOTSTRAP={}\n",
        value(&pa, "decode", "http", 1),
        value(&pa, "router", "http", 0),
        value(&pa, "prefill", "bootstrap", 0),
        value(&pa, "prefill", "bootstrap", 1),
        value(&pa, "prefill", "bootstrap", 1),
    );
    let by_index = cli::run(&[
        "resolve", "pd", "--role", "decode", "--index", "1", "-n", &ns,
    ]);
    assert_eq!(by_index.stdout, expected, "{by_index}");
    let by_pod = cli::run(&[
        "resolve",
        "pd",
        "--role",
        "decode",
        "--pod",
        "pd-decode-1",
        "-n",
        &ns,
    ]);
    assert_eq!(by_pod.stdout, expected);
    let export = cli::run(&[
        "resolve", "pd", "--role", "decode", "--index", "1", "-n", &ns, "-o", "export",
    ]);
    assert!(
        export.stdout.lines().all(|l| l.starts_with("export "))
            && export.stdout.contains("export DECODE_PORT=")
    );
    let json: serde_json::Value = serde_json::from_str(
        &cli::run(&[
            "resolve", "pd", "--role", "decode", "--index", "1", "-n", &ns, "-o", "json",
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(json["DECODE_PORT"], value(&pa, "decode", "http", 1));
    let yaml: std::collections::BTreeMap<String, String> = serde_yaml::from_str(
        &cli::run(&[
            "resolve", "pd", "--role", "decode", "--index", "1", "-n", &ns, "-o", "yaml",
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(yaml.len(), 4);

    let configmap = cli::run(&["resolve", "pd", "--all", "-o", "configmap", "-n", &ns]);
    let object: k8s_openapi::api::core::v1::ConfigMap =
        serde_yaml::from_str(&configmap.stdout).unwrap();
    assert_eq!(object.data.unwrap()["decode-1.env"], expected);

    // Errors: each names the problem, with a stable exit code.
    let cases: [(&[&str], i32, &str); 6] = [
        (
            &["resolve", "pd", "--role", "decode", "--index", "3"],
            7,
            "pod index 3 is out of range: role \"decode\"",
        ),
        (
            &["resolve", "pd", "--role", "nobody", "--index", "0"],
            7,
            "has no role \"nobody\" (roles: router, prefill, decode)",
        ),
        (
            &["resolve", "pd", "--role", "decode", "--pod", "decode"],
            7,
            "does not end in -<index>",
        ),
        (
            &["resolve", "pd", "--role", "decode"],
            2,
            "--index I or --pod NAME",
        ),
        (
            &["resolve", "missing", "--role", "decode", "--index", "0"],
            3,
            "PortAllocation \"missing\" not found",
        ),
        (
            &[
                "resolve",
                "pd",
                "--role",
                "decode",
                "--index",
                "0",
                "-o",
                "configmap",
            ],
            2,
            "-o configmap needs --all",
        ),
    ];
    for (args, code, message) in cases {
        let mut args = args.to_vec();
        args.extend(["-n", &ns]);
        let run = cli::run(&args);
        assert_eq!(run.code, code, "{args:?}: {run}");
        assert!(run.stderr.contains(message), "{args:?}: {run}");
        assert_eq!(run.stderr.lines().count(), 1, "errors are one line: {run}");
    }

    // Not allocated yet: say to run sync.
    let run = cli::run(&["release", "pd", "--role", "prefill", "-n", &ns]);
    assert!(run.ok(), "{run}");
    let run = cli::run(&[
        "resolve", "pd", "--role", "decode", "--index", "0", "-n", &ns,
    ]);
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr
            .contains("is not allocated yet: run `kubectl portalloc sync pd -n"),
        "{run}"
    );
}

#[tokio::test]
async fn import_turns_rbg_annotations_into_a_portallocation_that_allocates() {
    let client = support::client().await;
    let ns = support::namespace(&client, "import").await;
    let pool = support::unique_name("import");
    support::create_pool(&pool, "34300-34399");
    let annotation =
        |json: &str| format!("rolebasedgroup.workloads.x-k8s.io/port-allocator: '{json}'");
    let rbg = format!(
        "apiVersion: workloads.x-k8s.io/v1alpha1\nkind: RoleBasedGroup\nmetadata:\n  name: group\nspec:\n  roles:\n  \
         - name: leader\n    replicas: 1\n    template:\n      metadata:\n        annotations:\n          {}\n  \
         - name: worker\n    replicas: 2\n    template:\n      metadata:\n        annotations:\n          {}\n",
        annotation(
            r#"{"allocations":[{"name":"grpc","env":"LEADER_PORT","annotationKey":"x/p","scope":"PodScoped"}]}"#
        ),
        annotation(
            r#"{"allocations":[{"name":"rpc","env":"WORKER_PORT","scope":"PodScoped"},{"name":"shared","env":"SHARED","scope":"RoleScoped"}],"references":[{"env":"LEADER","from":"leader.grpc"}]}"#
        ),
    );
    let run = cli::run_stdin(&["import", "-f", "-", "--pool", &pool], &rbg);
    assert!(run.ok(), "{run}");
    assert!(
        run.stdout
            .contains("# note: leader.grpc: annotationKey \"x/p\""),
        "{run}"
    );
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &run.stdout);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("4 ports held"), "{run}");
    let resolved = cli::run(&[
        "resolve", "group", "--role", "worker", "--index", "1", "-n", &ns,
    ]);
    assert!(
        resolved.ok() && resolved.stdout.contains("LEADER="),
        "{resolved}"
    );

    let run = cli::run_stdin(
        &["import", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
    );
    assert_eq!(run.code, 7, "{run}");
}

#[tokio::test]
async fn errors_have_stable_exit_codes_and_say_what_to_do() {
    let client = support::client().await;
    let ns = support::namespace(&client, "errors").await;
    let cases: [(&[&str], i32, &str); 5] = [
        (
            &["get", "nothing"],
            3,
            "PortAllocation \"nothing\" not found in namespace",
        ),
        (
            &["pool", "describe", "no-such-pool-here"],
            3,
            "PortPool \"no-such-pool-here\" not found",
        ),
        (&["sync"], 2, "name a PortAllocation, or pass --all"),
        (
            &["pool", "create", "bad", "--range", "30010-30000"],
            7,
            "the first port must not exceed the last",
        ),
        (
            &["get", "--context", "no-such-context"],
            9,
            "no-such-context",
        ),
    ];
    for (args, code, message) in cases {
        let mut args = args.to_vec();
        args.extend(["-n", &ns]);
        let run = cli::run(&args);
        assert_eq!(run.code, code, "{args:?}: {run}");
        assert!(run.stderr.contains(message), "{args:?}: {run}");
    }
    let run = cli::run_with(std::path::Path::new("/nonexistent/kubeconfig"), &["get"]);
    assert_eq!(run.code, 9, "{run}");
    let run = cli::run(&["get", "-o", "xml"]);
    assert_eq!(run.code, 2, "{run}");
    assert!(
        run.stderr
            .contains("possible values: table, wide, json, yaml, name"),
        "{run}"
    );
}

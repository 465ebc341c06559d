//! Bad input, table-driven, through the binary against the real API server: every case exits
//! non-zero with its documented code, says in one line which object and field are wrong, and
//! leaves every object exactly as it was (UIDs and resourceVersions compared before and after).

use std::collections::BTreeMap;

use kube::api::Api;
use kube::{Client, ResourceExt};
use portalloc::api::{PortAllocation, PortPool, PortPoolShard};

use crate::support::cli::{self, Run};
use crate::support::private_cluster::PrivateCluster;
use crate::support::{self, USER_CONTEXT};

/// `<kind>/<namespace>/<name>` -> (uid, resourceVersion) of every object the cases could touch.
async fn snapshot(client: &Client, prefix: &str, ns: &str) -> BTreeMap<String, (String, String)> {
    let mut objects = BTreeMap::new();
    for pool in Api::<PortPool>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.name_any().starts_with(prefix))
    {
        objects.insert(
            format!("portpool/{}", pool.name_any()),
            (pool.uid().unwrap(), pool.resource_version().unwrap()),
        );
    }
    for shard in Api::<PortPoolShard>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.pool.starts_with(prefix))
    {
        objects.insert(
            format!("portpoolshard/{}", shard.name_any()),
            (shard.uid().unwrap(), shard.resource_version().unwrap()),
        );
    }
    for pa in Api::<PortAllocation>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|pa| pa.namespace().as_deref() == Some(ns) || pa.spec.pool.starts_with(prefix))
    {
        objects.insert(
            format!(
                "portallocation/{}/{}",
                pa.namespace().unwrap(),
                pa.name_any()
            ),
            (pa.uid().unwrap(), pa.resource_version().unwrap()),
        );
    }
    objects
}

struct Case {
    what: &'static str,
    args: Vec<String>,
    stdin: Option<String>,
    code: i32,
    /// Each must appear in the error line.
    needles: Vec<String>,
}

fn case(what: &'static str, args: &[&str], code: i32, needles: &[&str]) -> Case {
    Case {
        what,
        args: args.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        code,
        needles: needles.iter().map(|s| s.to_string()).collect(),
    }
}

/// `create -f -` with `manifest` on stdin.
fn manifest(what: &'static str, ns: &str, text: String, code: i32, needles: &[&str]) -> Case {
    Case {
        stdin: Some(text),
        ..case(what, &["create", "-f", "-", "-n", ns], code, needles)
    }
}

fn pool_doc(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata:\n  name: {name}\nspec:\n{spec}"
    )
}

fn pa_doc(name: &str, pool: &str, roles: &str) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: {name}\nspec:\n  pool: {pool}\n  roles:\n{roles}"
    )
}

/// One role `web` with `replicas` and the given port lines.
fn web(replicas: &str, ports: &str) -> String {
    format!("  - name: web\n    replicas: {replicas}\n    ports:\n{ports}")
}

const HTTP: &str = "    - {name: http, scope: PodScoped, env: HTTP_PORT}\n";

/// Roles `router` (RoleScoped http), `prefill` (2 replicas, PodScoped bootstrap) and `decode`
/// with one reference `from`.
fn with_reference(from: &str) -> String {
    format!(
        "  - name: router\n    replicas: 1\n    ports:\n    - {{name: http, scope: RoleScoped, env: ROUTER_PORT}}\n  - name: prefill\n    replicas: 2\n    ports:\n    - {{name: bootstrap, scope: PodScoped, env: BOOTSTRAP_PORT}}\n  - name: decode\n    replicas: 1\n    ports:\n{HTTP}    references:\n    - {{env: REF, from: \"{from}\"}}\n"
    )
}

fn check(case: &Case, run: &Run) -> Result<(), String> {
    if run.code != case.code {
        return Err(format!("expected exit {}, got {}", case.code, run.code));
    }
    // The manifest reader notes each document of another kind it skips, on a line of its own.
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| !l.contains(": skipping "))
        .collect();
    let line = match (case.code, lines.as_slice()) {
        // clap's usage errors: the first line names the problem, usage follows.
        (2, [first, ..]) => *first,
        (_, [only]) => *only,
        _ => return Err("the message must be exactly one line".into()),
    };
    if !line.starts_with("error: ") {
        return Err("the message must start with \"error: \"".into());
    }
    for needle in &case.needles {
        if !line.contains(needle.as_str()) {
            return Err(format!("{needle:?} not in the message"));
        }
    }
    Ok(())
}

#[tokio::test]
async fn bad_input_is_refused_clearly_and_changes_nothing() {
    let client = support::client().await;
    let ns = support::namespace(&client, "bad-input").await;
    let prefix = support::unique_name("bad");
    let pool = format!("{prefix}-pool");
    let other_pool = format!("{prefix}-other");
    let run = cli::run(&[
        "pool",
        "create",
        &pool,
        "--range",
        "35000-35049",
        "--exclude",
        "35040-35049",
        "--allow-overlap",
    ]);
    assert!(run.ok(), "{run}");
    let owner = pa_doc(
        "owner",
        &pool,
        "  - name: admin\n    replicas: 1\n    ports:\n    - {name: ctl, scope: RoleScoped, env: CTL_PORT, port: 35005}\n",
    );
    assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &owner).ok());
    let second = format!("{prefix}-second");
    let run = cli::run(&[
        "pool",
        "create",
        &second,
        "--range",
        "35050-35059",
        "--allow-overlap",
    ]);
    assert!(run.ok(), "{run}");

    let ns = ns.as_str();
    let p = pool.as_str();
    let x = |roles: &str| pa_doc("x", p, roles);
    let bad_pool = |spec: &str| pool_doc(&other_pool, spec);
    let ranges = |r: &str| format!("  ranges: [{r}]\n");
    let dir = tempfile::tempdir().unwrap();
    let garbled_kubeconfig = dir.path().join("garbled");
    std::fs::write(&garbled_kubeconfig, "apiVersion: v1\nclusters: [oops\n").unwrap();
    let missing = dir.path().join("missing");
    let (garbled, missing) = (
        garbled_kubeconfig.to_str().unwrap(),
        missing.to_str().unwrap(),
    );

    let missing_ns = format!("{prefix}-nowhere");
    let cases = vec![
        // YAML and manifest shape.
        manifest(
            "YAML syntax error",
            ns,
            "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata: {name: x\n".into(),
            7,
            &["<stdin>: document 1: not valid YAML"],
        ),
        manifest(
            "tab indentation",
            ns,
            "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata:\n\tname: x\n".into(),
            7,
            &["not valid YAML"],
        ),
        manifest(
            "empty input",
            ns,
            String::new(),
            7,
            &["no PortPool or PortAllocation found"],
        ),
        manifest(
            "unknown field (typo)",
            ns,
            x(&web("2", HTTP)).replace("replicas:", "replica:"),
            7,
            &[
                "PortAllocation \"x\"",
                "unknown field \"spec.roles.0.replica\"",
            ],
        ),
        manifest(
            "unknown field in a pool",
            ns,
            bad_pool(&format!("{}  protocoll: TCP\n", ranges("\"35100-35110\""))),
            7,
            &["PortPool", "unknown field \"spec.protocoll\""],
        ),
        manifest(
            "wrong kind in our group",
            ns,
            x(&web("1", HTTP)).replace("kind: PortAllocation", "kind: PortAllocations"),
            7,
            &[
                "kind \"PortAllocations\"",
                "expected kind PortPool or PortAllocation",
            ],
        ),
        manifest(
            "only other kinds",
            ns,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n".into(),
            7,
            &["no PortPool or PortAllocation found"],
        ),
        manifest(
            "wrong apiVersion",
            ns,
            x(&web("1", HTTP)).replace("portalloc.dev/v1alpha1", "portalloc.dev/v1"),
            7,
            &["apiVersion \"portalloc.dev/v1\""],
        ),
        manifest(
            "no metadata.name",
            ns,
            x(&web("1", HTTP)).replace("  name: x\n", ""),
            7,
            &["PortAllocation has no metadata.name"],
        ),
        manifest(
            "replicas of the wrong type",
            ns,
            x(&web("two", HTTP)),
            7,
            &["PortAllocation \"x\"", "replicas"],
        ),
        manifest(
            "second document invalid: the first is not applied",
            ns,
            format!(
                "{}---\n{}",
                pa_doc("first", p, &web("1", HTTP)),
                x(&web("-1", HTTP))
            ),
            7,
            &["spec.roles[0].replicas"],
        ),
        // Pools.
        manifest(
            "half-open range",
            ns,
            bad_pool(&ranges("\"35100-\"")),
            7,
            &["PortPool", "spec.ranges"],
        ),
        manifest(
            "reversed range",
            ns,
            bad_pool(&ranges("\"35200-35100\"")),
            7,
            &["spec.ranges"],
        ),
        manifest(
            "port 0",
            ns,
            bad_pool(&ranges("\"0-10\"")),
            7,
            &["spec.ranges"],
        ),
        manifest(
            "port above 65535",
            ns,
            bad_pool(&ranges("\"65000-70000\"")),
            7,
            &["spec.ranges"],
        ),
        manifest(
            "overlapping ranges",
            ns,
            bad_pool(&ranges("\"35100-35150\", \"35140-35160\"")),
            7,
            &["spec.ranges"],
        ),
        manifest(
            "exclusion outside the pool",
            ns,
            bad_pool(&format!(
                "{}  exclude: [\"36000\"]\n",
                ranges("\"35100-35150\"")
            )),
            7,
            &["spec.exclude[0]", "not inside"],
        ),
        manifest("no ranges", ns, bad_pool(&ranges("")), 7, &["spec.ranges"]),
        manifest(
            "unknown protocol",
            ns,
            bad_pool(&format!("{}  protocol: HTTP\n", ranges("\"35100-35150\""))),
            7,
            &["PortPool", "HTTP"],
        ),
        manifest(
            "static band not a count",
            ns,
            bad_pool(&format!(
                "{}  staticBand: lots\n",
                ranges("\"35100-35150\"")
            )),
            7,
            &["PortPool", "lots"],
        ),
        // Roles and ports.
        manifest(
            "role name not a DNS label",
            ns,
            x("  - name: Web\n    replicas: 1\n    ports: []\n"),
            7,
            &["PortAllocation", "/x", "spec.roles[0].name"],
        ),
        manifest(
            "duplicate role",
            ns,
            x(&format!(
                "{}{}",
                web("1", HTTP),
                web("1", HTTP).replace("HTTP_PORT", "B")
            )),
            7,
            &["spec.roles[1].name", "listed twice"],
        ),
        manifest(
            "duplicate port name",
            ns,
            x(&web(
                "1",
                &format!("{HTTP}    - {{name: http, env: OTHER}}\n"),
            )),
            7,
            &["spec.roles[0].ports[1].name", "listed twice"],
        ),
        manifest(
            "duplicate env",
            ns,
            x(&web(
                "1",
                &format!("{HTTP}    - {{name: grpc, env: HTTP_PORT}}\n"),
            )),
            7,
            &["spec.roles[0].ports[1].env", "used twice"],
        ),
        manifest(
            "env not a variable name",
            ns,
            x(&web("1", "    - {name: http, env: 1PORT}\n")),
            7,
            &["spec.roles[0].ports[0].env", "1PORT"],
        ),
        manifest(
            "negative replicas",
            ns,
            x(&web("-1", HTTP)),
            7,
            &["spec.roles[0].replicas", "-1 is outside 0..1024"],
        ),
        manifest(
            "too many replicas",
            ns,
            x(&web("2000", HTTP)),
            7,
            &["spec.roles[0].replicas", "2000"],
        ),
        manifest(
            "requested port 0",
            ns,
            x(&web(
                "1",
                "    - {name: ctl, scope: RoleScoped, env: CTL, port: 0}\n",
            )),
            7,
            &["spec.roles[0].ports[0].port", "outside 1..65535"],
        ),
        manifest(
            "requested port above 65535",
            ns,
            x(&web(
                "1",
                "    - {name: ctl, scope: RoleScoped, env: CTL, port: 70000}\n",
            )),
            7,
            &["spec.roles[0].ports[0].port"],
        ),
        manifest(
            "requested port on a PodScoped port",
            ns,
            x(&web(
                "2",
                "    - {name: http, scope: PodScoped, env: H, port: 35001}\n",
            )),
            7,
            &["spec.roles[0].ports[0].port", "must be RoleScoped"],
        ),
        manifest(
            "one port requested twice",
            ns,
            x(&web(
                "1",
                "    - {name: a, scope: RoleScoped, env: A, port: 35001}\n    - {name: b, scope: RoleScoped, env: B, port: 35001}\n",
            )),
            7,
            &[
                "spec.roles[0].ports[1].port",
                "requested by both web.a and web.b",
            ],
        ),
        manifest(
            "no roles",
            ns,
            pa_doc("x", p, "  []\n").replace("roles:\n  []", "roles: []"),
            7,
            &["spec.roles"],
        ),
        // References.
        manifest(
            "reference to a missing role",
            ns,
            x(&with_reference("nobody.http")),
            7,
            &[
                "spec.roles[2].references[0].from",
                "role \"nobody\", which does not exist",
            ],
        ),
        manifest(
            "reference to a missing port",
            ns,
            x(&with_reference("router.grpc")),
            7,
            &["spec.roles[2].references[0].from", "port \"grpc\""],
        ),
        manifest(
            "pod reference to a role without an address",
            ns,
            x(&with_reference("router")),
            7,
            &["spec.roles[2].references[0].from"],
        ),
        manifest(
            "malformed reference index",
            ns,
            x(&with_reference("prefill.bootstrap[x]")),
            7,
            &["spec.roles[2].references[0].from"],
        ),
        manifest(
            "ambiguous reference",
            ns,
            x(&with_reference("prefill.bootstrap")),
            7,
            &["spec.roles[2].references[0].from", "ambiguous"],
        ),
        manifest(
            "reference index out of range",
            ns,
            x(&with_reference("prefill.bootstrap[2]")),
            7,
            &["spec.roles[2].references[0].from", "out of range"],
        ),
        manifest(
            "index on a RoleScoped port",
            ns,
            x(&with_reference("router.http[1]")),
            7,
            &["spec.roles[2].references[0].from", "RoleScoped"],
        ),
        // Against the pool.
        manifest(
            "requested port outside the pool",
            ns,
            x(&web(
                "1",
                "    - {name: ctl, scope: RoleScoped, env: CTL, port: 35500}\n",
            )),
            4,
            &[
                "/x",
                &format!("pool \"{p}\""),
                "port 35500 is not in the pool's ranges",
            ],
        ),
        manifest(
            "requested port excluded",
            ns,
            x(&web(
                "1",
                "    - {name: ctl, scope: RoleScoped, env: CTL, port: 35045}\n",
            )),
            4,
            &["port 35045 is not in the pool's ranges"],
        ),
        manifest(
            "requested port held by another",
            ns,
            x(&web(
                "1",
                "    - {name: ctl, scope: RoleScoped, env: CTL, port: 35005}\n",
            )),
            4,
            &[
                "/x",
                "port 35005",
                &format!("already held by {ns}/owner"),
                "role admin, port ctl",
            ],
        ),
        manifest(
            "more ports than the pool has",
            ns,
            x(&web("60", HTTP)),
            4,
            &["/x", "pool is full", "needs 60"],
        ),
        manifest(
            "pool does not exist",
            ns,
            pa_doc("x", &format!("{prefix}-nowhere"), &web("1", HTTP)),
            3,
            &[
                &format!("PortPool \"{prefix}-nowhere\" not found"),
                "spec.pool of PortAllocation",
            ],
        ),
        manifest(
            "spec.pool of an existing object changed",
            ns,
            owner.replace(&format!("pool: {p}"), &format!("pool: {second}")),
            7,
            &["/owner", "spec.pool is immutable"],
        ),
        Case {
            stdin: Some(
                x(&web("1", HTTP)).replace("  name: x\n", "  name: x\n  namespace: elsewhere\n"),
            ),
            ..case(
                "document namespace differs from -n",
                &["create", "-f", "-", "-n", ns],
                7,
                &["\"x\" is in namespace \"elsewhere\"", "-n says"],
            )
        },
        case(
            "file that does not exist",
            &["create", "-f", "/nonexistent/file.yaml"],
            7,
            &["cannot read /nonexistent/file.yaml"],
        ),
        // Pool flags.
        case(
            "pool create: port 0",
            &["pool", "create", &other_pool, "--range", "0-10"],
            7,
            &[&format!("PortPool \"{other_pool}\""), "spec.ranges"],
        ),
        case(
            "pool create: above 65535",
            &["pool", "create", &other_pool, "--range", "65000-70000"],
            7,
            &["spec.ranges"],
        ),
        case(
            "pool create: not a range",
            &["pool", "create", &other_pool, "--range", "abc"],
            7,
            &["spec.ranges", "abc"],
        ),
        case(
            "pool create: exclusion outside",
            &[
                "pool",
                "create",
                &other_pool,
                "--range",
                "35100-35150",
                "--exclude",
                "35200",
            ],
            7,
            &["spec.exclude[0]"],
        ),
        case(
            "pool create: bad static band",
            &[
                "pool",
                "create",
                &other_pool,
                "--range",
                "35100-35150",
                "--static-band",
                "lots",
            ],
            // A closed set: clap's usage error, which lists the accepted forms.
            2,
            &["invalid value 'lots' for '--static-band"],
        ),
        case(
            "pool create: static band past the CRD's bound",
            &[
                "pool",
                "create",
                &other_pool,
                "--range",
                "35100-35150",
                "--static-band",
                "65536",
            ],
            2,
            &["invalid value '65536' for '--static-band"],
        ),
        case(
            "pool create: unknown protocol",
            &[
                "pool",
                "create",
                &other_pool,
                "--range",
                "35100-35150",
                "--protocol",
                "udp",
            ],
            2,
            &["invalid value 'udp' for '--protocol"],
        ),
        case(
            "pool create: overlaps a pool",
            &["pool", "create", &other_pool, "--range", "35000-35010"],
            4,
            &[&format!("PortPool \"{other_pool}\" would overlap")],
        ),
        case(
            "pool create: name taken",
            &[
                "pool",
                "create",
                p,
                "--range",
                "35100-35150",
                "--allow-overlap",
            ],
            4,
            &[&format!("PortPool \"{p}\" already exists")],
        ),
        case(
            "pool delete while held",
            &["pool", "delete", p],
            4,
            &[
                &format!("PortPool \"{p}\" still has 1 holders"),
                &format!("{ns}/owner"),
            ],
        ),
        case(
            "pool describe: no such pool",
            &["pool", "describe", &format!("{prefix}-nowhere")],
            3,
            &[&format!("PortPool \"{prefix}-nowhere\" not found")],
        ),
        case(
            "repair: no such pool",
            &["repair", "--pool", &format!("{prefix}-nowhere")],
            3,
            &[&format!("PortPool \"{prefix}-nowhere\" not found")],
        ),
        // Named objects.
        case(
            "sync: no such object",
            &["sync", "nothing", "-n", ns],
            3,
            &["PortAllocation \"nothing\" not found", ns],
        ),
        case(
            "delete: no such object",
            &["delete", "nothing", "-n", ns],
            3,
            &["PortAllocation \"nothing\" not found"],
        ),
        case(
            "release: no such role",
            &["release", "owner", "--role", "nope", "-n", ns],
            7,
            &[&format!("PortAllocation {ns}/owner has no role \"nope\"")],
        ),
        // Flags.
        case(
            "unknown flag",
            &["sync", "--everything"],
            2,
            &["--everything"],
        ),
        case("unknown output format", &["get", "-o", "xml"], 2, &["xml"]),
        case(
            "bad request timeout",
            &["get", "--request-timeout", "soon"],
            2,
            &["\"soon\""],
        ),
        case(
            "request timeout with an unknown unit",
            &["get", "--request-timeout", "5d"],
            2,
            &[
                "invalid value '5d' for '--request-timeout",
                "unknown unit \"d\"",
                "1m30s",
            ],
        ),
        case(
            "negative request timeout",
            &["get", "--request-timeout=-1s"],
            2,
            &["'--request-timeout", "negative"],
        ),
        case(
            "install timeout without a unit",
            &["install", "--timeout", "1m30"],
            2,
            &["'--timeout", "30 has no unit", "300ms"],
        ),
        case(
            "resolve: unknown output format",
            &[
                "resolve", "owner", "--role", "web", "--index", "0", "-n", ns, "-o", "ini",
            ],
            2,
            &["invalid value 'ini' for '--output"],
        ),
        case(
            "version: unknown output format",
            &["version", "-o", "yaml"],
            2,
            &["invalid value 'yaml' for '--output"],
        ),
        case(
            "completion: unknown shell",
            &["completion", "powershell"],
            2,
            &["invalid value 'powershell'"],
        ),
        case(
            "sync of nothing",
            &["sync", "-n", ns],
            2,
            &["name a PortAllocation, or pass --all"],
        ),
        // Out of the cluster before anything is installed in it (the README's --webhook-url
        // run): the CA Secret's namespace is missing. It stops before registering anything.
        case(
            "webhook namespace missing",
            &[
                "sync",
                "--watch",
                "-n",
                ns,
                "--webhook-address",
                "127.0.0.1:0",
                "--webhook-url",
                "https://127.0.0.1:9443",
                "--webhook-namespace",
                &missing_ns,
            ],
            3,
            &[
                &format!("Secret {missing_ns}/portalloc-webhook-ca"),
                &format!("namespace \"{missing_ns}\" does not exist"),
                &format!("kubectl create namespace {missing_ns}"),
                "or pass --webhook-namespace NAMESPACE",
            ],
        ),
        // Where to connect, and who may.
        case(
            "unknown context",
            &["get", "--context", "no-such-context"],
            9,
            &["no-such-context"],
        ),
        case(
            "kubeconfig that does not exist",
            &["get", "--kubeconfig", missing],
            9,
            &["cannot read kubeconfig", missing],
        ),
        case(
            "kubeconfig that does not parse",
            &["get", "--kubeconfig", garbled],
            9,
            &[garbled],
        ),
        case(
            "forbidden",
            &["sync", "owner", "-n", ns, "--context", USER_CONTEXT],
            5,
            &[
                "forbidden: you may not get portallocations.portalloc.dev",
                ns,
            ],
        ),
        Case {
            stdin: Some(x(&web("1", HTTP))),
            ..case(
                "forbidden create",
                // No kept copies (the earlier cases' commands left some): its first request
                // is the LIST of the pool's shards (which carry its spec), refused and named
                // with its verb.
                &[
                    "create",
                    "-f",
                    "-",
                    "-n",
                    ns,
                    "--context",
                    USER_CONTEXT,
                    "--cache-dir",
                    "",
                ],
                5,
                &["forbidden: you may not list portpoolshards.portalloc.dev"],
            )
        },
    ];

    let mut failures = Vec::new();
    let mut count = 0;
    for case in &cases {
        let before = snapshot(&client, &prefix, ns).await;
        let run = match &case.stdin {
            Some(input) => cli::run_stdin(
                &case.args.iter().map(String::as_str).collect::<Vec<_>>(),
                input,
            ),
            None => cli::run(&case.args.iter().map(String::as_str).collect::<Vec<_>>()),
        };
        count += 1;
        if let Err(why) = check(case, &run) {
            failures.push(format!(
                "{}: {why}\n  args: {:?}\n  {run}",
                case.what, case.args
            ));
        }
        let after = snapshot(&client, &prefix, ns).await;
        if before != after {
            failures.push(format!(
                "{}: the cluster changed:\n  before {before:?}\n  after  {after:?}",
                case.what
            ));
        }
    }

    // The CRDs missing: a control plane of its own where `install` never ran.
    if let Some(bare) = PrivateCluster::start("bare", false) {
        let doc = pa_doc("x", "default", &web("1", HTTP));
        let file = dir.path().join("x.yaml");
        std::fs::write(&file, &doc).unwrap();
        for args in [
            vec!["get", "-A"],
            vec!["pool", "get"],
            vec!["sync", "--all", "-A"],
            vec!["repair"],
            vec!["create", "-f", file.to_str().unwrap()],
        ] {
            count += 1;
            let run = bare.run(&args);
            let expected = case(
                "CRDs not installed",
                &args,
                8,
                &[
                    "the portalloc.dev CRDs are not installed",
                    "kubectl portalloc install",
                ],
            );
            if let Err(why) = check(&expected, &run) {
                failures.push(format!("CRDs not installed {args:?}: {why}\n  {run}"));
            }
        }
    }
    eprintln!("bad input: {count} cases, {} failures", failures.len());
    assert!(
        failures.is_empty(),
        "{} of {count} cases failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(count >= 40);
}

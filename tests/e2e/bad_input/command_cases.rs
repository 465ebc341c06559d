//! Bad command lines: flags, names of objects that are not there, and where to connect.

use super::case::{Case, case};
use super::fixture::{Fixture, HTTP, pa_doc, web};
use crate::support::{ADMIN_CONTEXT, USER_CONTEXT};

/// `pool create` flags that describe no valid pool.
pub fn pool_flag_cases(f: &Fixture) -> Vec<Case> {
    let other = f.other_pool.as_str();
    let create = |what, flags: &[&str], code, needles: &[&str]| {
        let args = [&["pool", "create", other, "--range"][..], flags].concat();
        case(what, &args, code, needles)
    };
    vec![
        create(
            "pool create: port 0",
            &["0-10"],
            7,
            &[&format!("PortPool \"{other}\""), "spec.ranges"],
        ),
        create(
            "pool create: above 65535",
            &["65000-70000"],
            7,
            &["spec.ranges"],
        ),
        create(
            "pool create: not a range",
            &["abc"],
            7,
            &["spec.ranges", "abc"],
        ),
        create(
            "pool create: exclusion outside",
            &["35100-35150", "--exclude", "35200"],
            7,
            &["spec.exclude[0]"],
        ),
        create(
            "pool create: bad static band",
            &["35100-35150", "--static-band", "lots"],
            // A closed set: clap's usage error, which lists the accepted forms.
            2,
            &["invalid value 'lots' for '--static-band"],
        ),
        create(
            "pool create: static band past the CRD's bound",
            &["35100-35150", "--static-band", "65536"],
            2,
            &["invalid value '65536' for '--static-band"],
        ),
        create(
            "pool create: unknown protocol",
            &["35100-35150", "--protocol", "udp"],
            2,
            &["invalid value 'udp' for '--protocol"],
        ),
        create(
            "pool create: overlaps a pool",
            &["35000-35010"],
            4,
            &[&format!("PortPool \"{other}\" would share TCP ports")],
        ),
    ]
}

/// Pool verbs the existing pools refuse: a taken name, a held pool, a missing one.
pub fn pool_command_cases(f: &Fixture) -> Vec<Case> {
    let (ns, p, nowhere) = (f.ns.as_str(), f.pool.as_str(), f.nowhere.as_str());
    vec![
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
            "pool create: name taken, another spec, no --allow-overlap",
            &["pool", "create", p, "--range", "35000-35059"],
            4,
            &[
                &format!("PortPool \"{p}\" already exists and differs"),
                "spec.exclude: [\"35040-35049\"] -> <unset>",
                "spec.ranges: [\"35000-35049\"] -> [\"35000-35059\"]",
            ],
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
            &["pool", "describe", nowhere],
            3,
            &[&format!("PortPool \"{nowhere}\" not found")],
        ),
        case(
            "repair: no such pool",
            &["repair", "--pool", nowhere],
            3,
            &[&format!("PortPool \"{nowhere}\" not found")],
        ),
    ]
}

/// PortAllocations, and roles of them, that are not there.
pub fn named_object_cases(f: &Fixture) -> Vec<Case> {
    let ns = f.ns.as_str();
    vec![
        case(
            "sync: no such object",
            &["sync", "nothing", "-n", ns],
            3,
            &["PortAllocation \"nothing\" not found", ns],
        ),
        case(
            "create in a namespace that does not exist",
            &["create", "-f", "-", "-n", f.nowhere.as_str()],
            3,
            &[
                &format!("namespace \"{}\" does not exist", f.nowhere),
                &format!("kubectl create namespace {}", f.nowhere),
            ],
        )
        .with_stdin(pa_doc("x", &f.pool, &web("1", HTTP))),
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
    ]
}

/// Flags and values the command line parser refuses (clap's usage errors, exit 2).
pub fn flag_cases(f: &Fixture) -> Vec<Case> {
    let ns = f.ns.as_str();
    vec![
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
    ]
}

/// Out of the cluster before anything is installed in it (the README's --webhook-url run): the
/// CA Secret's namespace is missing. It stops before registering anything.
pub fn webhook_cases(f: &Fixture) -> Vec<Case> {
    let missing_ns = f.nowhere.as_str();
    vec![case(
        "webhook namespace missing",
        &[
            "sync",
            "--watch",
            "-n",
            &f.ns,
            "--webhook-address",
            "127.0.0.1:0",
            "--webhook-url",
            "https://127.0.0.1:9443",
            "--webhook-namespace",
            missing_ns,
        ],
        3,
        &[
            &format!("Secret {missing_ns}/portalloc-webhook-ca"),
            &format!("namespace \"{missing_ns}\" does not exist"),
            &format!("kubectl create namespace {missing_ns}"),
            "or pass --webhook-namespace NAMESPACE",
        ],
    )]
}

/// Where to connect, and who may.
pub fn connection_cases(f: &Fixture) -> Vec<Case> {
    let (ns, garbled, missing) = (
        f.ns.as_str(),
        f.garbled_kubeconfig.as_str(),
        f.missing_kubeconfig.as_str(),
    );
    vec![
        case(
            "unknown context",
            &["get", "--context", "no-such-context"],
            9,
            &[
                "context \"no-such-context\" is not in the kubeconfig",
                &format!("its contexts: {ADMIN_CONTEXT}, {USER_CONTEXT}"),
            ],
        ),
        case(
            "server that does not answer",
            &["get", "--kubeconfig", &f.unreachable_kubeconfig],
            6,
            &[
                "the API server at https://127.0.0.1:1 is unavailable",
                "--context",
            ],
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
        case(
            "forbidden create",
            // No kept copies (the earlier cases' commands left some): its first request is the
            // LIST of the pool's shards (which carry its spec), refused and named with its verb.
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
        .with_stdin(f.x(&web("1", HTTP))),
    ]
}

/// Every verb that reads or writes the CRDs, on a cluster where `install` never ran.
pub fn crds_missing_cases(manifest_file: &str) -> Vec<Case> {
    [
        vec!["get", "-A"],
        vec!["pool", "get"],
        vec!["sync", "--all", "-A"],
        vec!["repair"],
        vec!["create", "-f", manifest_file],
    ]
    .iter()
    .map(|args| {
        case(
            "CRDs not installed",
            args,
            8,
            &[
                "the portalloc.dev CRDs are not installed",
                "kubectl portalloc install",
            ],
        )
    })
    .collect()
}

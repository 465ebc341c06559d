//! Bad manifests given to `create -f`: each table is one topic, in the order the run takes them.

use super::case::{Case, case, manifest};
use super::fixture::{Fixture, HTTP, pa_doc, ranges, web, with_reference};

/// YAML syntax and the shape of the documents: kinds, versions, names, field types.
pub fn shape_cases(f: &Fixture) -> Vec<Case> {
    let ns = f.ns.as_str();
    vec![
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
            f.x(&web("2", HTTP)).replace("replicas:", "replica:"),
            7,
            &[
                "PortAllocation \"x\"",
                "unknown field \"spec.roles.0.replica\"",
            ],
        ),
        manifest(
            "unknown field in a pool",
            ns,
            f.bad_pool(&format!("{}  protocoll: TCP\n", ranges("\"35100-35110\""))),
            7,
            &["PortPool", "unknown field \"spec.protocoll\""],
        ),
        manifest(
            "wrong kind in our group",
            ns,
            f.x(&web("1", HTTP))
                .replace("kind: PortAllocation", "kind: PortAllocations"),
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
            f.x(&web("1", HTTP))
                .replace("portalloc.dev/v1alpha1", "portalloc.dev/v1"),
            7,
            &["apiVersion \"portalloc.dev/v1\""],
        ),
        manifest(
            "no metadata.name",
            ns,
            f.x(&web("1", HTTP)).replace("  name: x\n", ""),
            7,
            &["PortAllocation has no metadata.name"],
        ),
        manifest(
            "replicas of the wrong type",
            ns,
            f.x(&web("two", HTTP)),
            7,
            &["PortAllocation \"x\"", "replicas"],
        ),
        manifest(
            "second document invalid: the first is not applied",
            ns,
            format!(
                "{}---\n{}",
                pa_doc("first", &f.pool, &web("1", HTTP)),
                f.x(&web("-1", HTTP))
            ),
            7,
            &["spec.roles[0].replicas"],
        ),
    ]
}

/// PortPool specs: ranges, exclusions, protocol, static band.
pub fn pool_spec_cases(f: &Fixture) -> Vec<Case> {
    let ns = f.ns.as_str();
    let spec =
        |what, text: &str, needles: &[&str]| manifest(what, ns, f.bad_pool(text), 7, needles);
    vec![
        spec(
            "half-open range",
            &ranges("\"35100-\""),
            &["PortPool", "spec.ranges"],
        ),
        spec(
            "reversed range",
            &ranges("\"35200-35100\""),
            &["spec.ranges"],
        ),
        spec("port 0", &ranges("\"0-10\""), &["spec.ranges"]),
        spec(
            "port above 65535",
            &ranges("\"65000-70000\""),
            &["spec.ranges"],
        ),
        spec(
            "overlapping ranges",
            &ranges("\"35100-35150\", \"35140-35160\""),
            &["spec.ranges"],
        ),
        spec(
            "exclusion outside the pool",
            &format!("{}  exclude: [\"36000\"]\n", ranges("\"35100-35150\"")),
            &["spec.exclude[0]", "not inside"],
        ),
        spec("no ranges", &ranges(""), &["spec.ranges"]),
        spec(
            "unknown protocol",
            &format!("{}  protocol: HTTP\n", ranges("\"35100-35150\"")),
            &["PortPool", "HTTP"],
        ),
        spec(
            "static band not a count",
            &format!("{}  staticBand: lots\n", ranges("\"35100-35150\"")),
            &["PortPool", "lots"],
        ),
    ]
}

/// Roles and their ports: names, duplicates, env names, replica counts.
pub fn role_cases(f: &Fixture) -> Vec<Case> {
    let ns = f.ns.as_str();
    let roles = |what, text: &str, needles: &[&str]| manifest(what, ns, f.x(text), 7, needles);
    vec![
        roles(
            "role name not a DNS label",
            "  - name: Web\n    replicas: 1\n    ports: []\n",
            &["PortAllocation", "/x", "spec.roles[0].name"],
        ),
        roles(
            "duplicate role",
            &format!(
                "{}{}",
                web("1", HTTP),
                web("1", HTTP).replace("HTTP_PORT", "B")
            ),
            &["spec.roles[1].name", "listed twice"],
        ),
        roles(
            "duplicate port name",
            &web("1", &format!("{HTTP}    - {{name: http, env: OTHER}}\n")),
            &["spec.roles[0].ports[1].name", "listed twice"],
        ),
        roles(
            "duplicate env",
            &web(
                "1",
                &format!("{HTTP}    - {{name: grpc, env: HTTP_PORT}}\n"),
            ),
            &["spec.roles[0].ports[1].env", "used twice"],
        ),
        roles(
            "env not a variable name",
            &web("1", "    - {name: http, env: 1PORT}\n"),
            &["spec.roles[0].ports[0].env", "1PORT"],
        ),
        roles(
            "negative replicas",
            &web("-1", HTTP),
            &["spec.roles[0].replicas", "-1 is outside 0..1024"],
        ),
        roles(
            "too many replicas",
            &web("2000", HTTP),
            &["spec.roles[0].replicas", "2000"],
        ),
        manifest(
            "no roles",
            ns,
            pa_doc("x", &f.pool, "  []\n").replace("roles:\n  []", "roles: []"),
            7,
            &["spec.roles"],
        ),
    ]
}

/// Ports asked for by number, checked before the pool is looked at.
pub fn port_request_cases(f: &Fixture) -> Vec<Case> {
    let ns = f.ns.as_str();
    let ports = |what, replicas, lines: &str, needles: &[&str]| {
        manifest(what, ns, f.x(&web(replicas, lines)), 7, needles)
    };
    vec![
        ports(
            "requested port 0",
            "1",
            "    - {name: ctl, scope: RoleScoped, env: CTL, port: 0}\n",
            &["spec.roles[0].ports[0].port", "outside 1..65535"],
        ),
        ports(
            "requested port above 65535",
            "1",
            "    - {name: ctl, scope: RoleScoped, env: CTL, port: 70000}\n",
            &["spec.roles[0].ports[0].port"],
        ),
        ports(
            "requested port on a PodScoped port",
            "2",
            "    - {name: http, scope: PodScoped, env: H, port: 35001}\n",
            &["spec.roles[0].ports[0].port", "must be RoleScoped"],
        ),
        ports(
            "one port requested twice",
            "1",
            "    - {name: a, scope: RoleScoped, env: A, port: 35001}\n    - {name: b, scope: RoleScoped, env: B, port: 35001}\n",
            &[
                "spec.roles[0].ports[1].port",
                "requested by both web.a and web.b",
            ],
        ),
    ]
}

/// References from one role to another role's ports.
pub fn reference_cases(f: &Fixture) -> Vec<Case> {
    let ns = f.ns.as_str();
    let reference = |what, from: &str, needles: &[&str]| {
        manifest(what, ns, f.x(&with_reference(from)), 7, needles)
    };
    const FROM: &str = "spec.roles[2].references[0].from";
    vec![
        reference(
            "reference to a missing role",
            "nobody.http",
            &[FROM, "role \"nobody\", which does not exist"],
        ),
        reference(
            "reference to a missing port",
            "router.grpc",
            &[FROM, "port \"grpc\""],
        ),
        reference(
            "pod reference to a role without an address",
            "router",
            &[FROM],
        ),
        reference("malformed reference index", "prefill.bootstrap[x]", &[FROM]),
        reference(
            "ambiguous reference",
            "prefill.bootstrap",
            &[FROM, "ambiguous"],
        ),
        reference(
            "reference index out of range",
            "prefill.bootstrap[2]",
            &[FROM, "out of range"],
        ),
        reference(
            "index on a RoleScoped port",
            "router.http[1]",
            &[FROM, "RoleScoped"],
        ),
    ]
}

/// Valid documents the cluster refuses: the pool is missing, full or holds the port already.
pub fn pool_fit_cases(f: &Fixture) -> Vec<Case> {
    let (ns, p) = (f.ns.as_str(), f.pool.as_str());
    let ctl = |port: &str| {
        f.x(&web(
            "1",
            &format!("    - {{name: ctl, scope: RoleScoped, env: CTL, port: {port}}}\n"),
        ))
    };
    vec![
        manifest(
            "requested port outside the pool",
            ns,
            ctl("35500"),
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
            ctl("35045"),
            4,
            &["port 35045 is not in the pool's ranges"],
        ),
        manifest(
            "requested port held by another",
            ns,
            ctl("35005"),
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
            f.x(&web("60", HTTP)),
            4,
            &["/x", "pool is full", "needs 60"],
        ),
        manifest(
            "pool does not exist",
            ns,
            pa_doc("x", &f.nowhere, &web("1", HTTP)),
            3,
            &[
                &format!("PortPool \"{}\" not found", f.nowhere),
                "spec.pool of PortAllocation",
            ],
        ),
        manifest(
            "spec.pool of an existing object changed",
            ns,
            f.owner
                .replace(&format!("pool: {p}"), &format!("pool: {}", f.second)),
            7,
            &["/owner", "spec.pool is immutable"],
        ),
    ]
}

/// Where the manifest comes from: its namespace against `-n`, a file that is not there.
pub fn source_cases(f: &Fixture) -> Vec<Case> {
    let ns = f.ns.as_str();
    vec![
        case(
            "document namespace differs from -n",
            &["create", "-f", "-", "-n", ns],
            7,
            &["\"x\" is in namespace \"elsewhere\"", "-n says"],
        )
        .with_stdin(
            f.x(&web("1", HTTP))
                .replace("  name: x\n", "  name: x\n  namespace: elsewhere\n"),
        ),
        case(
            "file that does not exist",
            &["create", "-f", "/nonexistent/file.yaml"],
            7,
            &["cannot read /nonexistent/file.yaml"],
        ),
    ]
}

/// Files of several objects whose later ones cannot be written: refused before the first
/// write, so nothing of the file is applied; and a pool of the file that exists with another
/// spec.
pub fn before_the_first_write_cases(f: &Fixture) -> Vec<Case> {
    let ns = f.ns.as_str();
    let new_pool = f.bad_pool(&ranges("\"35300-35309\""));
    let (pool, other, nowhere) = (f.pool.as_str(), f.other_pool.as_str(), f.nowhere.as_str());
    vec![
        manifest(
            "a new pool, then a bad second document: the pool is not created",
            ns,
            format!("{new_pool}---\n{}", pa_doc("y", other, &web("-1", HTTP))),
            7,
            &[&format!("PortAllocation {ns}/y"), "replicas"],
        ),
        manifest(
            "a new pool, then a PortAllocation in a namespace that does not exist",
            ns,
            format!(
                "{new_pool}---\n{}",
                pa_doc("y", other, &web("1", HTTP)).replace(
                    "  name: y\n",
                    &format!("  name: y\n  namespace: {nowhere}\n")
                )
            ),
            3,
            &[
                &format!("namespace \"{nowhere}\" does not exist"),
                "\"y\"",
                "nothing was written",
            ],
        )
        .without_namespace_flag(),
        manifest(
            "two PortAllocations, the second naming a pool that does not exist",
            ns,
            format!(
                "{}---\n{}",
                pa_doc("y", pool, &web("1", HTTP)),
                pa_doc("z", nowhere, &web("1", HTTP))
            ),
            3,
            &[
                &format!("PortPool \"{nowhere}\""),
                &format!("{ns}/z"),
                "neither exists nor is in the file",
            ],
        ),
        manifest(
            "two PortAllocations that fit one at a time but not together",
            ns,
            format!(
                "{}---\n{}",
                pa_doc("y", &f.second, &web("6", HTTP)),
                pa_doc("z", &f.second, &web("6", HTTP))
            ),
            4,
            &[&format!("{ns}/z"), "nothing of the file was written"],
        ),
        manifest(
            "an existing pool with another spec, then a PortAllocation",
            ns,
            format!(
                "{}---\n{}",
                super::fixture::pool_doc(
                    pool,
                    &format!(
                        "{}  exclude: [\"35040-35049\"]\n",
                        ranges("\"35000-35059\"")
                    )
                ),
                pa_doc("y", pool, &web("1", HTTP))
            ),
            4,
            &[
                &format!("PortPool \"{pool}\" already exists and differs"),
                "spec.ranges: [\"35000-35049\"] -> [\"35000-35059\"]",
                "--force",
            ],
        ),
        case(
            "an existing pool changed with --force so that its holder's port is excluded",
            &["create", "-f", "-", "-n", ns, "--force"],
            4,
            &[
                &format!("PortPool \"{pool}\": the new spec would strand 1 holders"),
                &format!("{ns}/owner (ports 35005: outside the new ranges or excluded)"),
            ],
        )
        .with_stdin(super::fixture::pool_doc(
            pool,
            &format!(
                "{}  exclude: [\"35005\", \"35040-35049\"]\n",
                ranges("\"35000-35049\"")
            ),
        )),
    ]
}

//! Tests of validate.rs: every check names its field.
use super::super::PortReference;
use super::super::fixtures::{self, pd_roles, port};
use super::super::{PortRequest, Workload};
use super::*;

fn spec() -> PortAllocationSpec {
    PortAllocationSpec {
        pool: "default".into(),
        roles: pd_roles(2, 1),
        ..Default::default()
    }
}

fn with_reference(from: &str) -> PortAllocationSpec {
    let mut spec = spec();
    spec.roles[2].references.push(PortReference {
        env: "REF".into(),
        from: from.into(),
        ..Default::default()
    });
    spec
}

#[test]
fn good_references_resolve() {
    for from in [
        "router.http",
        "prefill.bootstrap[1]",
        "prefill.bootstrap[*]",
        "decode.http",
        "router.http[0]",
    ] {
        assert_eq!(with_reference(from).validate(), Ok(()), "{from}");
    }
}

#[test]
fn bad_references_name_the_field_and_the_problem() {
    let cases = [
        (
            "nobody.http",
            "names role \"nobody\", which does not exist (roles: router, prefill, decode)",
        ),
        (
            "router.grpc",
            "names port \"grpc\", which role \"router\" does not have (ports: http)",
        ),
        ("prefill.bootstrap", "is ambiguous"),
        (
            "prefill.bootstrap[2]",
            "out of range: role \"prefill\" has 2 replicas",
        ),
        ("router.http[1]", "indexes a RoleScoped port"),
        ("Router", "malformed"),
        (
            "router",
            "role router has no workload, so its pods have no address",
        ),
        ("prefill", "is ambiguous: role \"prefill\" has 2 replicas"),
        (
            "prefill[2]",
            "out of range: role \"prefill\" has 2 replicas",
        ),
        ("nobody[*]", "names role \"nobody\", which does not exist"),
    ];
    for (from, expected) in cases {
        let err = with_reference(from).validate().unwrap_err();
        assert_eq!(err.field, "spec.roles[2].references[0].from", "{from}");
        assert!(err.message.contains(expected), "{from}: {err}");
    }
}

fn with_workloads() -> PortAllocationSpec {
    let mut s = spec();
    s.roles[1].workload = Some(Workload {
        kind: WorkloadKind::StatefulSet,
        name: "prefill".into(),
        service: Some("prefill".into()),
        member: None,
    });
    s
}

fn formatted(from: &str, format: &str) -> PortAllocationSpec {
    let mut s = with_workloads();
    s.roles[0].references.push(PortReference {
        env: "REF".into(),
        from: from.into(),
        format: Some(format.into()),
        join: None,
    });
    s
}

#[test]
fn every_placeholder_is_accepted_where_it_means_something() {
    let s = formatted(
        "prefill[*]",
        "{address} {pod} {index} {bootstrap} {bootstrap.last} {bootstrap.range}",
    );
    assert_eq!(s.validate(), Ok(()));
    assert_eq!(formatted("prefill[1]", "{pod}").validate(), Ok(()));
}

/// What an error message must say: a part of it, or all of it.
enum Says {
    Part(&'static str),
    All(&'static str),
}

#[test]
fn bad_formats_name_the_format_field() {
    let at = "spec.roles[0].references[0]";
    // A StatefulSet without its Service has names but no addresses.
    let mut no_service = formatted("prefill[0]", "{address}");
    no_service.roles[1].workload.as_mut().unwrap().service = None;
    // The default format is {address}: its error names `from`.
    let mut default_format = with_workloads();
    default_format.roles[0].references.push(PortReference {
        env: "REF".into(),
        from: "decode".into(),
        ..Default::default()
    });
    let cases = [
        (
            formatted("prefill[*]", "{grpc}"),
            "format",
            Says::Part(
                "unknown placeholder {grpc}: role \"prefill\" has no such port (ports: bootstrap;",
            ),
        ),
        (
            formatted("prefill[*]", "{addr}"),
            "format",
            Says::Part("unknown placeholder {addr}"),
        ),
        (
            formatted("prefill[*]", "{bootstrap.first}"),
            "format",
            Says::Part("unknown placeholder {bootstrap.first}"),
        ),
        (
            formatted("prefill[*]", "http://{address"),
            "format",
            Says::Part("without its"),
        ),
        (
            formatted("decode[*]", "{address}"),
            "format",
            Says::Part("role decode has no workload, so its pods have no address"),
        ),
        (
            formatted("router.http", "{address}"),
            "format",
            Says::Part("format applies to pod references"),
        ),
        (no_service, "format", Says::Part("names no service")),
        (
            default_format,
            "from",
            Says::All("role decode has no workload, so its pods have no address"),
        ),
    ];
    for (spec, field, says) in cases {
        let err = spec.validate().unwrap_err();
        assert_eq!(err.field, format!("{at}.{field}"), "{err}");
        match says {
            Says::Part(part) => assert!(err.message.contains(part), "{err}"),
            Says::All(all) => assert_eq!(err.message, all),
        }
        assert!(!err.to_string().contains('\n'));
    }
}

fn lws_spec(groups: i32, leader_replicas: i32) -> PortAllocationSpec {
    let lws = |member| Workload {
        kind: WorkloadKind::LeaderWorkerSet,
        name: "sglang".into(),
        service: None,
        member: Some(member),
    };
    let mut leader = fixtures::role(
        "leader",
        leader_replicas,
        vec![port("dist", PortScope::RoleScoped, "DIST")],
    );
    leader.workload = Some(lws(LwsMember::Leader));
    let mut worker = fixtures::role("worker", 3, vec![]);
    worker.workload = Some(lws(LwsMember::Workers));
    worker.references.push(PortReference {
        env: "LEADER".into(),
        from: "leader".into(),
        format: Some("{address}:{dist}".into()),
        join: None,
    });
    PortAllocationSpec {
        pool: "p".into(),
        groups: Some(groups),
        roles: vec![leader, worker],
        ..Default::default()
    }
}

#[test]
fn workloads_are_checked() {
    assert_eq!(lws_spec(2, 1).validate(), Ok(()));
    let err = lws_spec(2, 2).validate().unwrap_err();
    assert_eq!(err.field, "spec.roles[0].replicas");
    assert!(err.message.contains("leader: one pod per group"), "{err}");

    let mut no_member = lws_spec(1, 1);
    no_member.roles[1].workload.as_mut().unwrap().member = None;
    assert_eq!(
        no_member.validate().unwrap_err().field,
        "spec.roles[1].workload.member"
    );

    let deployment = Some(Workload {
        kind: WorkloadKind::Deployment,
        name: "router".into(),
        service: Some("router".into()),
        member: None,
    });
    let mut s = spec();
    s.roles[1].workload = deployment.clone();
    let err = s.validate().unwrap_err();
    assert_eq!(err.field, "spec.roles[1].ports[0].scope");
    assert!(
        err.message
            .contains("a PodScoped port cannot reach each pod"),
        "{err}"
    );
    s.roles[1].replicas = 1;
    assert_eq!(s.validate(), Ok(()));
    s.groups = Some(2);
    let err = s.validate().unwrap_err();
    assert_eq!(err.field, "spec.roles[1].workload.kind");
    assert!(err.message.contains("spec.groups is 2"), "{err}");

    let mut s = spec();
    s.groups = Some(0);
    assert_eq!(s.validate().unwrap_err().field, "spec.groups");
    let mut s = spec();
    s.groups = Some(2);
    s.roles[0].ports[0].port = Some(30000);
    let err = s.validate().unwrap_err();
    assert_eq!(err.field, "spec.roles[0].ports[0].port");
    assert!(err.message.contains("cannot serve 2 groups"), "{err}");
}

#[test]
fn two_roles_cannot_share_a_pod_name() {
    let mut s = with_workloads();
    s.roles[2].workload = s.roles[1].workload.clone();
    assert_eq!(
        s.validate().unwrap_err().to_string(),
        "spec.roles[2].workload.name: pod prefill-0 of role decode is also a pod of role prefill: their env files (prefill-0.env) would be one"
    );
}

#[test]
fn env_names_collide_across_env_last_range_and_references() {
    let mut s = spec();
    s.roles[1].ports[0].last_env = Some("BOOTSTRAP_PORT".into());
    assert_eq!(
        s.validate().unwrap_err().to_string(),
        "spec.roles[1].ports[0].lastEnv: env \"BOOTSTRAP_PORT\" is used twice in role \"prefill\": spec.roles[1].ports[0].env sets it too"
    );
    let mut s = spec();
    s.roles[1].ports[0].range_env = Some("RANGE".into());
    s.roles[1].references.push(PortReference {
        env: "RANGE".into(),
        from: "router.http".into(),
        ..Default::default()
    });
    let err = s.validate().unwrap_err();
    assert_eq!(err.field, "spec.roles[1].references[0].env");
    assert!(
        err.message.contains("spec.roles[1].ports[0].rangeEnv"),
        "{err}"
    );
    let mut s = spec();
    s.roles[1].ports[0].range_env = Some("bad-name".into());
    assert_eq!(
        s.validate().unwrap_err().field,
        "spec.roles[1].ports[0].rangeEnv"
    );
}

#[test]
fn groups_multiply_the_slots() {
    let s = lws_spec(3, 1);
    let demands = s.demands().unwrap();
    // The leader's RoleScoped port: one demand (one slot) per group, keyed by group.
    let leaders: Vec<_> = demands
        .iter()
        .filter(|d| d.port == demands[0].port)
        .collect();
    assert_eq!(leaders.len(), 3);
    assert!(leaders.iter().all(|d| d.slot_count() == 1));
    assert_eq!(s.desired_port_count(), 3);
    let mut pods = spec();
    pods.groups = Some(2);
    let demands = pods.demands().unwrap();
    assert_eq!(
        demands
            .iter()
            .map(|d| (d.role.as_str(), d.slot_count()))
            .collect::<Vec<_>>(),
        vec![
            ("router", 1),
            ("prefill", 2),
            ("decode", 1),
            ("1-router", 1),
            ("1-prefill", 2),
            ("1-decode", 1)
        ]
    );
    assert_eq!(pods.desired_port_count(), 8);
}

#[test]
fn duplicates_and_bounds_are_caught() {
    let mut s = spec();
    s.roles[1].name = "router".into();
    assert_eq!(s.validate().unwrap_err().field, "spec.roles[1].name");

    let mut s = spec();
    s.roles[0]
        .ports
        .push(port("http", PortScope::RoleScoped, "OTHER"));
    assert_eq!(
        s.validate().unwrap_err().field,
        "spec.roles[0].ports[1].name"
    );

    let mut s = spec();
    s.roles[0].replicas = 5000;
    assert_eq!(s.validate().unwrap_err().field, "spec.roles[0].replicas");

    let mut s = spec();
    s.roles[0].ports[0].port = Some(30009);
    s.roles[1].ports.push(PortRequest {
        port: Some(30009),
        ..port("fixed", PortScope::RoleScoped, "FIXED")
    });
    let err = s.validate().unwrap_err();
    assert!(
        err.message
            .contains("requested by both router.http and prefill.fixed"),
        "{err}"
    );
}

#[test]
fn demands_follow_the_spec() {
    let demands = spec().demands().unwrap();
    assert_eq!(demands.len(), 3);
    assert_eq!(demands[1].replicas, 2);
    assert_eq!(demands[1].scope, core::Scope::PodScoped);
    assert_eq!(spec().desired_port_count(), 1 + 2 + 1);
}

#[test]
fn pool_ports_subtract_exclusions() {
    let pool = PortPoolSpec {
        ranges: vec!["30000-30009".into(), "30020".into()],
        exclude: vec!["30005".into(), "30008-30009".into()],
        protocol: Default::default(),
        static_band: StaticBandSetting::Auto,
        node_reuse: None,
        follow_nodes: None,
        guard: None,
        allow_overlap: false,
    };
    assert_eq!(
        pool.port_set().unwrap().to_string(),
        "30000-30004,30006-30007,30020"
    );
    let mut outside = pool.clone();
    outside.exclude.push("40000".into());
    assert_eq!(outside.port_set().unwrap_err().field, "spec.exclude[2]");
    let mut overlapping = pool;
    overlapping.ranges.push("30009-30010".into());
    assert_eq!(overlapping.port_set().unwrap_err().field, "spec.ranges");
}

#[test]
fn a_guard_on_an_sctp_pool_is_refused_and_says_why() {
    let sctp = |guard| PortPoolSpec {
        ranges: vec!["40000-40009".into()],
        exclude: vec![],
        protocol: Protocol::Sctp,
        static_band: StaticBandSetting::Auto,
        node_reuse: None,
        follow_nodes: None,
        guard,
        allow_overlap: false,
    };
    for mode in [GuardMode::Audit, GuardMode::Enforce] {
        let refused = sctp(Some(mode)).check_guard().unwrap_err();
        assert_eq!(refused.field, "spec.guard");
        assert!(
            refused
                .message
                .contains("sctp_bind, which runs no cgroup bind4/bind6 hook"),
            "{refused}"
        );
        // Its ports are still usable, and reserved by the agent: only the guard is refused.
        assert!(sctp(Some(mode)).port_set().is_ok());
        assert_eq!(sctp(Some(mode)).judged_guard(), GuardMode::Disabled);
    }
    assert_eq!(sctp(Some(GuardMode::Disabled)).check_guard(), Ok(()));
    assert_eq!(sctp(None).check_guard(), Ok(()));
    let tcp = PortPoolSpec {
        protocol: Protocol::Tcp,
        ..sctp(Some(GuardMode::Enforce))
    };
    assert_eq!(tcp.check_guard(), Ok(()));
    assert_eq!(tcp.judged_guard(), GuardMode::Enforce);
}

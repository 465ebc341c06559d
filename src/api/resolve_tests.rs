//! Tests of resolve.rs: own ports, references in every form, groups, pod names.

use super::super::fixtures::{pd_roles, port, reference, role};
use super::super::{
    LwsMember, PortAllocationSpec, PortAllocationStatus, PortAssignment, PortReference, Workload,
    WorkloadKind,
};
use super::*;

fn assignment(role: &str, port: &str, scope: PortScope, values: &[i32]) -> PortAssignment {
    PortAssignment {
        role: role.into(),
        port: port.into(),
        scope,
        env: String::new(),
        values: values.to_vec(),
        ..Default::default()
    }
}

fn allocation(spec: PortAllocationSpec, assignments: Vec<PortAssignment>) -> PortAllocation {
    let mut pa = PortAllocation::new("pd", spec);
    pa.metadata.namespace = Some("llm".into());
    pa.status = Some(PortAllocationStatus {
        assignments,
        ..Default::default()
    });
    pa
}

fn pd() -> PortAllocation {
    let mut roles = pd_roles(2, 2);
    roles[2]
        .ports
        .push(port("metrics", PortScope::RoleScoped, "METRICS_PORT"));
    roles[2].references = vec![
        reference("ROUTER", "router.http"),
        reference("BOOTSTRAPS", "prefill.bootstrap[*]"),
        reference("FIRST", "prefill.bootstrap[0]"),
    ];
    allocation(
        PortAllocationSpec {
            pool: "p".into(),
            roles,
            ..Default::default()
        },
        vec![
            assignment("router", "http", PortScope::RoleScoped, &[20001]),
            assignment(
                "prefill",
                "bootstrap",
                PortScope::PodScoped,
                &[20010, 20011],
            ),
            assignment("decode", "http", PortScope::PodScoped, &[20020, 20021]),
            assignment("decode", "metrics", PortScope::RoleScoped, &[20009]),
        ],
    )
}

fn pairs(env: &[EnvVar]) -> Vec<(&str, &str)> {
    env.iter()
        .map(|e| (e.name.as_str(), e.value.as_str()))
        .collect()
}

fn workload(kind: WorkloadKind, name: &str, service: Option<&str>) -> Option<Workload> {
    Some(Workload {
        kind,
        name: name.into(),
        service: service.map(Into::into),
        member: None,
    })
}

fn formatted(env: &str, from: &str, format: &str, join: Option<&str>) -> PortReference {
    PortReference {
        env: env.into(),
        from: from.into(),
        format: Some(format.into()),
        join: join.map(Into::into),
    }
}

/// SGLang PD with workloads: a router Deployment, prefill and decode StatefulSets behind
/// headless Services, the router told every server's URL.
pub(crate) fn sglang_pd() -> PortAllocation {
    let mut roles = pd_roles(2, 2);
    roles[0].workload = workload(WorkloadKind::Deployment, "router", Some("router"));
    roles[1]
        .ports
        .insert(0, port("http", PortScope::PodScoped, "PREFILL_PORT"));
    roles[1].workload = workload(WorkloadKind::StatefulSet, "prefill", Some("prefill"));
    roles[2].workload = workload(WorkloadKind::StatefulSet, "decode", Some("decode"));
    roles[0].references = vec![
        formatted(
            "PREFILL_ARGS",
            "prefill[*]",
            "--prefill http://{address}:{http} {bootstrap}",
            Some(" "),
        ),
        formatted(
            "DECODE_ARGS",
            "decode[*]",
            "--decode http://{address}:{http}",
            Some(" "),
        ),
        reference("FIRST_PREFILL", "prefill[0]"),
        formatted("NAMES", "decode[*]", "{pod}#{index}", None),
    ];
    allocation(
        PortAllocationSpec {
            pool: "p".into(),
            roles,
            ..Default::default()
        },
        vec![
            assignment("router", "http", PortScope::RoleScoped, &[30000]),
            assignment("prefill", "http", PortScope::PodScoped, &[30001, 30003]),
            assignment(
                "prefill",
                "bootstrap",
                PortScope::PodScoped,
                &[30002, 30004],
            ),
            assignment("decode", "http", PortScope::PodScoped, &[30005, 30006]),
        ],
    )
}

/// An LWS of 2 groups of size 3: leader (dist port RoleScoped per group, a block of 4 for
/// NIXL) and 2 workers each, every worker told its own group's leader.
pub(crate) fn lws() -> PortAllocation {
    let mut leader = role(
        "leader",
        1,
        vec![
            port("dist", PortScope::RoleScoped, "DIST_PORT"),
            PortRequest {
                count: Some(4),
                last_env: Some("NIXL_LAST".into()),
                range_env: Some("NIXL_RANGE".into()),
                ..port("nixl", PortScope::PodScoped, "NIXL_BASE")
            },
        ],
    );
    leader.workload = Some(Workload {
        kind: WorkloadKind::LeaderWorkerSet,
        name: "sglang".into(),
        service: None,
        member: Some(LwsMember::Leader),
    });
    let mut worker = role(
        "worker",
        2,
        vec![port("metrics", PortScope::PodScoped, "METRICS")],
    );
    worker.workload = Some(Workload {
        member: Some(LwsMember::Workers),
        ..leader.workload.clone().unwrap()
    });
    worker.references = vec![
        formatted("DIST_INIT", "leader", "{address}:{dist}", None),
        reference("DIST_PORT_ONLY", "leader.dist"),
        formatted("NIXL", "leader", "{nixl}/{nixl.last}/{nixl.range}", None),
        reference("PEERS", "worker.metrics[*]"),
        formatted("PEER_PODS", "worker[*]", "{pod}:{index}", Some(";")),
        reference("SECOND", "worker.metrics[1]"),
    ];
    let mut nixl = assignment("leader", "nixl", PortScope::PodScoped, &[31000, 31010]);
    nixl.count = Some(4);
    allocation(
        PortAllocationSpec {
            pool: "p".into(),
            groups: Some(2),
            roles: vec![leader, worker],
            ..Default::default()
        },
        vec![
            assignment("leader", "dist", PortScope::RoleScoped, &[30100, 30200]),
            nixl,
            assignment(
                "worker",
                "metrics",
                PortScope::PodScoped,
                &[30101, 30102, 30201, 30202],
            ),
        ],
    )
}

use super::super::PortRequest;

#[test]
fn a_pod_gets_its_own_ports_and_resolved_references() {
    let env = pd().resolve_env("decode", 1).unwrap();
    assert_eq!(
        pairs(&env),
        vec![
            ("DECODE_PORT", "20021"),
            ("METRICS_PORT", "20009"),
            ("ROUTER", "20001"),
            ("BOOTSTRAPS", "20010,20011"),
            ("FIRST", "20010")
        ]
    );
    assert_eq!(env[0].source, "own port decode.http[1]");
}

#[test]
fn the_router_gets_every_prefill_and_decode_endpoint() {
    let all = sglang_pd().resolve_all().unwrap();
    assert_eq!(
        all.keys().collect::<Vec<_>>(),
        vec!["decode-0", "decode-1", "prefill-0", "prefill-1", "router"]
    );
    assert_eq!(
        pairs(&all["router"]),
        vec![
            ("ROUTER_PORT", "30000"),
            (
                "PREFILL_ARGS",
                "--prefill http://prefill-0.prefill.llm.svc:30001 30002 \
                 --prefill http://prefill-1.prefill.llm.svc:30003 30004"
            ),
            (
                "DECODE_ARGS",
                "--decode http://decode-0.decode.llm.svc:30005 \
                 --decode http://decode-1.decode.llm.svc:30006"
            ),
            ("FIRST_PREFILL", "prefill-0.prefill.llm.svc"),
            ("NAMES", "decode-0#0,decode-1#1"),
        ]
    );
}

#[test]
fn references_resolve_inside_the_own_group() {
    let pa = lws();
    let all = pa.resolve_all().unwrap();
    assert_eq!(
        all.keys().collect::<Vec<_>>(),
        vec![
            "sglang-0",
            "sglang-0-1",
            "sglang-0-2",
            "sglang-1",
            "sglang-1-1",
            "sglang-1-2"
        ]
    );
    // Worker 2 of group 1 (flat index 3).
    assert_eq!(
        pairs(&all["sglang-1-2"]),
        vec![
            ("METRICS", "30202"),
            ("DIST_INIT", "sglang-1.sglang.llm.svc:30200"),
            ("DIST_PORT_ONLY", "30200"),
            ("NIXL", "31010/31013/31010-31013"),
            ("PEERS", "30201,30202"),
            ("PEER_PODS", "sglang-1-1:0;sglang-1-2:1"),
            ("SECOND", "30202"),
        ]
    );
    assert_eq!(
        pairs(&all["sglang-0-1"])[1],
        ("DIST_INIT", "sglang-0.sglang.llm.svc:30100")
    );
    // A block's own env: first, last, range.
    assert_eq!(
        pairs(&all["sglang-1"]),
        vec![
            ("DIST_PORT", "30200"),
            ("NIXL_BASE", "31010"),
            ("NIXL_LAST", "31013"),
            ("NIXL_RANGE", "31010-31013"),
        ]
    );
    assert_eq!(all["sglang-1"][0].source, "own port leader.dist");
}

#[test]
fn pod_names_give_the_index() {
    assert_eq!(index_from_pod_name("sglang-pd-decode-12", "decode"), Ok(12));
    assert!(matches!(
        index_from_pod_name("decode", "decode"),
        Err(ResolveError::BadPodName { .. })
    ));
    assert!(matches!(
        index_from_pod_name("decode-x", "decode"),
        Err(ResolveError::BadPodName { .. })
    ));
}

#[test]
fn pods_are_located_by_name_with_or_without_role() {
    let pa = lws();
    assert_eq!(pa.locate_pod(None, "sglang-1-2"), Ok(("worker".into(), 3)));
    assert_eq!(pa.locate_pod(None, "sglang-1"), Ok(("leader".into(), 1)));
    assert_eq!(
        pa.locate_pod(Some("leader"), "sglang-0"),
        Ok(("leader".into(), 0))
    );
    let err = pa.locate_pod(Some("leader"), "sglang-0-1").unwrap_err();
    assert_eq!(
        err.to_string(),
        "PortAllocation llm/pd has no pod \"sglang-0-1\" in role \"leader\" (its pods are named like sglang-0)"
    );
    let err = pa.locate_pod(None, "sglang-2").unwrap_err();
    assert!(matches!(err, ResolveError::NoSuchPod { .. }), "{err}");
    let pd = sglang_pd();
    assert_eq!(pd.locate_pod(None, "router"), Ok(("router".into(), 0)));
    assert_eq!(pd.locate_pod(None, "decode-1"), Ok(("decode".into(), 1)));
    // A role without workload keeps taking the trailing index of any name.
    assert_eq!(
        self::pd().locate_pod(Some("decode"), "sglang-pd-decode-1"),
        Ok(("decode".into(), 1))
    );
    // Two roles whose pods could bear the name: the role must be said.
    let mut twice = self::pd();
    twice.spec.roles[1].workload = workload(WorkloadKind::StatefulSet, "decode", None);
    let err = twice.locate_pod(None, "decode-0").unwrap_err();
    assert_eq!(
        err.to_string(),
        "pod name \"decode-0\" fits roles prefill, decode of llm/pd: say which with --role"
    );
}

#[test]
fn errors_name_what_is_wrong() {
    let pa = pd();
    assert!(matches!(
        pa.resolve_env("nobody", 0),
        Err(ResolveError::NoSuchRole { .. })
    ));
    let err = pa.resolve_env("decode", 2).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pod index 2 is out of range: role \"decode\" of llm/pd has 2 pods (indices 0..1)"
    );
    let mut unallocated = pd();
    unallocated.status = None;
    let err = unallocated.resolve_env("router", 0).unwrap_err();
    assert!(
        err.to_string()
            .contains("run `kubectl portalloc sync pd -n llm`"),
        "{err}"
    );
    let mut ambiguous = pd();
    ambiguous.spec.roles[2].references[1].from = "prefill.bootstrap".into();
    let err = ambiguous.resolve_reference_at(2, 1).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "spec.roles[2].references[1].from: reference \"prefill.bootstrap\" is ambiguous"
        ),
        "{err}"
    );
    assert_eq!(
        pd().resolve_reference_at(2, 1).as_deref(),
        Ok("20010,20011")
    );
    // What describe shows uses the reference's own format and join.
    assert_eq!(
        sglang_pd().resolve_reference_at(0, 3).as_deref(),
        Ok("decode-0#0,decode-1#1")
    );
    let mut missing_group = lws();
    missing_group.status.as_mut().unwrap().assignments[0]
        .values
        .pop();
    let err = missing_group.resolve_env("worker", 2).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("port leader.dist of group 1 of PortAllocation llm/pd is not allocated"),
        "{err}"
    );
}

#[test]
fn resolve_all_covers_every_pod() {
    let all = pd().resolve_all().unwrap();
    assert_eq!(
        all.keys().collect::<Vec<_>>(),
        vec!["decode-0", "decode-1", "prefill-0", "prefill-1", "router-0"]
    );
}

#[test]
fn ports_in_a_later_copy_of_the_pool_come_with_a_warning_in_every_env_file() {
    let mut pa = pd();
    assert_eq!(pa.pool_copy(), 0);
    assert_eq!(pa.reused_ports_warning(), None);
    let first = crate::api::env_configmap(&pa, None).unwrap();
    assert!(
        first
            .data
            .as_ref()
            .unwrap()
            .values()
            .all(|text| !text.contains("warning"))
    );
    // Shards 78 and 79 of copy 1 (20001 is window 78).
    pa.status.as_mut().unwrap().shards = vec![256 + 78, 256 + 79];
    assert_eq!(pa.pool_copy(), 1);
    let warning = pa.reused_ports_warning().unwrap();
    assert!(
        warning.starts_with("the ports of PortAllocation llm/pd are in copy 1 of pool p: "),
        "{warning}"
    );
    let reused = crate::api::env_configmap(&pa, None).unwrap();
    for (file, text) in reused.data.as_ref().unwrap() {
        if file.ends_with(".env") {
            assert!(
                text.starts_with(&format!("# warning: {warning}\n")),
                "{file}: {text}"
            );
        }
    }
}

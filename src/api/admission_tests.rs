//! Tests of admission.rs: which pod a Pod object is, and the patch it gets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar as KubeEnvVar, PodSpec};

use super::super::resolve::tests::{lws, sglang_pd};
use super::*;

fn pod(name: &str, generate: &str, labels: &[(&str, &str)], own_env: &[(&str, &str)]) -> Pod {
    let container = |name: &str| Container {
        name: name.into(),
        env: (!own_env.is_empty()).then(|| {
            own_env
                .iter()
                .map(|(k, v)| KubeEnvVar {
                    name: (*k).into(),
                    value: Some((*v).into()),
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    };
    let mut pod = Pod {
        spec: Some(PodSpec {
            containers: vec![container("engine"), container("sidecar")],
            init_containers: Some(vec![container("wait")]),
            ..Default::default()
        }),
        ..Default::default()
    };
    pod.metadata.name = (!name.is_empty()).then(|| name.into());
    pod.metadata.generate_name = (!generate.is_empty()).then(|| generate.into());
    pod.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect::<BTreeMap<_, _>>(),
    );
    pod
}

/// Apply `patch` to the pod as the API server would, with kube's own JSON patch.
fn patched(pod: &Pod, patch: Vec<Value>) -> Pod {
    let mut value = serde_json::to_value(pod).unwrap();
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(patch)).unwrap();
    json_patch::patch(&mut value, &patch).unwrap();
    serde_json::from_value(value).unwrap()
}

fn env_of(container: &Container) -> Vec<(String, String)> {
    container
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

#[test]
fn a_statefulset_pod_gets_what_resolve_gives_it_in_every_container() {
    let pa = sglang_pd();
    let decode = pod("decode-1", "", &[], &[]);
    let injection = pa.pod_injection(&decode).unwrap();
    assert_eq!((injection.role.as_str(), injection.index), ("decode", 1));
    assert_eq!(injection.env, pa.resolve_env("decode", 1).unwrap());
    assert_eq!(injection.annotation(), "http=30006");
    let after = patched(&decode, pod_patch(&decode, &injection, None));
    let spec = after.spec.as_ref().unwrap();
    let expected: Vec<(String, String)> = injection
        .env
        .iter()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        assert_eq!(env_of(container), expected, "{}", container.name);
    }
    assert_eq!(
        after.metadata.annotations.unwrap()[PORTS_ANNOTATION],
        "http=30006"
    );
}

#[test]
fn a_name_the_container_sets_itself_is_never_overridden() {
    let pa = sglang_pd();
    let prefill = pod(
        "prefill-0",
        "",
        &[],
        &[("PREFILL_PORT", "9999"), ("OTHER", "x")],
    );
    let injection = pa.pod_injection(&prefill).unwrap();
    let after = patched(&prefill, pod_patch(&prefill, &injection, None));
    let env = env_of(&after.spec.unwrap().containers[0]);
    assert_eq!(env[0], ("PREFILL_PORT".into(), "9999".into()));
    assert_eq!(env[1], ("OTHER".into(), "x".into()));
    assert_eq!(env.iter().filter(|(k, _)| k == "PREFILL_PORT").count(), 1);
    assert!(
        env.contains(&("BOOTSTRAP_PORT".into(), "30002".into())),
        "{env:?}"
    );
}

#[test]
fn lws_leaders_and_workers_are_found_by_name_and_blocks_are_ranges() {
    let pa = lws();
    let leader = pa.pod_injection(&pod("sglang-1", "", &[], &[])).unwrap();
    assert_eq!((leader.role.as_str(), leader.index), ("leader", 1));
    assert_eq!(leader.annotation(), "dist=30200,nixl=31010-31013");
    let worker = pa.pod_injection(&pod("sglang-1-2", "", &[], &[])).unwrap();
    assert_eq!((worker.role.as_str(), worker.index), ("worker", 3));
    assert_eq!(worker.env, pa.resolve_env("worker", 3).unwrap());
}

#[test]
fn a_deployment_pod_is_found_before_it_has_a_name() {
    let pa = sglang_pd();
    let by_prefix = pa
        .pod_injection(&pod("", "router-7d9f8b6c4-", &[], &[]))
        .unwrap();
    assert_eq!((by_prefix.role.as_str(), by_prefix.index), ("router", 0));
    let by_label = pa
        .pod_injection(&pod("", "whatever-", &[(POD_ROLE_LABEL, "router")], &[]))
        .unwrap();
    assert_eq!(by_label.env, by_prefix.env);
    let lost = pa
        .pod_injection(&pod("", "web-", &[], &[]))
        .unwrap_err()
        .to_string();
    assert!(lost.contains(POD_ROLE_LABEL), "{lost}");
}

#[test]
fn a_pod_beyond_replicas_or_of_no_role_is_denied_with_what_to_change() {
    let pa = sglang_pd();
    let beyond = pa
        .pod_injection(&pod("decode-2", "", &[], &[]))
        .unwrap_err()
        .to_string();
    assert!(
        beyond.contains("pod decode-2 is pod 2 of role decode")
            && beyond.contains("which has 2 pods: raise the role's replicas"),
        "{beyond}"
    );
    let stranger = pa
        .pod_injection(&pod("web-0", "", &[], &[]))
        .unwrap_err()
        .to_string();
    assert!(stranger.contains("web-0"), "{stranger}");
}

#[test]
fn the_annotation_is_added_beside_existing_ones() {
    let pa = sglang_pd();
    let mut decode = pod("decode-0", "", &[], &[]);
    decode.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
    let injection = pa.pod_injection(&decode).unwrap();
    let after = patched(&decode, pod_patch(&decode, &injection, None));
    let annotations = after.metadata.annotations.unwrap();
    assert_eq!(annotations["a"], "b");
    assert_eq!(annotations[PORTS_ANNOTATION], "http=30005");
}

fn host_network(mut pod: Pod) -> Pod {
    pod.spec.as_mut().unwrap().host_network = Some(true);
    pod
}

/// (name, containerPort, hostPort, protocol) of each declared port of a container.
fn ports_of(container: &Container) -> Vec<(Option<String>, i32, Option<i32>, String)> {
    container
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone(),
                p.container_port,
                p.host_port,
                p.protocol.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn declared(
    name: Option<&str>,
    port: i32,
    protocol: &str,
) -> (Option<String>, i32, Option<i32>, String) {
    (name.map(Into::into), port, Some(port), protocol.into())
}

#[test]
fn a_host_network_pod_declares_every_port_and_block_port_on_its_first_container() {
    let pa = lws();
    let leader = host_network(pod("sglang-1", "", &[], &[]));
    let injection = pa.pod_injection(&leader).unwrap();
    let after = patched(&leader, pod_patch(&leader, &injection, Some(Protocol::Tcp)));
    let spec = after.spec.unwrap();
    assert_eq!(
        ports_of(&spec.containers[0]),
        vec![
            declared(Some("dist"), 30200, "TCP"),
            declared(Some("nixl-0"), 31010, "TCP"),
            declared(Some("nixl-1"), 31011, "TCP"),
            declared(Some("nixl-2"), 31012, "TCP"),
            declared(Some("nixl-3"), 31013, "TCP"),
        ]
    );
    // The scheduler reads every container's ports: one declaration is enough.
    assert!(spec.containers[1].ports.is_none());
    assert!(spec.init_containers.unwrap()[0].ports.is_none());
    // Declaring the ports takes nothing from the env and the annotation.
    assert_eq!(env_of(&spec.containers[1]).len(), injection.env.len());
    assert_eq!(
        after.metadata.annotations.unwrap()[PORTS_ANNOTATION],
        "dist=30200,nixl=31010-31013"
    );
}

#[test]
fn a_pod_network_pod_declares_no_port() {
    let pa = sglang_pd();
    let decode = pod("decode-0", "", &[], &[]);
    assert!(!declares_ports(&decode));
    let injection = pa.pod_injection(&decode).unwrap();
    let after = patched(&decode, pod_patch(&decode, &injection, Some(Protocol::Tcp)));
    let spec = after.spec.unwrap();
    assert!(spec.containers.iter().all(|c| c.ports.is_none()));
    // Also when hostNetwork is set to false explicitly.
    let mut off = decode.clone();
    off.spec.as_mut().unwrap().host_network = Some(false);
    assert_eq!(
        pod_patch(&off, &injection, Some(Protocol::Tcp)),
        pod_patch(&decode, &injection, None)
    );
}

#[test]
fn ports_are_in_the_pools_protocol() {
    let pa = sglang_pd();
    let decode = host_network(pod("decode-1", "", &[], &[]));
    let injection = pa.pod_injection(&decode).unwrap();
    for (protocol, text) in [(Protocol::Udp, "UDP"), (Protocol::Sctp, "SCTP")] {
        let after = patched(&decode, pod_patch(&decode, &injection, Some(protocol)));
        assert_eq!(
            ports_of(&after.spec.unwrap().containers[0]),
            vec![declared(Some("http"), 30006, text)]
        );
    }
}

fn container_port(
    name: Option<&str>,
    port: i32,
    host: Option<i32>,
    protocol: &str,
) -> ContainerPort {
    ContainerPort {
        name: name.map(Into::into),
        container_port: port,
        host_port: host,
        protocol: Some(protocol.into()),
        ..Default::default()
    }
}

#[test]
fn a_port_the_pod_declares_already_is_not_declared_again_and_names_stay_unique() {
    let pa = sglang_pd();
    let mut prefill = host_network(pod("prefill-1", "", &[], &[]));
    let spec = prefill.spec.as_mut().unwrap();
    // The engine declares its HTTP port (hostPort defaulted from containerPort on hostNetwork,
    // or not yet); the sidecar uses the name `bootstrap` for a port of its own.
    spec.containers[0].ports = Some(vec![container_port(Some("web"), 30003, None, "TCP")]);
    spec.containers[1].ports = Some(vec![container_port(
        Some("bootstrap"),
        9000,
        Some(9000),
        "TCP",
    )]);
    let injection = pa.pod_injection(&prefill).unwrap();
    assert_eq!(injection.annotation(), "http=30003,bootstrap=30004");
    let after = patched(
        &prefill,
        pod_patch(&prefill, &injection, Some(Protocol::Tcp)),
    );
    let spec = after.spec.unwrap();
    assert_eq!(
        ports_of(&spec.containers[0]),
        vec![
            (Some("web".into()), 30003, None, "TCP".into()),
            declared(None, 30004, "TCP"),
        ],
        "30003 is declared already; `bootstrap` is the sidecar's name"
    );
    assert_eq!(ports_of(&spec.containers[1]).len(), 1);
}

#[test]
fn the_same_number_in_another_protocol_is_another_port() {
    let pa = sglang_pd();
    let mut decode = host_network(pod("decode-0", "", &[], &[]));
    decode.spec.as_mut().unwrap().containers[1].ports =
        Some(vec![container_port(None, 30005, Some(30005), "UDP")]);
    let injection = pa.pod_injection(&decode).unwrap();
    let entries = declared_ports(&decode, &injection, Protocol::Tcp);
    assert_eq!(
        entries,
        vec![json!({"name": "http", "containerPort": 30005, "hostPort": 30005, "protocol": "TCP"})]
    );
    assert!(declared_ports(&decode, &injection, Protocol::Udp).is_empty());
}

#[test]
fn a_sidecars_port_counts_as_declared_a_one_shot_init_containers_does_not() {
    let pa = sglang_pd();
    let mut decode = host_network(pod("decode-0", "", &[], &[]));
    let init = &mut decode
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0];
    // Runs before the engine and exits: the scheduler does not count its ports, and the API
    // server checks them on their own.
    init.ports = Some(vec![container_port(
        Some("http"),
        30005,
        Some(30005),
        "TCP",
    )]);
    let injection = pa.pod_injection(&decode).unwrap();
    assert_eq!(
        declared_ports(&decode, &injection, Protocol::Tcp),
        vec![json!({"containerPort": 30005, "hostPort": 30005, "protocol": "TCP"})],
        "declared (without the name the init container uses)"
    );
    let init = &mut decode
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0];
    init.restart_policy = Some("Always".into());
    assert!(declared_ports(&decode, &injection, Protocol::Tcp).is_empty());
}

#[test]
fn the_default_container_annotation_chooses_where_ports_go() {
    let pa = sglang_pd();
    let mut decode = host_network(pod("decode-0", "", &[], &[]));
    decode.metadata.annotations = Some(BTreeMap::from([(
        DEFAULT_CONTAINER_ANNOTATION.to_string(),
        "sidecar".to_string(),
    )]));
    let injection = pa.pod_injection(&decode).unwrap();
    let after = patched(&decode, pod_patch(&decode, &injection, Some(Protocol::Tcp)));
    let spec = after.spec.unwrap();
    assert!(spec.containers[0].ports.is_none());
    assert_eq!(
        ports_of(&spec.containers[1]),
        vec![declared(Some("http"), 30005, "TCP")]
    );
    // A name that is no container falls back to the first.
    decode.metadata.annotations = Some(BTreeMap::from([(
        DEFAULT_CONTAINER_ANNOTATION.to_string(),
        "gone".to_string(),
    )]));
    let after = patched(&decode, pod_patch(&decode, &injection, Some(Protocol::Tcp)));
    assert_eq!(ports_of(&after.spec.unwrap().containers[0]).len(), 1);
}

#[test]
fn a_port_whose_name_cannot_be_a_port_name_is_declared_without_one() {
    let pod = host_network(pod("x-0", "", &[], &[]));
    let port = |name: &str, first: u16, count: u16| PodPort {
        name: name.into(),
        first,
        count,
    };
    let injection = PodInjection {
        role: "x".into(),
        index: 0,
        env: Vec::new(),
        ports: vec![
            port("exactly-15-char", 100, 1),
            port("sixteen-chars-xx", 101, 1),
            port("a--b", 102, 1),
            port("123", 103, 1),
            // Its ports' names would be `long-block-0`..`long-block-10`: the last too long.
            port("long-block", 200, 2),
            port("blockname-xyz", 300, 11),
        ],
    };
    let names: Vec<Option<String>> = declared_ports(&pod, &injection, Protocol::Tcp)
        .iter()
        .map(|e| e["name"].as_str().map(Into::into))
        .collect();
    let mut expected: Vec<Option<String>> = vec![
        Some("exactly-15-char".into()),
        None,
        None,
        None,
        Some("long-block-0".into()),
        Some("long-block-1".into()),
    ];
    // `blockname-xyz-9` has 15 characters, `blockname-xyz-10` 16.
    expected.extend((0..10).map(|i| Some(format!("blockname-xyz-{i}"))));
    expected.push(None);
    assert_eq!(names, expected);
}

#[test]
fn ports_are_appended_after_a_containers_own_and_the_patch_applies() {
    let pa = lws();
    let mut worker = host_network(pod("sglang-0-1", "", &[], &[]));
    worker.spec.as_mut().unwrap().containers[0].ports =
        Some(vec![container_port(Some("own"), 8080, Some(8080), "TCP")]);
    let injection = pa.pod_injection(&worker).unwrap();
    let metrics: i32 = injection.ports[0].first.into();
    let after = patched(&worker, pod_patch(&worker, &injection, Some(Protocol::Tcp)));
    assert_eq!(
        ports_of(&after.spec.unwrap().containers[0]),
        vec![
            (Some("own".into()), 8080, Some(8080), "TCP".into()),
            declared(Some("metrics"), metrics, "TCP"),
        ]
    );
}

//! Tests of admission.rs: which pod a Pod object is, and the patch it gets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar as KubeEnvVar, PodSpec};

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
    assert_eq!(injection.ports, "http=30006");
    let after = patched(&decode, pod_patch(&decode, &injection));
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
    let after = patched(&prefill, pod_patch(&prefill, &injection));
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
    assert_eq!(leader.ports, "dist=30200,nixl=31010-31013");
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
    let lost = pa.pod_injection(&pod("", "web-", &[], &[])).unwrap_err();
    assert!(lost.contains(POD_ROLE_LABEL), "{lost}");
}

#[test]
fn a_pod_beyond_replicas_or_of_no_role_is_denied_with_what_to_change() {
    let pa = sglang_pd();
    let beyond = pa
        .pod_injection(&pod("decode-2", "", &[], &[]))
        .unwrap_err();
    assert!(
        beyond.contains("pod decode-2 is pod 2 of role decode")
            && beyond.contains("which has 2 pods: raise the role's replicas"),
        "{beyond}"
    );
    let stranger = pa.pod_injection(&pod("web-0", "", &[], &[])).unwrap_err();
    assert!(stranger.contains("web-0"), "{stranger}");
}

#[test]
fn the_annotation_is_added_beside_existing_ones() {
    let pa = sglang_pd();
    let mut decode = pod("decode-0", "", &[], &[]);
    decode.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
    let injection = pa.pod_injection(&decode).unwrap();
    let after = patched(&decode, pod_patch(&decode, &injection));
    let annotations = after.metadata.annotations.unwrap();
    assert_eq!(annotations["a"], "b");
    assert_eq!(annotations[PORTS_ANNOTATION], "http=30005");
}

use super::*;

use serde_json::json;

fn rbg() -> Value {
    let leader = json!({"allocations": [{"name": "grpc", "env": "LEADER_PORT", "annotationKey": "x/grpc", "scope": "PodScoped"}]});
    let worker = json!({
        "allocations": [
            {"name": "rpc", "env": "WORKER_PORT", "scope": "PodScoped"},
            {"name": "shared", "env": "SHARED_PORT", "policy": "Static"}
        ],
        "references": [{"env": "LEADER_ADDR_PORT", "from": "leader.grpc"}]
    });
    json!({
        "apiVersion": "workloads.x-k8s.io/v1alpha1",
        "kind": "RoleBasedGroup",
        "metadata": {"name": "group", "namespace": "llm"},
        "spec": {"roles": [
            {"name": "leader", "replicas": 2, "template": {"metadata": {"annotations": {RBG_ANNOTATION: leader.to_string()}}}},
            {"name": "worker", "replicas": 3, "template": {"metadata": {"annotations": {RBG_ANNOTATION: worker.to_string()}}}},
            {"name": "router", "replicas": 1, "template": {"spec": {}}}
        ]}
    })
}

#[test]
fn converts_roles_scopes_and_references() {
    let imported = import_rbg(&rbg(), "default").unwrap();
    let spec = &imported.allocation.spec;
    assert_eq!(
        imported.allocation.metadata.namespace.as_deref(),
        Some("llm")
    );
    assert_eq!(spec.pool, "default");
    assert_eq!(spec.roles.len(), 3);
    assert_eq!(spec.roles[0].ports[0].scope, PortScope::PodScoped);
    assert_eq!(
        spec.roles[1].ports[1].scope,
        PortScope::RoleScoped,
        "policy Static is RoleScoped"
    );
    assert_eq!(spec.roles[1].replicas, 3);
    assert_eq!(
        spec.roles[1].references[0].from, "leader.grpc[0]",
        "RBG resolves from pod 0"
    );
    assert!(spec.roles[2].ports.is_empty());
    assert!(
        imported
            .notes
            .iter()
            .any(|n| n.contains("annotationKey \"x/grpc\""))
    );
}

/// `rbg()` with the worker role's port-allocator annotation set to `value`.
fn rbg_with_worker_annotation(value: Value) -> Value {
    let mut object = rbg();
    object["spec"]["roles"][1]["template"]["metadata"]["annotations"][RBG_ANNOTATION] = value;
    object
}

#[test]
fn bad_annotations_name_the_field() {
    let at = format!("spec.roles[1].template.metadata.annotations[{RBG_ANNOTATION}]");
    let nobody = json!({"references": [{"env": "X", "from": "nobody.port"}]});
    let cases = [
        (
            rbg_with_worker_annotation(json!("{not json")),
            at.clone(),
            "not valid port-allocator JSON",
        ),
        (
            rbg_with_worker_annotation(json!(nobody.to_string())),
            format!("{at}.references[0].from"),
            "names role \"nobody\"",
        ),
        (
            json!({"kind": "Pod", "metadata": {"name": "x"}, "spec": {}}),
            "spec.roles".into(),
            "is this a RoleBasedGroup",
        ),
    ];
    check_bad(cases);
}

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/rbg/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn role<'a>(imported: &'a Imported, name: &str) -> &'a Role {
    let roles = &imported.allocation.spec.roles;
    roles
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no role {name} in {roles:?}"))
}

fn reference(role: &Role, env: &str) -> String {
    role.references
        .iter()
        .find(|r| r.env == env)
        .unwrap_or_else(|| panic!("no reference {env} in {role:?}"))
        .from
        .clone()
}

fn has_note(imported: &Imported, needle: &str) -> bool {
    imported.notes.iter().any(|n| n.contains(needle))
}

#[test]
fn v1alpha2_standalone_keeps_the_role_name() {
    let imported = import_rbg(&fixture("v1alpha2-pd.yaml"), "p").unwrap();
    let router = role(&imported, "router");
    assert_eq!(router.replicas, 1);
    assert_eq!(router.ports[0].name, "http");
    assert_eq!(router.ports[0].scope, PortScope::RoleScoped);
    assert!(
        has_note(
            &imported,
            "spec.roles[0].annotations[rbg.workloads.x-k8s.io/role-workload-type]"
        ),
        "{:?}",
        imported.notes
    );
    assert!(
        has_note(
            &imported,
            "metadata.annotations[rbg.workloads.x-k8s.io/group-note]"
        ),
        "{:?}",
        imported.notes
    );
}

#[test]
fn v1alpha2_custom_components_with_discovery() {
    let imported = import_rbg(&fixture("v1alpha2-pd.yaml"), "p").unwrap();
    let leader = role(&imported, "prefill-leader");
    let worker = role(&imported, "prefill-worker");
    assert_eq!((leader.replicas, worker.replicas), (1, 2));
    assert_eq!(leader.ports.len(), 2);
    assert_eq!(reference(worker, "LEADER_PORT"), "prefill-leader.grpc");
    assert_eq!(
        reference(worker, "LEADER_BOOTSTRAP"),
        "prefill-leader.bootstrap",
        "a RoleScoped portRef"
    );
    assert_eq!(
        reference(worker, "WORKER_1_GRPC_PORT"),
        "prefill-worker.grpc[1]",
        "portRef index picks the pod"
    );
    assert!(
        has_note(&imported, "addressRef LEADER_ADDR"),
        "{:?}",
        imported.notes
    );
    assert!(
        has_note(&imported, "component-discovery].addressRefs[0]"),
        "the note names the field: {:?}",
        imported.notes
    );
}

#[test]
fn v1alpha2_leader_worker_pattern_splits_leader_and_workers() {
    let imported = import_rbg(&fixture("v1alpha2-pd.yaml"), "p").unwrap();
    let leader = role(&imported, "decode-leader");
    let worker = role(&imported, "decode-worker");
    assert_eq!(leader.replicas, 2, "one leader per group");
    assert_eq!(worker.replicas, 4, "2 groups of size 3: 2 workers each");
    assert!(leader.references.is_empty(), "the patch is the worker's");
    assert_eq!(
        reference(worker, "LEADER_DIST_PORT"),
        "decode-leader.dist[0]"
    );
    assert!(has_note(
        &imported,
        "leaderWorkerPattern with 2 group(s) of 3 pod(s)"
    ));
    assert!(
        has_note(&imported, "has 2 instances") && has_note(&imported, "LEADER_DIST_PORT"),
        "{:?}",
        imported.notes
    );
    assert!(imported.allocation.spec.validate().is_ok());
}

#[test]
fn v1alpha2_template_ref_and_one_pod_groups() {
    let annotation = json!({"allocations": [{"name": "dist", "env": "DIST_PORT"}]}).to_string();
    let object = json!({
        "apiVersion": "workloads.x-k8s.io/v1alpha2",
        "kind": "RoleBasedGroup",
        "metadata": {"name": "g"},
        "spec": {
            "roleTemplates": [{"name": "base", "template": {"metadata": {"annotations": {RBG_ANNOTATION: annotation}}}}],
            "roles": [{"name": "solo", "replicas": 3, "leaderWorkerPattern": {"templateRef": {"name": "base"}}}]
        }
    });
    let imported = import_rbg(&object, "p").unwrap();
    let roles = &imported.allocation.spec.roles;
    assert_eq!(roles.len(), 1, "size 1 runs no workers: {roles:?}");
    assert_eq!(
        (roles[0].name.as_str(), roles[0].replicas),
        ("solo-leader", 3)
    );
    assert_eq!(roles[0].ports[0].env, "DIST_PORT");
}

#[test]
fn v1alpha1_leader_worker_set_and_components_convert_like_v1alpha2() {
    let leader =
        json!({"allocations": [{"name": "rpc", "env": "RPC", "policy": "Dynamic"}]}).to_string();
    let worker = json!({"allocations": [{"name": "rpc", "env": "RPC"}], "references": [{"env": "HEAD", "from": "lws.leader.rpc"}]}).to_string();
    let object = json!({
        "apiVersion": "workloads.x-k8s.io/v1alpha1",
        "kind": "RoleBasedGroup",
        "metadata": {"name": "g"},
        "spec": {"roles": [
            {"name": "lws", "replicas": 1,
             "template": {"metadata": {"annotations": {RBG_ANNOTATION: leader}}},
             "leaderWorkerSet": {"size": 4, "patchWorkerTemplate": {"metadata": {"annotations": {RBG_ANNOTATION: worker}}}}},
            {"name": "pd", "replicas": 2, "components": [
                {"name": "a", "size": 2, "template": {"metadata": {"annotations": {RBG_ANNOTATION: json!({"allocations": [{"name": "p", "env": "P"}]}).to_string()}}}}
            ]}
        ]}
    });
    let imported = import_rbg(&object, "p").unwrap();
    assert_eq!(role(&imported, "lws-worker").replicas, 3);
    assert_eq!(
        reference(role(&imported, "lws-worker"), "HEAD"),
        "lws-leader.rpc"
    );
    assert_eq!(role(&imported, "pd-a").replicas, 4);
}

fn bad(object: &Value) -> ImportError {
    let err = import_rbg(object, "p").unwrap_err();
    assert!(!err.to_string().contains('\n'), "one line: {err}");
    err
}

/// Each object is refused on one line, naming the field and saying the fragment.
fn check_bad<const N: usize>(cases: [(Value, String, &str); N]) {
    for (object, field, says) in cases {
        let err = bad(&object);
        assert_eq!(err.field, field, "{err}");
        assert!(err.message.contains(says), "{err}");
    }
}

fn set_worker_annotation(object: &mut Value, key: &str, value: Value) {
    object["spec"]["roles"][1]["customComponentsPattern"]["components"][1]["annotations"][key] =
        json!(value.to_string());
}

/// `v1alpha2-pd.yaml` with `edit` applied.
fn pd_with(edit: impl FnOnce(&mut Value)) -> Value {
    let mut object = fixture("v1alpha2-pd.yaml");
    edit(&mut object);
    object
}

/// `v1alpha2-pd.yaml` with the worker component's annotation `key` set to `value` (as JSON
/// text).
fn pd_worker_annotation(key: &str, value: Value) -> Value {
    pd_with(|object| set_worker_annotation(object, key, value))
}

#[test]
fn v1alpha2_bad_inputs_name_the_field_path() {
    let worker_at = "spec.roles[1].customComponentsPattern.components[1].annotations";
    let allocator = format!("{worker_at}[{RBG_ANNOTATION}]");
    let discovery = format!("{worker_at}[{RBG_DISCOVERY_ANNOTATION}]");
    let cases = [
        (
            fixture("v1alpha2-bad-reference.yaml"),
            format!(
                "spec.roles[0].customComponentsPattern.components[1].annotations[{RBG_ANNOTATION}].references[0].from"
            ),
            "names component \"head\"",
        ),
        (
            pd_with(|object| {
                object["spec"]["roles"][1]["customComponentsPattern"]["components"][1]["annotations"]
                    [RBG_ANNOTATION] = json!("{\"allocations\": [");
            }),
            allocator.clone(),
            "not valid port-allocator JSON",
        ),
        (
            pd_worker_annotation(
                RBG_ANNOTATION,
                json!({"allocations": [{"name": "a", "env": "A"}, {"name": "b", "env": "B"}, {"name": "c", "env": "C", "scope": "Cluster"}]}),
            ),
            format!("{allocator}.allocations[2].scope"),
            "is not PodScoped or RoleScoped",
        ),
        (
            pd_worker_annotation(
                RBG_ANNOTATION,
                json!({"allocations": [{"name": "grpc", "env": "WORKER_GRPC_PORT"}], "references": [{"env": "X", "from": "nobody.leader.grpc"}]}),
            ),
            format!("{allocator}.references[0].from"),
            "names role \"nobody\"",
        ),
        (
            pd_worker_annotation(
                RBG_ANNOTATION,
                json!({"allocations": [{"name": "grpc", "env": "WORKER_GRPC_PORT"}], "references": [{"env": "X", "from": "leader.grpc"}]}),
            ),
            format!("{allocator}.references[0].from"),
            "<role>.<component>.<port>",
        ),
        (
            pd_worker_annotation(
                RBG_DISCOVERY_ANNOTATION,
                json!({"portRefs": [{"env": "X", "component": "leader", "portName": "grpc", "index": 1}]}),
            ),
            format!("{discovery}.portRefs[0].index"),
            "pod 1 of component \"leader\" does not exist",
        ),
        (
            pd_worker_annotation(
                RBG_DISCOVERY_ANNOTATION,
                json!({"addressRefs": [{"env": "X", "component": "ghost"}]}),
            ),
            format!("{discovery}.addressRefs[0].component"),
            "names component \"ghost\"",
        ),
        (
            pd_worker_annotation(
                RBG_DISCOVERY_ANNOTATION,
                json!({"portRefs": [{"env": "X", "component": "leader", "portName": "nope"}]}),
            ),
            format!("{discovery}.portRefs[0]"),
            "names port \"nope\"",
        ),
        (
            pd_with(|object| object["spec"]["roles"][2]["leaderWorkerPattern"]["size"] = json!(0)),
            "spec.roles[2].leaderWorkerPattern.size".into(),
            "is not an integer of at least 1",
        ),
        (
            pd_with(|object| {
                object["spec"]["roles"][0]["leaderWorkerPattern"] = json!({"size": 2})
            }),
            "spec.roles[0]".into(),
            "exactly one pattern",
        ),
        (
            pd_with(|object| {
                object["spec"]["roles"][0]["standalonePattern"] =
                    json!({"templateRef": {"name": "missing"}});
            }),
            "spec.roles[0].standalonePattern.templateRef.name".into(),
            "names role template \"missing\"",
        ),
    ];
    check_bad(cases);
}

#[test]
fn v1alpha2_reference_to_a_role_scoped_port_is_translated_with_a_note() {
    let mut object = fixture("v1alpha2-pd.yaml");
    set_worker_annotation(
        &mut object,
        RBG_ANNOTATION,
        json!({"allocations": [{"name": "grpc", "env": "WORKER_GRPC_PORT"}], "references": [{"env": "BOOT", "from": "prefill.leader.bootstrap"}]}),
    );
    let imported = import_rbg(&object, "p").unwrap();
    let worker = role(&imported, "prefill-worker");
    assert_eq!(reference(worker, "BOOT"), "prefill-leader.bootstrap");
    assert!(
        has_note(
            &imported,
            "BOOT names RoleScoped port prefill-leader.bootstrap"
        ),
        "{:?}",
        imported.notes
    );
    assert!(
        !has_note(&imported, "has 1 instances"),
        "one instance needs no group note: {:?}",
        imported.notes
    );
}

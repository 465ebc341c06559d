//! The CRDs install, valid manifests are accepted, and the API server itself rejects invalid
//! ones with a message that names the field (so GitOps users see errors at `kubectl apply`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::{Client, Resource};
use portalloc::api::{PortAllocation, PortPool};
use serde_json::{Value, json};

use crate::support;

fn resource_of(kind: &str) -> ApiResource {
    match kind {
        "PortPool" => ApiResource::erase::<PortPool>(&()),
        "PortAllocation" => ApiResource::erase::<PortAllocation>(&()),
        other => panic!("unexpected kind {other}"),
    }
}

/// Create a manifest as raw JSON, so the API server (not our types) judges it.
async fn create_raw(client: &Client, namespace: &str, manifest: Value) -> Result<(), String> {
    let kind = manifest["kind"].as_str().unwrap().to_string();
    let resource = resource_of(&kind);
    let object: DynamicObject = serde_json::from_value(manifest).unwrap();
    let api: Api<DynamicObject> = if kind == "PortPool" {
        Api::all_with(client.clone(), &resource)
    } else {
        Api::namespaced_with(client.clone(), namespace, &resource)
    };
    api.create(&PostParams::default(), &object)
        .await
        .map(|_| ())
        .map_err(|e| match e {
            kube::Error::Api(status) => format!("{} ({})", status.message, status.reason),
            other => panic!("transport error, not a validation answer: {other}"),
        })
}

fn pool(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "portalloc.dev/v1alpha1", "kind": "PortPool", "metadata": {"name": name}, "spec": spec})
}

fn allocation(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "portalloc.dev/v1alpha1", "kind": "PortAllocation", "metadata": {"name": name}, "spec": spec})
}

fn one_role(role: Value) -> Value {
    json!({"pool": "default", "roles": [role]})
}

#[tokio::test]
async fn crds_are_established_with_short_names_and_categories() {
    let client = support::client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    for (name, short) in [
        ("portpools.portalloc.dev", "ppool"),
        ("portallocations.portalloc.dev", "palloc"),
    ] {
        let crd = crds.get(name).await.expect("CRD installed");
        let established = crd
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        assert!(established, "{name} is not Established");
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_string()]));
        assert_eq!(
            crd.spec.names.categories,
            Some(vec!["portalloc".to_string()])
        );
        let version = &crd.spec.versions[0];
        assert!(version.subresources.as_ref().unwrap().status.is_some());
    }
    assert_eq!(PortPool::group(&()), "portalloc.dev");
}

#[tokio::test]
async fn valid_manifests_are_accepted() {
    let client = support::client().await;
    let ns = support::namespace(&client, "valid").await;
    let p = support::unique_name("valid");
    // allowOverlap: these pools stay in the cluster every test shares, where another test's
    // repair would otherwise report them as sharing its pool's ports.
    let manifests = [
        pool(
            &format!("{p}-a"),
            json!({"ranges": ["30000-32767"], "exclude": ["30500", "31000-31010"], "allowOverlap": true}),
        ),
        pool(
            &format!("{p}-b"),
            json!({"ranges": ["40000-40099", "40200"], "protocol": "UDP", "staticBand": 16, "allowOverlap": true}),
        ),
        pool(
            &format!("{p}-c"),
            json!({"ranges": ["1-65535"], "protocol": "SCTP", "staticBand": "None", "allowOverlap": true}),
        ),
        allocation(
            "sglang-pd",
            json!({"pool": "default", "roles": [
                {"name": "router", "replicas": 1, "ports": [{"name": "http", "scope": "RoleScoped", "env": "ROUTER_PORT"}]},
                {"name": "prefill", "replicas": 2, "ports": [
                    {"name": "http", "scope": "PodScoped", "env": "PREFILL_PORT"},
                    {"name": "bootstrap", "scope": "PodScoped", "env": "BOOTSTRAP_PORT"}],
                 "references": [{"env": "ROUTER_PORT", "from": "router.http"}]},
                {"name": "decode", "replicas": 3, "ports": [
                    {"name": "http", "scope": "PodScoped", "env": "DECODE_PORT"},
                    {"name": "metrics", "scope": "RoleScoped", "env": "METRICS_PORT", "port": 30009}],
                 "references": [
                    {"env": "ROUTER_PORT", "from": "router.http"},
                    {"env": "PREFILL_BOOTSTRAP_PORTS", "from": "prefill.bootstrap[*]"},
                    {"env": "FIRST_PREFILL", "from": "prefill.http[0]"}]}
            ]}),
        ),
        allocation(
            "scaled-to-zero",
            one_role(
                json!({"name": "worker", "replicas": 0, "ports": [{"name": "rpc", "env": "RPC_PORT"}]}),
            ),
        ),
    ];
    for manifest in manifests {
        let name = manifest["metadata"]["name"].clone();
        if let Err(e) = create_raw(&client, &ns, manifest).await {
            panic!("valid manifest {name} was rejected: {e}");
        }
    }
}

/// Each case breaks exactly one rule; the server's message must name the field and the rule.
#[tokio::test]
async fn invalid_manifests_are_rejected_by_the_api_server() {
    let client = support::client().await;
    let ns = support::namespace(&client, "invalid").await;
    let p = support::unique_name("bad");
    let role = |extra: Value| {
        let mut role =
            json!({"name": "worker", "replicas": 2, "ports": [{"name": "rpc", "env": "RPC_PORT"}]});
        role.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        role
    };
    let cases: Vec<(&str, Value, &[&str])> = vec![
        (
            "range out of order",
            pool(&format!("{p}-1"), json!({"ranges": ["32767-30000"]})),
            &["spec.ranges[0]", "first port must not exceed the last"],
        ),
        (
            "port above 65535",
            pool(&format!("{p}-2"), json!({"ranges": ["70000"]})),
            &["spec.ranges[0]", "within 1..65535"],
        ),
        (
            "port zero",
            pool(&format!("{p}-3"), json!({"ranges": ["0-100"]})),
            &["spec.ranges[0]", "within 1..65535"],
        ),
        (
            "range syntax",
            pool(&format!("{p}-4"), json!({"ranges": ["30000:31000"]})),
            &[
                "spec.ranges[0]",
                "must be a port \"A\" or an inclusive range",
            ],
        ),
        (
            "exclusion outside the ranges",
            pool(
                &format!("{p}-5"),
                json!({"ranges": ["30000-30100"], "exclude": ["40000"]}),
            ),
            &[
                "spec.exclude",
                "every exclusion must lie inside one of spec.ranges",
            ],
        ),
        (
            "overlapping ranges",
            pool(
                &format!("{p}-6"),
                json!({"ranges": ["30000-30100", "30050-30200"]}),
            ),
            &["spec.ranges", "must not overlap"],
        ),
        (
            "duplicate range",
            pool(
                &format!("{p}-7"),
                json!({"ranges": ["30000-30100", "30000-30100"]}),
            ),
            &["spec.ranges[1]", "Duplicate value"],
        ),
        (
            "no ranges",
            pool(&format!("{p}-8"), json!({"ranges": []})),
            &["spec.ranges", "at least 1"],
        ),
        (
            "unknown protocol",
            pool(
                &format!("{p}-9"),
                json!({"ranges": ["30000"], "protocol": "HTTP"}),
            ),
            &["spec.protocol", "supported values"],
        ),
        (
            "bad static band",
            pool(
                &format!("{p}-10"),
                json!({"ranges": ["30000"], "staticBand": "Lots"}),
            ),
            &["spec.staticBand", "must be Auto, None, or a port count"],
        ),
        (
            "a guard on an SCTP pool, whose binds no cgroup bind hook sees",
            pool(
                &format!("{p}-11"),
                json!({"ranges": ["30000"], "protocol": "SCTP", "guard": "Audit"}),
            ),
            &[
                "spec.guard",
                "sctp_bind, which runs no cgroup bind4/bind6 hook",
            ],
        ),
        (
            "unknown scope",
            allocation(
                "scope",
                one_role(role(
                    json!({"ports": [{"name": "rpc", "scope": "NodeScoped", "env": "RPC_PORT"}]}),
                )),
            ),
            &["spec.roles[0].ports[0].scope", "supported values"],
        ),
        (
            "requested port above 65535",
            allocation(
                "port",
                one_role(role(
                    json!({"ports": [{"name": "rpc", "scope": "RoleScoped", "env": "RPC_PORT", "port": 70000}]}),
                )),
            ),
            &["spec.roles[0].ports[0].port", "65535"],
        ),
        (
            "replicas above the bound",
            allocation("replicas-high", one_role(role(json!({"replicas": 5000})))),
            &["spec.roles[0].replicas", "1024"],
        ),
        (
            "negative replicas",
            allocation("replicas-low", one_role(role(json!({"replicas": -1})))),
            &["spec.roles[0].replicas", "greater than or equal to 0"],
        ),
        (
            "duplicate role names",
            allocation(
                "dup-role",
                json!({"pool": "default", "roles": [role(json!({})), role(json!({}))]}),
            ),
            &["spec.roles[1]", "Duplicate value"],
        ),
        (
            "duplicate port names",
            allocation(
                "dup-port",
                one_role(role(
                    json!({"ports": [{"name": "rpc", "env": "A"}, {"name": "rpc", "env": "B"}]}),
                )),
            ),
            &["spec.roles[0].ports[1]", "Duplicate value"],
        ),
        (
            "reference with an empty port name",
            allocation(
                "ref-short",
                one_role(role(
                    json!({"references": [{"env": "LEADER", "from": "leader."}]}),
                )),
            ),
            &[
                "spec.roles[0].references[0].from",
                "must be role.port, role.port[i], role.port[*], role, role[i] or role[*]",
            ],
        ),
        (
            "reference with a bad index",
            allocation(
                "ref-index",
                one_role(role(
                    json!({"references": [{"env": "LEADER", "from": "leader.http[x]"}]}),
                )),
            ),
            &[
                "spec.roles[0].references[0].from",
                "must be role.port, role.port[i], role.port[*], role, role[i] or role[*]",
            ],
        ),
        (
            "format on a port reference",
            allocation(
                "ref-format",
                one_role(role(
                    json!({"references": [{"env": "L", "from": "leader.http", "format": "{address}"}]}),
                )),
            ),
            &[
                "spec.roles[0].references[0].format",
                "format applies to pod references",
            ],
        ),
        (
            "LeaderWorkerSet role without member",
            allocation(
                "lws-member",
                one_role(role(
                    json!({"workload": {"kind": "LeaderWorkerSet", "name": "sglang"}}),
                )),
            ),
            &[
                "spec.roles[0].workload.member",
                "member (Leader or Workers) is required",
            ],
        ),
        (
            "port block too large",
            allocation(
                "block",
                one_role(role(
                    json!({"ports": [{"name": "w", "env": "W", "count": 5000}]}),
                )),
            ),
            &["spec.roles[0].ports[0].count", "1024"],
        ),
        (
            "role name with capitals",
            allocation("role-name", one_role(role(json!({"name": "Prefill"})))),
            &["spec.roles[0].name", "should match"],
        ),
        (
            "env name starting with a digit",
            allocation(
                "env-name",
                one_role(role(json!({"ports": [{"name": "rpc", "env": "1PORT"}]}))),
            ),
            &["spec.roles[0].ports[0].env", "should match"],
        ),
        (
            "requested port on a PodScoped port",
            allocation(
                "pod-fixed",
                one_role(role(
                    json!({"ports": [{"name": "rpc", "scope": "PodScoped", "env": "RPC_PORT", "port": 30009}]}),
                )),
            ),
            &[
                "spec.roles[0].ports[0].port",
                "a requested port must be RoleScoped",
            ],
        ),
        (
            "env name on two ports of a role",
            allocation(
                "env-dup-ports",
                one_role(role(json!({
                "ports": [{"name": "rpc", "env": "PORT"}, {"name": "http", "env": "PORT"}]}))),
            ),
            &["spec.roles[0]", "env names must be unique within a role"],
        ),
        (
            "env name used twice in a role",
            allocation(
                "env-dup",
                one_role(role(json!({
                "ports": [{"name": "rpc", "env": "PORT"}],
                "references": [{"env": "PORT", "from": "leader.http"}]}))),
            ),
            &["spec.roles[0]", "env names must be unique within a role"],
        ),
        (
            "no roles",
            allocation("no-roles", json!({"pool": "default", "roles": []})),
            &["spec.roles", "at least 1"],
        ),
    ];
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for (what, manifest, expected) in cases {
        match create_raw(&client, &ns, manifest).await {
            Ok(()) => failures.push(format!("{what}: accepted, but must be rejected")),
            Err(message) => {
                for needle in expected {
                    if !message.contains(needle) {
                        failures.push(format!("{what}: message lacks {needle:?}: {message}"));
                    }
                }
                if !message.contains("(Invalid)") {
                    failures.push(format!("{what}: not rejected as Invalid: {message}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn pool_of_an_allocation_is_immutable() {
    let client = support::client().await;
    let ns = support::namespace(&client, "immutable").await;
    let manifest = allocation(
        "moving",
        one_role(
            json!({"name": "worker", "replicas": 1, "ports": [{"name": "rpc", "env": "RPC_PORT"}]}),
        ),
    );
    create_raw(&client, &ns, manifest).await.unwrap();
    let api: Api<PortAllocation> = Api::namespaced(client, &ns);
    let mut object = api.get("moving").await.unwrap();
    object.spec.pool = "elsewhere".into();
    let err = api
        .replace("moving", &PostParams::default(), &object)
        .await
        .expect_err("changing spec.pool must be rejected");
    let message = err.to_string();
    assert!(message.contains("spec.pool is immutable"), "{message}");
}

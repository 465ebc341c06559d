//! Each node agent writes only its own node's Lease, enforced by the API server: the shipped
//! deploy/node-agent objects (ServiceAccount, RBAC and the policy `portalloc-node-agent-lease`)
//! applied to a control plane of its own, and two agents' real tokens from the TokenRequest API,
//! each bound to a pod on its node (node-a, node-b), as a kubelet mounts them. Agent A writes its
//! Lease with the agent's own code and is refused, with the policy's message, on node B's Lease,
//! on the watcher's leader Lease `portalloc-watcher` and on a Lease that names another node.
//! Then `pool describe` reads reports only from `--node-agent-namespace` (default
//! portalloc-node-agent, the agent's own namespace), and only a Lease under its node's name.
//!
//! A control plane of its own: the policy is cluster-wide, and the Nodes this test makes would
//! be seen by the tests that schedule.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, SelfSubjectReview, TokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use serde::Deserialize;

use portalloc::api::GuardMode;
use portalloc::k8s::node_agent::publish;
use portalloc::ledger::node_report::{
    NODE_AGENT_LABEL, NODE_AGENT_NAMESPACE, NodeReport, lease_name,
};

use crate::support::private_cluster::{PrivateCluster, client_from};
use crate::support::{apply, repo_root};

const NAMESPACE: &str = NODE_AGENT_NAMESPACE;
const AGENT: &str = "portalloc-node-agent";
const LEASE_FOR: Duration = Duration::from_secs(90);

/// Every object of deploy/node-agent/node-agent.yaml but the DaemonSet (no kubelet runs here).
pub(crate) async fn apply_shipped_agent(client: &Client) {
    let text = std::fs::read_to_string(repo_root().join("deploy/node-agent/node-agent.yaml"))
        .expect("deploy/node-agent/node-agent.yaml");
    let mut kinds = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document).unwrap();
        let value = serde_json::to_value(value).unwrap();
        let kind = value["kind"].as_str().unwrap().to_string();
        if kind != "DaemonSet" {
            apply::apply_value(client, value, Some(NAMESPACE)).await;
        }
        kinds.push(kind);
    }
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} in {kinds:?}");
    }
}

/// Node `node` and the agent's pod on it; a kubeconfig (written under `dir`) with a token of
/// the agent's ServiceAccount bound to that pod, as the kubelet mounts it.
pub(crate) async fn agent_on(client: &Client, kubeconfig: &Path, dir: &Path, node: &str) -> Client {
    let nodes: Api<Node> = Api::all(client.clone());
    let object: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": node}})).unwrap();
    nodes.create(&PostParams::default(), &object).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("agent-{node}")},
        "spec": {
            "nodeName": node,
            "serviceAccountName": AGENT,
            "containers": [{"name": "node-agent", "image": "registry.k8s.io/pause:3.10"}],
        }
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let token = accounts
        .create_token_request(AGENT, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let path: PathBuf = dir.join(format!("agent-{node}.kubeconfig"));
    crate::support::service_account::token_kubeconfig(kubeconfig, &token, NAMESPACE, &path);
    client_from(&path, None).await
}

/// What the API server knows of the caller: (user name, the node-name extra).
async fn who_am_i(client: &Client) -> (String, Option<Vec<String>>) {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let user = review.status.unwrap().user_info.unwrap();
    let node = user
        .extra
        .and_then(|extra| extra.get("authentication.kubernetes.io/node-name").cloned());
    (user.username.unwrap_or_default(), node)
}

fn report(node: &str, pool: &str) -> NodeReport {
    NodeReport {
        node: node.into(),
        guard_unavailable: None,
        pools: [(pool.to_string(), GuardMode::Audit)].into(),
        reserved: 10,
        conflicts: vec![],
    }
}

/// The API server's refusal of `client` writing `report` as the agent does; `None` if written.
async fn refusal(client: &Client, report: &NodeReport) -> Option<String> {
    publish(client, NAMESPACE, report, LEASE_FOR)
        .await
        .err()
        .map(|e| e.to_string())
}

#[tokio::test]
async fn an_agent_writes_only_its_own_nodes_lease() {
    let Some(cluster) = PrivateCluster::start("node-agent-lease", true) else {
        return;
    };
    let admin = cluster.client().await;
    crate::support::create_namespace(&admin, NAMESPACE).await;
    apply_shipped_agent(&admin).await;
    let dir = tempfile::tempdir().unwrap();
    let agent_a = agent_on(&admin, &cluster.kubeconfig, dir.path(), "node-a").await;
    let agent_b = agent_on(&admin, &cluster.kubeconfig, dir.path(), "node-b").await;

    // The tokens carry the node their pod is bound to.
    let (user, node) = who_am_i(&agent_a).await;
    assert_eq!(user, format!("system:serviceaccount:{NAMESPACE}:{AGENT}"));
    assert_eq!(node, Some(vec!["node-a".to_string()]), "node-name extra");

    // The watcher's leader Lease, written by the watcher (here the admin: not the agent).
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let watcher = Lease {
        metadata: ObjectMeta {
            name: Some("portalloc-watcher".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("watcher-0".into()),
            ..LeaseSpec::default()
        }),
    };
    leases
        .create(&PostParams::default(), &watcher)
        .await
        .unwrap();

    // The policy reaches the admission plugin through an informer, a moment after it is
    // written: agent A writes node B's Lease until refused, each accepted write undone.
    let started = Instant::now();
    let refused = loop {
        if let Some(message) = refusal(&agent_a, &report("node-b", "leased")).await {
            break message;
        }
        leases
            .delete(&lease_name("node-b"), &DeleteParams::default())
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the API server never refused agent A's write of node B's Lease"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        refused.contains(
            "the node agent on node node-a may write only its own node's Lease, not \
             portalloc-node-node-b"
        ),
        "{refused}"
    );

    // Each agent writes its own, created then updated (the agent's own code).
    for (client, node) in [(&agent_a, "node-a"), (&agent_b, "node-b")] {
        for round in 0..2 {
            assert_eq!(
                refusal(client, &report(node, "leased")).await,
                None,
                "{node}, write {round}"
            );
        }
    }

    // Node B's existing Lease: A's update is refused, and B's report stays.
    let refused = refusal(&agent_a, &report("node-b", "other")).await;
    assert!(
        refused
            .as_deref()
            .is_some_and(|m| m.contains("may write only its own node's Lease")),
        "{refused:?}"
    );
    let b = leases.get(&lease_name("node-b")).await.unwrap();
    assert_eq!(
        b.metadata.annotations.unwrap()["portalloc.dev/guarded-pools"],
        "leased=Audit"
    );

    // The watcher's leader Lease: A may not take it over.
    let a_leases: Api<Lease> = Api::namespaced(agent_a.clone(), NAMESPACE);
    let mut taken = a_leases.get("portalloc-watcher").await.unwrap();
    taken.spec.as_mut().unwrap().holder_identity = Some("node-a".into());
    let refused = a_leases
        .replace("portalloc-watcher", &PostParams::default(), &taken)
        .await
        .expect_err("agent A took the watcher's Lease over");
    assert!(
        refused
            .to_string()
            .contains("may write only its own node's Lease, not portalloc-watcher"),
        "{refused}"
    );
    assert_eq!(
        leases
            .get("portalloc-watcher")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity,
        Some("watcher-0".into())
    );

    // Its own Lease's name with a report that names node B: refused too.
    let lying = report("node-b", "leased");
    let mut lease = a_leases.get(&lease_name("node-a")).await.unwrap();
    lease.metadata.annotations = Some(lying.annotations());
    let refused = a_leases
        .replace(&lease_name("node-a"), &PostParams::default(), &lease)
        .await
        .expect_err("agent A's Lease naming node B");
    assert!(
        refused
            .to_string()
            .contains("must name its own node as the Lease's holder"),
        "{refused}"
    );

    // A delete, were it granted (the chart grants none): only its own Lease.
    apply::apply_yaml(
        &admin,
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: agent-deletes, namespace: {NAMESPACE}}}
rules:
- {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [delete]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: agent-deletes, namespace: {NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: agent-deletes}}
subjects:
- {{kind: ServiceAccount, name: {AGENT}, namespace: {NAMESPACE}}}
"
        ),
        Some(NAMESPACE),
    )
    .await;
    let started = Instant::now();
    let refused = loop {
        match a_leases
            .delete(&lease_name("node-b"), &DeleteParams::default())
            .await
        {
            // The policy's refusal: 422, its message as the agent logs it.
            Err(kube::Error::Api(status)) if status.code == 422 => break status.message,
            // RBAC's, until the RoleBinding reaches the authorizer's informer.
            Err(kube::Error::Api(status))
                if status.code == 403 && status.message.contains("cannot delete") => {}
            other => panic!("agent A deleting node B's Lease: {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "agent A was never given delete"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        refused.contains("may write only its own node's Lease, not portalloc-node-node-b"),
        "{refused}"
    );

    // A token of the agent's ServiceAccount bound to no pod carries no node: no Lease at all.
    let unbound_config = dir.path().join("unbound.kubeconfig");
    crate::support::service_account::service_account_kubeconfig(
        &admin,
        &cluster.kubeconfig,
        NAMESPACE,
        AGENT,
        &unbound_config,
    )
    .await;
    let unbound = client_from(&unbound_config, None).await;
    assert_eq!(who_am_i(&unbound).await.1, None);
    let refused = refusal(&unbound, &report("node-a", "leased")).await;
    assert!(
        refused
            .as_deref()
            .is_some_and(|m| m.contains("the node agent's token is bound to no node")),
        "{refused:?}"
    );

    // pool describe: the agents' namespace only, and a Lease only under its node's name.
    let created = cluster.run(&[
        "pool",
        "create",
        "leased",
        "--range",
        "46100-46109",
        "--guard",
        "Audit",
    ]);
    assert!(created.ok(), "{created}");
    crate::support::create_namespace(&admin, "elsewhere").await;
    let planted = |name: &str, namespace: &str, node: &str| {
        let mut labels = std::collections::BTreeMap::new();
        labels.insert(NODE_AGENT_LABEL.to_string(), "true".to_string());
        (
            Api::<Lease>::namespaced(admin.clone(), namespace),
            Lease {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    labels: Some(labels),
                    annotations: Some(report(node, "leased").annotations()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.into()),
                    renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                        k8s_openapi::jiff::Timestamp::now(),
                    )),
                    lease_duration_seconds: Some(90),
                    ..LeaseSpec::default()
                }),
            },
        )
    };
    for (name, namespace, node) in [
        (lease_name("node-x"), "elsewhere", "node-x"),
        ("not-a-node-lease".to_string(), NAMESPACE, "node-y"),
    ] {
        let (api, lease) = planted(&name, namespace, node);
        api.create(&PostParams::default(), &lease).await.unwrap();
    }
    let described = cluster.run(&["pool", "describe", "leased"]);
    assert!(described.ok(), "{described}");
    assert!(
        described
            .stdout
            .contains("guard it (Audit): node-a, node-b"),
        "{described}"
    );
    assert!(!described.stdout.contains("node-x"), "{described}");
    assert!(!described.stdout.contains("node-y"), "{described}");
    let elsewhere = cluster.run(&[
        "pool",
        "describe",
        "leased",
        "--node-agent-namespace",
        "elsewhere",
    ]);
    assert!(elsewhere.ok(), "{elsewhere}");
    assert!(
        elsewhere.stdout.contains("guard it (Audit): node-x"),
        "{elsewhere}"
    );
    assert!(!elsewhere.stdout.contains("node-a"), "{elsewhere}");
    let nowhere = cluster.run(&[
        "pool",
        "describe",
        "leased",
        "--node-agent-namespace",
        "nowhere",
    ]);
    assert!(nowhere.ok(), "{nowhere}");
    assert!(
        nowhere
            .stdout
            .contains("none report in namespace nowhere: no node agent runs there"),
        "{nowhere}"
    );
}

/// Agent `client` records an Event about `pod` as kube-runtime's recorder does, reporting as
/// `instance`; the API server's refusal, or `None` if written.
async fn event_refusal(client: &Client, instance: &str, pod: &Pod) -> Option<String> {
    use kube::Resource;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let reporter = Reporter {
        controller: "portalloc-node-agent".into(),
        instance: Some(instance.into()),
    };
    let event = Event {
        type_: EventType::Warning,
        reason: "PortBindRefused".into(),
        note: Some(format!("reported as {instance}")),
        action: "Bind".into(),
        secondary: None,
    };
    Recorder::new(client.clone(), reporter)
        .publish(&event, &pod.object_ref(&()))
        .await
        .err()
        .map(|e| e.to_string())
}

#[tokio::test]
async fn an_agent_reports_events_only_as_its_own_node() {
    let Some(cluster) = PrivateCluster::start("node-agent-events", true) else {
        return;
    };
    let admin = cluster.client().await;
    crate::support::create_namespace(&admin, NAMESPACE).await;
    apply_shipped_agent(&admin).await;
    let dir = tempfile::tempdir().unwrap();
    let agent_a = agent_on(&admin, &cluster.kubeconfig, dir.path(), "node-a").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let pod = pods.get("agent-node-a").await.unwrap();

    // The policy reaches the admission plugin a moment after it is written: agent A reports as
    // node B until refused.
    let started = Instant::now();
    let refused = loop {
        if let Some(message) = event_refusal(&agent_a, "node-b", &pod).await {
            break message;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the API server never refused agent A's Event reported as node B"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        refused.contains(
            "the node agent on node node-a may report Events only as that node \
             (reportingInstance node-a), not as node-b"
        ),
        "{refused}"
    );
    // As its own node, as the agent reports (src/k8s/node_agent/bind_events.rs): written, twice (the
    // second an update of the first's series).
    for round in 0..2 {
        assert_eq!(
            event_refusal(&agent_a, "node-a", &pod).await,
            None,
            "write {round}"
        );
    }
    // A token bound to no node reports nothing.
    let unbound_config = dir.path().join("unbound.kubeconfig");
    crate::support::service_account::service_account_kubeconfig(
        &admin,
        &cluster.kubeconfig,
        NAMESPACE,
        AGENT,
        &unbound_config,
    )
    .await;
    let unbound = client_from(&unbound_config, None).await;
    let refused = event_refusal(&unbound, "node-a", &pod).await;
    assert!(
        refused
            .as_deref()
            .is_some_and(|m| m.contains("the node agent's token is bound to no node")),
        "{refused:?}"
    );
}

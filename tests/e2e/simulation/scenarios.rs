//! Each example run as written, scaled with one edit, and run again.

use std::collections::BTreeSet;

use super::Scenario;

fn set(names: &[String]) -> BTreeSet<String> {
    names.iter().cloned().collect()
}

fn names(prefix: &str, count: u32) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

/// The router reaches every prefill (HTTP and bootstrap) and every decode, by DNS names that
/// lead to exactly those pods; every port of every pod binds on one node.
fn check_pd(scenario: &Scenario, prefill: u32, decode: u32) -> super::Outcome {
    let outcome = scenario.simulate(&format!(
        "{}, prefill={prefill}, decode={decode}",
        scenario.example
    ));
    assert_eq!(outcome.runs.len() as u32, 1 + prefill + decode);
    let router = outcome
        .runs
        .iter()
        .find(|r| r.pod.workload == "Deployment/router")
        .unwrap();
    let mut expected = names("prefill", prefill);
    expected.extend(names("decode", decode));
    assert_eq!(outcome.reached(&router.pod.name), set(&expected));
    assert_eq!(router.connects().len() as u32, 2 * prefill + decode);
    assert_eq!(router.binds().len(), 2, "--port and --prometheus-port");
    for pod in names("prefill", prefill) {
        let binds: Vec<u64> = outcome.pod(&pod).binds().iter().map(|b| b.0).collect();
        assert!(binds.contains(&scenario.env(&pod, "BOOTSTRAP_PORT").parse().unwrap()));
    }
    outcome
}

#[tokio::test]
async fn sglang_pd_on_one_node_then_scaled() {
    let mut scenario = Scenario::deploy("sglang-pd-hostnetwork.yaml", "sglang-pd-ports").await;
    check_pd(&scenario, 2, 3);
    scenario.scale_role("prefill", 3).await;
    scenario.assert_kept(&["router"]);
    check_pd(&scenario, 3, 3);
    scenario.scale_role("decode", 1).await;
    scenario.assert_kept(&["router"]);
    check_pd(&scenario, 3, 1);
}

/// The webhook form: no plugin command at all, the pods' env from their admission.
#[tokio::test]
async fn sglang_pd_with_the_pod_webhook_then_scaled() {
    let mut scenario = Scenario::deploy_admitted("sglang-pd-webhook.yaml", "sglang-pd-ports").await;
    check_pd(&scenario, 2, 3);
    scenario.scale_role("prefill", 3).await;
    scenario.assert_kept(&["router"]);
    check_pd(&scenario, 3, 3);
}

/// Every worker rendezvouses with its own group's leader; ranks and sizes are LWS's.
fn check_groups(
    scenario: &Scenario,
    label: &str,
    lws: &str,
    groups: u32,
    size: u32,
) -> super::Outcome {
    let outcome = scenario.simulate(&format!("{label}, groups={groups}, size={size}"));
    assert_groups(&outcome, lws, groups, size);
    outcome
}

/// [`check_groups`]' checks of an outcome.
fn assert_groups(outcome: &super::Outcome, lws: &str, groups: u32, size: u32) {
    assert_eq!(outcome.runs.len() as u32, groups * size);
    for g in 0..groups {
        let leader = format!("{lws}-{g}");
        for w in 1..size {
            let worker = format!("{lws}-{g}-{w}");
            assert_eq!(
                outcome.reached(&worker),
                set(std::slice::from_ref(&leader)),
                "{worker} joins its own group's leader"
            );
        }
    }
}

#[tokio::test]
async fn sglang_multinode_lws_on_one_node_then_scaled() {
    let mut scenario =
        Scenario::deploy("sglang-multinode-lws.yaml", "sglang-multinode-ports").await;
    let label = "sglang-multinode-lws.yaml";
    let outcome = check_groups(&scenario, label, "sglang", 2, 2);
    // Rank 0 binds the rendezvous port its workers dial: the leader's DIST_INIT_PORT.
    let dist: u64 = scenario.env("sglang-1", "DIST_INIT_PORT").parse().unwrap();
    assert!(
        outcome
            .pod("sglang-1")
            .binds()
            .contains(&(dist, "--dist-init-addr (rank 0)".into()))
    );
    assert_eq!(
        scenario.env("sglang-1-1", "DIST_INIT_PORT"),
        dist.to_string()
    );
    scenario.scale_groups(3).await;
    scenario.assert_kept(&[]);
    check_groups(&scenario, label, "sglang", 3, 2);
    scenario.scale_groups(1).await;
    scenario.assert_kept(&[]);
    check_groups(&scenario, label, "sglang", 1, 2);
}

/// The webhook form: `kubectl apply` alone; every rank's ports and its group's rendezvous port
/// from its admission.
#[tokio::test]
async fn sglang_multinode_lws_with_the_pod_webhook_then_scaled() {
    let mut scenario = Scenario::deploy_admitted(
        "sglang-multinode-lws-webhook.yaml",
        "sglang-multinode-ports",
    )
    .await;
    let label = "sglang-multinode-lws-webhook.yaml";
    let outcome = check_groups(&scenario, label, "sglang", 2, 2);
    let dist: u64 = scenario.env("sglang-1", "DIST_INIT_PORT").parse().unwrap();
    assert!(
        outcome
            .pod("sglang-1")
            .binds()
            .contains(&(dist, "--dist-init-addr (rank 0)".into()))
    );
    scenario.scale_groups(3).await;
    scenario.assert_kept(&[]);
    check_groups(&scenario, label, "sglang", 3, 2);
}

#[tokio::test]
async fn vllm_ray_lws_on_one_node_then_scaled() {
    let mut scenario = Scenario::deploy("vllm-ray-lws.yaml", "vllm-ray-ports").await;
    let label = "vllm-ray-lws.yaml";
    let outcome = check_groups(&scenario, label, "vllm-ray", 2, 3);
    // Each Ray node binds its whole worker-port block; vllm serve joins the head on its node.
    assert_every_ray_node_binds_its_worker_block(&outcome);
    assert_eq!(
        outcome.reached("vllm-ray-1"),
        set(&["vllm-ray-1".to_string()])
    );
    assert_eq!(
        outcome.pod("vllm-ray-1").processes(),
        2,
        "ray start --head, then vllm serve"
    );
    scenario.scale_groups(3).await;
    scenario.assert_kept(&[]);
    check_groups(&scenario, label, "vllm-ray", 3, 3);
    scenario.scale_groups(1).await;
    scenario.assert_kept(&[]);
    check_groups(&scenario, label, "vllm-ray", 1, 3);
}

/// Every Ray node's process bound all 64 ports of its `--min-worker-port` block.
fn assert_every_ray_node_binds_its_worker_block(outcome: &super::Outcome) {
    for run in &outcome.runs {
        let block = run
            .binds()
            .iter()
            .filter(|(_, why)| why.starts_with("--min-worker-port"))
            .count();
        assert_eq!(block, 64, "{}", run.pod.name);
    }
}

/// The webhook form: workers run `ray start` with plain `$(VAR)` args, the head its two
/// commands; every Ray node binds its whole worker-port block from its admitted env.
#[tokio::test]
async fn vllm_ray_lws_with_the_pod_webhook_then_scaled() {
    let mut scenario =
        Scenario::deploy_admitted("vllm-ray-lws-webhook.yaml", "vllm-ray-ports").await;
    let label = "vllm-ray-lws-webhook.yaml";
    let outcome = check_groups(&scenario, label, "vllm-ray", 2, 3);
    assert_every_ray_node_binds_its_worker_block(&outcome);
    scenario.scale_groups(3).await;
    scenario.assert_kept(&[]);
    check_groups(&scenario, label, "vllm-ray", 3, 3);
}

/// The node each rank of a group runs on: the leaders on one, each worker index on one (each
/// rank needs a whole node's GPUs), so every node holds one pod of every group.
fn node_of_rank(pod: &super::pods::Pod) -> String {
    let rank = &pod.labels["leaderworkerset.sigs.k8s.io/worker-index"];
    format!("guarded-rank-{rank}")
}

/// The webhook form with a node agent on every node and the pool's guard on (`Enforce`): the
/// pods created on their nodes through the webhook, each container started in its pod's
/// cgroup (kubelet's layout) in its node's network namespace once the node's agent has seen
/// the pod. The example's own `ray start` lines still run: every Ray node binds its whole
/// worker-port block, nothing is refused, the agents report no bind of these pods; and the
/// guard was on: a pod binding another pod's port on its node gets EPERM, reported as an
/// Event naming the holder.
#[tokio::test]
async fn vllm_ray_lws_with_the_guard_on() {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{Api, ListParams};
    use std::time::{Duration, Instant};

    if !crate::support::cluster().local {
        eprintln!("skipped: the node agents reach the API server through a loopback relay");
        return;
    }
    let example = "vllm-ray-lws-webhook.yaml";
    let mut scenario = Scenario::prepare(example, "vllm-ray-ports").await;
    scenario.pool_doc()["spec"]["guard"] = "Enforce".into();
    let pool = scenario.pool_doc()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    scenario.placement = Some(node_of_rank);
    let nodes = super::guarded::GuardedNodes::start(
        &["guarded-rank-0", "guarded-rank-1", "guarded-rank-2"],
        &scenario.ns,
    );
    scenario.apply_admitted().await;
    let cgroups = nodes.pod_cgroups(&scenario);
    let admitted = Instant::now();
    nodes.wait_until_guarding(&pool);
    let guarding = admitted.elapsed();
    nodes.wait_until_seen(&scenario, "RAY_NODE_MANAGER_PORT");
    eprintln!(
        "pods admitted and their cgroups made; every agent guards the pool {:.1}s later, and \
         has seen every pod {:.1}s later (a probe's bind of each pod's port included)",
        guarding.as_secs_f64(),
        admitted.elapsed().as_secs_f64()
    );

    let outcome = scenario.simulate_on(
        &format!("{example} with the guard on, groups=2, size=3, a node per rank"),
        &nodes.networks,
        &nodes.addresses,
        &cgroups,
    );
    assert_groups(&outcome, "vllm-ray", 2, 3);
    assert_every_ray_node_binds_its_worker_block(&outcome);
    for run in &outcome.runs {
        let node = node_of_rank(&run.pod);
        assert_eq!(run.pod.node, node, "{} runs on its node", run.pod.name);
    }
    assert_eq!(outcome.refused_binds(), Vec::<String>::new());
    // A few of the agents' rounds: a verdict of the run would be reported by now.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(nodes.verdicts_on(&scenario), Vec::<String>::new());
    let events: Api<Event> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let guard_events = |list: Vec<Event>| -> Vec<(String, String, String)> {
        list.into_iter()
            .filter(|e| {
                e.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("PortBind") || r.starts_with("PortTaken"))
            })
            .map(|e| {
                let pod = e.regarding.and_then(|r| r.name).unwrap_or_default();
                (pod, e.reason.unwrap(), e.note.unwrap_or_default())
            })
            .collect()
    };
    let list = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(guard_events(list), Vec::new(), "the agents' Events");

    // The guard was on all along: on every node, one pod binding the other's port (the run
    // is over, so the port is free) gets EPERM, and its own port binds.
    let mut intruders = Vec::new();
    for (node, agent) in &nodes.agents {
        let on_node: Vec<&String> = scenario
            .created
            .iter()
            .filter(|(_, p)| p.spec.as_ref().unwrap().node_name.as_deref() == Some(node))
            .map(|(name, _)| name)
            .collect();
        let [intruder, holder] = on_node[..] else {
            panic!("{node}: pods {on_node:?}, not one of each group");
        };
        let port: u16 = scenario
            .env(holder, "RAY_NODE_MANAGER_PORT")
            .parse()
            .unwrap();
        let own: u16 = scenario
            .env(intruder, "RAY_NODE_MANAGER_PORT")
            .parse()
            .unwrap();
        let cgroup = &cgroups[intruder];
        assert_eq!(
            agent.bind(Some(cgroup), port),
            "EPERM",
            "{intruder} binding {holder}'s port {port} on {node}"
        );
        assert_eq!(agent.bind(Some(cgroup), own), "ok", "{intruder}'s own port");
        intruders.push((intruder.clone(), holder.clone(), port));
    }
    // Each refusal is an Event on the pod that tried, naming the port, the pool and the holder.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        let seen = guard_events(list);
        let reported = |(intruder, holder, port): &(String, String, u16)| {
            seen.iter().any(|(pod, reason, note)| {
                pod == intruder
                    && reason == "PortBindRefused"
                    && note.contains(&format!("port {port}/TCP"))
                    && note.contains(&format!("PortPool {pool} (guard Enforce)"))
                    && note.contains(&format!("pod {}/{holder}", scenario.ns))
            })
        };
        if intruders.iter().all(reported) {
            assert_eq!(seen.len(), intruders.len(), "{seen:#?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every refusal became an Event: {seen:#?}\n{}",
            nodes.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The agents' logs name them too (so their silence about the run above meant something).
    let logged = nodes.verdicts_on(&scenario);
    assert_eq!(logged.len(), intruders.len(), "{logged:#?}");
    drop(outcome);
    drop(nodes);
}

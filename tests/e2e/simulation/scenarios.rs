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
    let mut scenario = Scenario::deploy("sglang-pd-hostnetwork.yaml", "llm").await;
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
    let mut scenario = Scenario::deploy_admitted("sglang-pd-webhook.yaml", "llm").await;
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
    outcome
}

#[tokio::test]
async fn sglang_multinode_lws_on_one_node_then_scaled() {
    let mut scenario = Scenario::deploy("sglang-multinode-lws.yaml", "llm").await;
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
    let mut scenario = Scenario::deploy_admitted("sglang-multinode-lws-webhook.yaml", "llm").await;
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
    let mut scenario = Scenario::deploy("vllm-ray-lws.yaml", "llm").await;
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
    let mut scenario = Scenario::deploy_admitted("vllm-ray-lws-webhook.yaml", "llm").await;
    let label = "vllm-ray-lws-webhook.yaml";
    let outcome = check_groups(&scenario, label, "vllm-ray", 2, 3);
    assert_every_ray_node_binds_its_worker_block(&outcome);
    scenario.scale_groups(3).await;
    scenario.assert_kept(&[]);
    check_groups(&scenario, label, "vllm-ray", 3, 3);
}

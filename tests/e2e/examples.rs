//! Every example in examples/ applied to the real API server, the way its comments say.

use std::path::Path;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use portalloc::api::{PortAllocation, PortPool};
use serde::Deserialize;

use crate::support::invariants::assert_consistent;
use crate::support::private_cluster::PrivateCluster;
use crate::support::{self, cli};

/// An example's text with its pool renamed, since pools are cluster-wide and tests share a cluster.
fn example(file: &str, pool: &str, unique_pool: &str) -> String {
    let text = std::fs::read_to_string(support::repo_root().join("examples").join(file)).unwrap();
    text.replace(
        &format!("name: {pool}\n"),
        &format!("name: {unique_pool}\n"),
    )
    .replace(
        &format!("pool: {pool}\n"),
        &format!("pool: {unique_pool}\n"),
    )
}

/// Server-side apply every document of the given kinds, as `kubectl apply --server-side` would.
async fn apply_kinds(client: &Client, ns: &str, text: &str, kinds: &[&str]) -> usize {
    let params = PatchParams::apply("e2e-examples").force();
    let mut applied = 0;
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(document).unwrap();
        let kind = value["kind"].as_str().unwrap_or_default();
        if !kinds.contains(&kind) {
            continue;
        }
        let name = value["metadata"]["name"].as_str().unwrap().to_string();
        let result = match kind {
            "Deployment" => Api::<Deployment>::namespaced(client.clone(), ns)
                .patch(&name, &params, &Patch::Apply(&value))
                .await
                .map(|_| ()),
            "StatefulSet" => Api::<StatefulSet>::namespaced(client.clone(), ns)
                .patch(&name, &params, &Patch::Apply(&value))
                .await
                .map(|_| ()),
            "Service" => Api::<Service>::namespaced(client.clone(), ns)
                .patch(&name, &params, &Patch::Apply(&value))
                .await
                .map(|_| ()),
            "PortPool" => Api::<PortPool>::all(client.clone())
                .patch(&name, &params, &Patch::Apply(&value))
                .await
                .map(|_| ()),
            "PortAllocation" => Api::<PortAllocation>::namespaced(client.clone(), ns)
                .patch(&name, &params, &Patch::Apply(&value))
                .await
                .map(|_| ()),
            other => panic!("unexpected kind {other}"),
        };
        result.unwrap_or_else(|e| panic!("{kind}/{name} was rejected by the API server: {e}"));
        applied += 1;
    }
    applied
}

fn env_lines(text: &str) -> Vec<(&str, &str)> {
    text.lines().filter_map(|l| l.split_once('=')).collect()
}

#[tokio::test]
async fn sglang_prefill_decode_on_host_network() {
    let client = support::client().await;
    let ns = support::namespace(&client, "ex-sglang").await;
    let pool = support::unique_name("ex-sglang");
    let text = example("sglang-pd-hostnetwork.yaml", "sglang-pd-ports", &pool);
    let path = std::env::temp_dir().join(format!("{pool}.yaml"));
    std::fs::write(&path, &text).unwrap();
    let file = path.to_str().unwrap();

    // The two commands of the example's header, in order: create writes the ConfigMap too.
    let run = cli::run(&["create", "-f", file, "-n", &ns]);
    assert!(run.ok(), "{run}");
    assert!(
        run.stderr.contains("skipping Deployment (apps/v1)"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("configmap/sglang-pd-env created (6 env files)"),
        "{run}"
    );
    assert_eq!(
        apply_kinds(
            &client,
            &ns,
            &text,
            &[
                "Service",
                "Deployment",
                "StatefulSet",
                "PortPool",
                "PortAllocation"
            ]
        )
        .await,
        7
    );

    let configmap = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("sglang-pd-env")
        .await
        .unwrap();
    let data = configmap.data.unwrap();
    let keys: Vec<&str> = data
        .keys()
        .map(String::as_str)
        .filter(|k| *k != "topology.yaml")
        .collect();
    assert_eq!(
        keys,
        vec![
            "decode-0.env",
            "decode-1.env",
            "decode-2.env",
            "prefill-0.env",
            "prefill-1.env",
            "router.env"
        ]
    );
    assert_eq!(
        configmap.metadata.owner_references.unwrap()[0].name,
        "sglang-pd"
    );

    // The router's file holds exactly what the router takes in PD mode, by per-pod DNS names.
    let pa = Api::<PortAllocation>::namespaced(client.clone(), &ns)
        .get("sglang-pd")
        .await
        .unwrap();
    let endpoints = |role: &str| -> Vec<String> {
        pa.allocated_values(role, "http")
            .iter()
            .enumerate()
            .map(|(i, port)| format!("http://{role}-{i}.{role}.{ns}.svc:{port}"))
            .collect()
    };
    let bootstrap = pa.allocated_values("prefill", "bootstrap");
    let prefill_args: Vec<String> = endpoints("prefill")
        .iter()
        .zip(&bootstrap)
        .map(|(url, b)| format!("--prefill {url} {b}"))
        .collect();
    let decode_args: Vec<String> = endpoints("decode")
        .iter()
        .map(|url| format!("--decode {url}"))
        .collect();
    let router = env_lines(&data["router.env"]);
    let names: Vec<&str> = router.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        names,
        vec![
            "ROUTER_PORT",
            "ROUTER_METRICS_PORT",
            "PREFILL_ARGS",
            "DECODE_ARGS"
        ]
    );
    assert_eq!(router[2].1, format!("'{}'", prefill_args.join(" ")));
    assert_eq!(router[3].1, format!("'{}'", decode_args.join(" ")));
    assert_eq!(bootstrap.len(), 2);
    // Prefill and decode get only their own ports.
    let prefill1 = env_lines(&data["prefill-1.env"]);
    assert_eq!(
        prefill1,
        vec![
            (
                "SGLANG_PORT",
                pa.allocated_values("prefill", "http")[1]
                    .to_string()
                    .as_str()
            ),
            ("BOOTSTRAP_PORT", bootstrap[1].to_string().as_str())
        ]
    );
    let resolved = cli::run(&["resolve", "sglang-pd", "--pod", "decode-2", "-n", &ns]);
    assert_eq!(
        resolved.stdout, data["decode-2.env"],
        "resolve and the ConfigMap agree"
    );

    // kubectl apply of the same file afterwards leaves the allocation alone.
    assert_consistent(&client, &pool).await;
    let run = cli::run(&["sync", "sglang-pd", "-n", &ns]);
    assert!(run.stdout.contains("(unchanged)"), "{run}");
    assert!(
        run.stdout.contains("configmap/sglang-pd-env unchanged"),
        "{run}"
    );

    let statefulset = Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .get("decode")
        .await
        .unwrap();
    let spec = statefulset.spec.unwrap();
    assert_eq!(
        spec.replicas,
        Some(3),
        "the StatefulSet's replicas match the role's"
    );
    assert_eq!(spec.template.spec.unwrap().host_network, Some(true));
}

#[tokio::test]
async fn statefulset_reads_its_port_from_the_configmap() {
    let client = support::client().await;
    let ns = support::namespace(&client, "ex-sts").await;
    let pool = support::unique_name("ex-sts");
    support::create_pool(&pool, "33000-33099");
    let text = example("statefulset-configmap.yaml", "statefulset-configmap", &pool);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &text);
    assert!(run.ok(), "{run}");
    let run = cli::run(&[
        "resolve",
        "workers",
        "--all",
        "-o",
        "configmap",
        "--apply",
        "-n",
        &ns,
    ]);
    assert!(run.ok(), "{run}");
    assert_eq!(apply_kinds(&client, &ns, &text, &["StatefulSet"]).await, 1);
    let data = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("workers-ports")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(data.len(), 4 + 1, "4 env files and topology.yaml");
    // The file name the pod's shell computes (worker-${POD_NAME##*-}.env) exists for every pod.
    for ordinal in 0..4 {
        let pod = format!("workers-{ordinal}");
        let key = format!("worker-{}.env", pod.rsplit('-').next().unwrap());
        let env = env_lines(&data[&key]);
        assert_eq!(
            env.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            vec!["RPC_PORT", "METRICS_PORT"]
        );
        assert!(
            env.iter()
                .all(|(_, v)| v.parse::<u16>().is_ok_and(|p| (33000..=33099).contains(&p)))
        );
    }
    let resolved = cli::run(&[
        "resolve",
        "workers",
        "--role",
        "worker",
        "--pod",
        "workers-2",
        "-n",
        &ns,
    ]);
    assert_eq!(
        resolved.stdout, data["worker-2.env"],
        "resolve and the ConfigMap agree"
    );
}

#[tokio::test]
async fn gitops_walkthrough() {
    let client = support::client().await;
    let ns = support::namespace(&client, "ex-gitops").await;
    let pool = support::unique_name("ex-gitops");
    let pool_text = example("gitops/pool.yaml", "gitops", &pool);
    let allocations = example("gitops/allocations.yaml", "gitops", &pool);
    // `kubectl apply` of both files: the objects exist, without ports.
    apply_kinds(&client, &ns, &pool_text, &["PortPool"]).await;
    apply_kinds(&client, &ns, &allocations, &["PortAllocation"]).await;
    let api: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    // Not synced: only the status the API server fills in (generation 0 observed, Pending).
    let unsynced = api.get("vllm-leader-worker").await.unwrap().status.unwrap();
    assert_eq!(unsynced.observed_generation, Some(0));
    assert!(unsynced.assignments.is_empty());
    assert_eq!(
        unsynced.phase.map(|p| p.to_string()).as_deref(),
        Some("Pending")
    );

    let run = cli::run(&["sync", "--all", "-n", &ns]);
    assert!(run.ok(), "{run}");
    for pa in api.list(&Default::default()).await.unwrap().items {
        let status = pa.status.clone().unwrap();
        assert_eq!(
            status.phase.map(|p| p.to_string()).as_deref(),
            Some("Allocated"),
            "{}",
            pa.name_any()
        );
    }
    // The walkthrough says what `kubectl get portallocations` then shows in PORTS.
    let mut ports: Vec<String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|pa| pa.status.and_then(|s| s.ports))
        .collect();
    ports.sort_by(|a, b| b.cmp(a));
    let walkthrough =
        std::fs::read_to_string(support::repo_root().join("examples/gitops/README.md")).unwrap();
    assert!(
        walkthrough.contains(&format!("# PORTS {}, PHASE Allocated", ports.join(" and "))),
        "examples/gitops/README.md's PORTS comment; the objects show {ports:?}"
    );
    let exporters = api.get("metrics-exporters").await.unwrap();
    assert_eq!(
        exporters.allocated_values("exporter", "admin"),
        vec![24001],
        "the well-known port is honoured"
    );
    let run = cli::run(&[
        "resolve",
        "vllm-leader-worker",
        "--role",
        "worker",
        "--index",
        "2",
        "-n",
        &ns,
    ]);
    assert!(run.ok(), "{run}");
    let leader = api.get("vllm-leader-worker").await.unwrap();
    assert!(
        run.stdout.contains(&format!(
            "LEADER_PORT={}\n",
            leader.allocated_values("leader", "http")[0]
        )),
        "{run}"
    );
    assert_consistent(&client, &pool).await;

    // The walkthrough's README names files that exist.
    let readme =
        std::fs::read_to_string(support::repo_root().join("examples/gitops/README.md")).unwrap();
    for file in [
        "examples/gitops/pool.yaml",
        "examples/gitops/allocations.yaml",
        "crds/portalloc-crds.yaml",
    ] {
        assert!(
            readme.contains(file) && Path::new(support::repo_root()).join(file).exists(),
            "{file}"
        );
    }
}

#[tokio::test]
async fn quickstart_example_applies() {
    let client = support::client().await;
    let ns = support::namespace(&client, "ex-quick").await;
    let pool = support::unique_name("ex-quick");
    let text = example("quickstart.yaml", "quickstart", &pool);
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &text);
    assert!(run.ok(), "{run}");
    assert!(run.stdout.contains("9 ports held"), "{run}");
    assert_consistent(&client, &pool).await;
}

/// The README's quickstart output is what today's code prints: the same commands against a
/// fresh control plane (a new pool is placed the same way every time), compared line by line.
#[tokio::test]
async fn the_readme_quickstart_samples_are_what_the_plugin_prints() {
    let Some(cluster) = PrivateCluster::start("readme-samples", true) else {
        return;
    };
    let readme =
        std::fs::read_to_string(Path::new(support::repo_root()).join("README.md")).unwrap();
    let quickstart = Path::new(support::repo_root()).join("examples/quickstart.yaml");
    let run = cluster.run(&["create", "-f", quickstart.to_str().unwrap()]);
    assert!(run.ok(), "{run}");

    let get = cluster.run(&["get", "-o", "wide"]);
    assert!(get.ok(), "{get}");
    // AGE differs run to run: compare every column but that one.
    let without_age = |line: &str| {
        line.split_whitespace()
            .enumerate()
            .filter(|&(i, _)| i != 5)
            .map(|(_, word)| word)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let printed: Vec<String> = get.stdout.lines().map(without_age).collect();
    let sample = readme
        .lines()
        .skip_while(|l| !l.starts_with("NAME        POOL"))
        .take(2)
        .map(without_age)
        .collect::<Vec<_>>();
    assert_eq!(
        sample, printed,
        "README's get -o wide sample; today:\n{}",
        get.stdout
    );

    let resolve = cluster.run(&[
        "resolve",
        "sglang-pd",
        "--role",
        "decode",
        "--pod",
        "sglang-pd-decode-1",
    ]);
    assert!(resolve.ok(), "{resolve}");
    let sample: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("$ kubectl portalloc resolve sglang-pd"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert_eq!(
        sample,
        resolve.stdout.lines().collect::<Vec<_>>(),
        "README's resolve sample; today:\n{}",
        resolve.stdout
    );
}

/// Every example (the quickstart and the GitOps walkthrough included) can be applied to one
/// cluster with the pool overlap policy bound: pools of one name have one spec (the two
/// variants of a workload share their pool), pools of different names share no port.
#[test]
fn the_examples_pools_share_no_port() {
    let mut pools: Vec<PortPool> = Vec::new();
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    for dir in ["examples", "examples/gitops"] {
        for entry in std::fs::read_dir(support::repo_root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(document).unwrap();
            if value["kind"] == "PortPool" {
                pools.push(serde_json::from_value(value).unwrap());
            }
        }
    }
    assert!(
        pools.len() >= 6,
        "{} pools in {} files",
        pools.len(),
        files.len()
    );
    for pool in &pools {
        let name = pool.name_any();
        for same in pools.iter().filter(|p| p.name_any() == name) {
            assert_eq!(same.spec, pool.spec, "two specs of example pool {name}");
        }
        let others: Vec<PortPool> = pools
            .iter()
            .filter(|p| p.name_any() != name)
            .cloned()
            .collect();
        let overlap = portalloc::ledger::overlapping_pool(&name, &pool.spec, &others);
        assert!(
            overlap.is_none(),
            "example pool {name} shares ports with another example's: {overlap:?}"
        );
    }
}

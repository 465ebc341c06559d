//! Pods, groups and pod references through the binary against the real API server: env files
//! keyed by pod name, a router told every prefill and decode endpoint, LWS workers told their
//! own group's leader, and bad references refused with nothing written.

use std::collections::BTreeMap;

use kube::api::Api;
use portalloc::api::PortAllocation;

use crate::support::{self, cli};

const SGLANG_PD: &str = r#"apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata:
  name: sglang-pd
spec:
  pool: POOL
  roles:
  - name: router
    replicas: 1
    workload: {kind: Deployment, name: sglang-router, service: router}
    ports:
    - {name: http, scope: RoleScoped, env: ROUTER_PORT}
    references:
    - env: PREFILL_ARGS
      from: "prefill[*]"
      format: "--prefill http://{address}:{http} {bootstrap}"
      join: " "
    - env: DECODE_ARGS
      from: "decode[*]"
      format: "--decode http://{address}:{http}"
      join: " "
  - name: prefill
    replicas: 2
    workload: {kind: StatefulSet, name: prefill, service: prefill}
    ports:
    - {name: http, scope: PodScoped, env: PORT}
    - {name: bootstrap, scope: PodScoped, env: BOOTSTRAP_PORT}
  - name: decode
    replicas: 2
    workload: {kind: StatefulSet, name: decode, service: decode}
    ports:
    - {name: http, scope: PodScoped, env: PORT}
"#;

const LWS: &str = r#"apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata:
  name: sglang-lws
spec:
  pool: POOL
  groups: 2
  roles:
  - name: leader
    replicas: 1
    workload: {kind: LeaderWorkerSet, name: sglang, member: Leader}
    ports:
    - {name: dist, scope: RoleScoped, env: DIST_PORT}
  - name: worker
    replicas: 2
    workload: {kind: LeaderWorkerSet, name: sglang, member: Workers}
    ports:
    - {name: metrics, scope: PodScoped, env: METRICS_PORT}
    references:
    - {env: DIST_INIT_ADDR, from: leader, format: "{address}:{dist}"}
    - {env: WORKER_INDEX, from: "worker[*]", format: "{pod}={index}", join: " "}
"#;

type Files = BTreeMap<String, BTreeMap<String, String>>;

fn resolve_all(name: &str, ns: &str) -> Files {
    let run = cli::run(&["resolve", name, "--all", "-o", "json", "-n", ns]);
    assert!(run.ok(), "{run}");
    serde_json::from_str(&run.stdout).unwrap()
}

async fn created(
    client: &kube::Client,
    ns: &str,
    pool: &str,
    manifest: &str,
    name: &str,
) -> PortAllocation {
    let run = cli::run_stdin(
        &["create", "-f", "-", "-n", ns],
        &manifest.replace("POOL", pool),
    );
    assert!(run.ok(), "{run}");
    Api::<PortAllocation>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_router_gets_every_prefill_and_decode_endpoint() {
    let client = support::client().await;
    let ns = support::namespace(&client, "pods-pd").await;
    let pool = support::unique_name("pods-pd");
    support::create_pool(&pool, "35500-35599");
    let pa = created(&client, &ns, &pool, SGLANG_PD, "sglang-pd").await;
    let v = |role: &str, port: &str, i: usize| pa.allocated_values(role, port)[i];
    let files = resolve_all("sglang-pd", &ns);
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        vec!["decode-0", "decode-1", "prefill-0", "prefill-1", "router"]
    );
    let prefill = format!(
        "--prefill http://prefill-0.prefill.{ns}.svc:{} {} --prefill http://prefill-1.prefill.{ns}.svc:{} {}",
        v("prefill", "http", 0),
        v("prefill", "bootstrap", 0),
        v("prefill", "http", 1),
        v("prefill", "bootstrap", 1),
    );
    let decode = format!(
        "--decode http://decode-0.decode.{ns}.svc:{} --decode http://decode-1.decode.{ns}.svc:{}",
        v("decode", "http", 0),
        v("decode", "http", 1),
    );
    assert_eq!(
        files["router"],
        BTreeMap::from([
            (
                "ROUTER_PORT".to_string(),
                v("router", "http", 0).to_string()
            ),
            ("PREFILL_ARGS".to_string(), prefill.clone()),
            ("DECODE_ARGS".to_string(), decode),
        ])
    );
    assert_eq!(
        files["prefill-1"]["PORT"],
        v("prefill", "http", 1).to_string()
    );

    // The pod's own name finds its file without --role; the Deployment's pods use the role's.
    let by_pod = cli::run(&["resolve", "sglang-pd", "--pod", "decode-1", "-n", &ns]);
    assert_eq!(
        by_pod.stdout,
        format!("PORT={}\n", v("decode", "http", 1)),
        "{by_pod}"
    );
    let router = cli::run(&["resolve", "sglang-pd", "--pod", "router", "-n", &ns]);
    assert!(
        router
            .stdout
            .contains(&format!("PREFILL_ARGS='{prefill}'\n")),
        "{router}"
    );
    let unknown = cli::run(&["resolve", "sglang-pd", "--pod", "decode-2", "-n", &ns]);
    assert_eq!(unknown.code, 7, "{unknown}");
    assert!(
        unknown.stderr.contains("has no pod \"decode-2\""),
        "{unknown}"
    );

    // The ConfigMap's files, sourced by sh, give the router's flags word by word.
    let configmap = cli::run(&[
        "resolve",
        "sglang-pd",
        "--all",
        "-o",
        "configmap",
        "-n",
        &ns,
    ]);
    let object: k8s_openapi::api::core::v1::ConfigMap =
        serde_yaml::from_str(&configmap.stdout).unwrap();
    let mut data = object.data.unwrap();
    assert!(
        data.remove("topology.yaml").is_some(),
        "the topology file is there too"
    );
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        vec![
            "decode-0.env",
            "decode-1.env",
            "prefill-0.env",
            "prefill-1.env",
            "router.env"
        ]
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("eval \"$1\"; set -- $PREFILL_ARGS; printf '%s|' \"$@\"")
        .arg("sh")
        .arg(&data["router.env"])
        .output()
        .unwrap();
    let words: String = prefill.split(' ').map(|w| format!("{w}|")).collect();
    assert_eq!(String::from_utf8_lossy(&out.stdout), words);
}

#[tokio::test]
async fn lws_workers_get_their_own_groups_leader() {
    let client = support::client().await;
    let ns = support::namespace(&client, "pods-lws").await;
    let pool = support::unique_name("pods-lws");
    support::create_pool(&pool, "35600-35699");
    let pa = created(&client, &ns, &pool, LWS, "sglang-lws").await;
    let status = pa.status.clone().unwrap();
    assert_eq!(status.ports.as_deref(), Some("6/6"));
    let dist = pa.allocated_values("leader", "dist");
    assert_eq!(dist.len(), 2, "one dist port per group");
    assert_ne!(dist[0], dist[1]);
    let files = resolve_all("sglang-lws", &ns);
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        vec![
            "sglang-0",
            "sglang-0-1",
            "sglang-0-2",
            "sglang-1",
            "sglang-1-1",
            "sglang-1-2"
        ]
    );
    // Worker 2 of group 1.
    let worker = &files["sglang-1-2"];
    assert_eq!(
        worker["DIST_INIT_ADDR"],
        format!("sglang-1.sglang.{ns}.svc:{}", dist[1])
    );
    assert_eq!(worker["WORKER_INDEX"], "sglang-1-1=0 sglang-1-2=1");
    assert_eq!(
        worker["METRICS_PORT"],
        pa.allocated_values("worker", "metrics")[3].to_string()
    );
    assert_eq!(
        files["sglang-0-1"]["DIST_INIT_ADDR"],
        format!("sglang-0.sglang.{ns}.svc:{}", dist[0])
    );
    assert_eq!(files["sglang-1"]["DIST_PORT"], dist[1].to_string());
    let by_pod = cli::run(&[
        "resolve",
        "sglang-lws",
        "--pod",
        "sglang-1-2",
        "-n",
        &ns,
        "-o",
        "json",
    ]);
    let env: BTreeMap<String, String> = serde_json::from_str(&by_pod.stdout).unwrap();
    assert_eq!(&env, worker);
}

#[tokio::test]
async fn bad_pod_references_are_refused_before_anything_is_written() {
    let client = support::client().await;
    let ns = support::namespace(&client, "pods-bad").await;
    let pool = support::unique_name("pods-bad");
    support::create_pool(&pool, "35700-35799");
    let cases = [
        (
            SGLANG_PD.replace("service: prefill}", "}"),
            "spec.roles[0].references[0].format: role prefill's StatefulSet prefill names no service",
        ),
        (
            SGLANG_PD.replace("{bootstrap}", "{grpc}"),
            "spec.roles[0].references[0].format: format",
        ),
        (
            SGLANG_PD.replace("\"decode[*]\"", "decode"),
            "spec.roles[0].references[1].from: reference \"decode\" is ambiguous",
        ),
        (
            LWS.replace(
                "replicas: 1\n    workload: {kind: LeaderWorkerSet",
                "replicas: 2\n    workload: {kind: LeaderWorkerSet",
            ),
            "spec.roles[0].replicas: role leader is a LeaderWorkerSet's leader",
        ),
        (
            SGLANG_PD
                .replace(
                    "replicas: 1\n    workload: {kind: Deployment",
                    "replicas: 2\n    workload: {kind: Deployment",
                )
                .replace(
                    "{name: http, scope: RoleScoped, env: ROUTER_PORT}",
                    "{name: http, env: ROUTER_PORT}",
                ),
            "spec.roles[0].ports[0].scope: role router is a Deployment with 2 replicas",
        ),
        (
            SGLANG_PD.replace(
                "env: BOOTSTRAP_PORT}",
                "env: BOOTSTRAP_PORT, lastEnv: PORT}",
            ),
            "spec.roles[1].ports[1].lastEnv: env \"PORT\" is used twice in role \"prefill\": spec.roles[1].ports[0].env sets it too",
        ),
    ];
    for (manifest, expected) in cases {
        let run = cli::run_stdin(
            &["create", "-f", "-", "-n", &ns],
            &manifest.replace("POOL", &pool),
        );
        assert_eq!(run.code, 7, "{expected}: {run}");
        assert!(run.stderr.contains(expected), "{expected}: {run}");
        assert_eq!(run.stderr.trim_end().lines().count(), 1, "{run}");
    }
    let left = Api::<PortAllocation>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(left.items.is_empty(), "nothing is written");
    let pool_run = cli::run(&["pool", "describe", &pool]);
    assert!(
        pool_run.ok() && !pool_run.stdout.contains("sglang"),
        "{pool_run}"
    );
}

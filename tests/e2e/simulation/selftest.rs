//! The simulation can fail: the SGLang PD example run with env files written by hand, right and
//! then wrong in each way the stand-in must catch. No API server involved.

use std::collections::BTreeMap;
use std::time::Duration;

use super::pods::{self, Manifest};
use super::run::{self, Outcome};

const NS: &str = "sim-self";

/// The env files of the PD example for 2 prefill and 2 decode pods, ports from `base`.
fn files(base: u16) -> BTreeMap<String, String> {
    let (p0, b0, p1, b1, d0, d1) = (base + 2, base + 3, base + 4, base + 5, base + 6, base + 7);
    BTreeMap::from([
        (
            "router.env".to_string(),
            format!(
                "ROUTER_PORT={base}\nROUTER_METRICS_PORT={}\n\
                 PREFILL_ARGS='--prefill http://prefill-0.prefill.{NS}.svc:{p0} {b0} --prefill http://prefill-1.prefill.{NS}.svc:{p1} {b1}'\n\
                 DECODE_ARGS='--decode http://decode-0.decode.{NS}.svc:{d0} --decode http://decode-1.decode.{NS}.svc:{d1}'\n",
                base + 1
            ),
        ),
        (
            "prefill-0.env".into(),
            format!("SGLANG_PORT={p0}\nBOOTSTRAP_PORT={b0}\n"),
        ),
        (
            "prefill-1.env".into(),
            format!("SGLANG_PORT={p1}\nBOOTSTRAP_PORT={b1}\n"),
        ),
        ("decode-0.env".into(), format!("SGLANG_PORT={d0}\n")),
        ("decode-1.env".into(), format!("SGLANG_PORT={d1}\n")),
    ])
}

fn manifest(edit: impl Fn(&str) -> String) -> Manifest {
    let path = crate::support::repo_root().join("examples/sglang-pd-hostnetwork.yaml");
    let text = edit(&std::fs::read_to_string(path).unwrap());
    let mut manifest = Manifest::parse(&text);
    for doc in &mut manifest.docs {
        if doc["kind"] == "StatefulSet" {
            doc["spec"]["replicas"] = 2.into();
        }
    }
    manifest
}

async fn simulate(manifest: &Manifest, files: BTreeMap<String, String>) -> Outcome {
    let _turn = super::ONE_AT_A_TIME.lock().await;
    let pods = pods::pods(manifest, NS);
    let dns = pods::dns(manifest, &pods, NS);
    let configmaps = BTreeMap::from([("sglang-pd-env".to_string(), files)]);
    run::run(&pods, &dns, &configmaps, Duration::from_secs(5))
}

fn failures(outcome: &Outcome) -> String {
    outcome
        .runs
        .iter()
        .flat_map(|r| r.failures())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn right_env_files_run_clean() {
    let outcome = simulate(&manifest(str::to_string), files(61000)).await;
    outcome.assert_clean();
    assert_eq!(outcome.connects(), 6, "{}", outcome.summary());
}

#[tokio::test]
async fn a_port_given_twice_is_eaddrinuse() {
    let mut env = files(61010);
    env.insert("decode-1.env".into(), "SGLANG_PORT=61016\n".into()); // decode-0's
    let outcome = simulate(&manifest(str::to_string), env).await;
    assert!(!outcome.all_up);
    assert!(
        failures(&outcome).contains("EADDRINUSE"),
        "{}",
        failures(&outcome)
    );
}

#[tokio::test]
async fn a_name_that_is_no_pod_fails() {
    let mut env = files(61020);
    let router = env["router.env"].replace("prefill-1.prefill.", "prefill-1.prefil.");
    env.insert("router.env".into(), router);
    let outcome = simulate(&manifest(str::to_string), env).await;
    assert!(
        failures(&outcome).contains("unknown host 'prefill-1.prefil."),
        "{}",
        failures(&outcome)
    );
}

#[tokio::test]
async fn a_port_of_another_pod_is_caught() {
    let mut env = files(61030);
    // decode-0's name with decode-1's port: something answers, but not decode-0.
    let router = env["router.env"].replace(
        "decode-0.decode.sim-self.svc:61036",
        "decode-0.decode.sim-self.svc:61037",
    );
    env.insert("router.env".into(), router);
    let outcome = simulate(&manifest(str::to_string), env).await;
    assert!(
        failures(&outcome).contains("answered from pod decode-1"),
        "{}",
        failures(&outcome)
    );
}

#[tokio::test]
async fn without_published_not_ready_addresses_no_name_resolves() {
    let manifest = manifest(|t| {
        t.replace(
            "publishNotReadyAddresses: true",
            "publishNotReadyAddresses: false",
        )
    });
    let outcome = simulate(&manifest, files(61040)).await;
    assert!(
        failures(&outcome).contains("unknown host"),
        "{}",
        failures(&outcome)
    );
}

#[tokio::test]
async fn host_network_without_cluster_dns_resolves_nothing() {
    let manifest = manifest(|t| {
        t.replacen(
            "dnsPolicy: ClusterFirstWithHostNet   # hostNetwork pods resolve cluster names only so",
            "dnsPolicy: ClusterFirst",
            1,
        )
    });
    let outcome = simulate(&manifest, files(61050)).await;
    assert!(
        failures(&outcome).contains("unknown host"),
        "{}",
        failures(&outcome)
    );
}

#[tokio::test]
async fn a_missing_env_file_keeps_the_pod_waiting() {
    let mut env = files(61060);
    env.remove("decode-1.env");
    let outcome = simulate(&manifest(str::to_string), env).await;
    let decode1 = outcome.pod("decode-1");
    assert!(!decode1.up() && decode1.failures().is_empty());
    assert!(
        decode1
            .output()
            .contains("waiting for /etc/portalloc/decode-1.env"),
        "{}",
        decode1.output()
    );
}

#[test]
fn an_unknown_port_flag_fails_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let ray = dir.path().join("ray");
    std::os::unix::fs::symlink(
        crate::support::repo_root().join("tests/simulation/standin.py"),
        &ray,
    )
    .unwrap();
    let out = std::process::Command::new(&ray)
        .args(["start", "--head", "--port=0", "--gcs-proxy-port=7000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown flag --gcs-proxy-port"), "{stderr}");
}

/// One network namespace per node: decode-1 given decode-0's port runs clean on another node
/// (the router reaching it there, at that node's address), and is EADDRINUSE on the same node.
#[tokio::test]
async fn a_port_given_twice_collides_only_on_one_node() {
    use std::net::Ipv4Addr;
    let manifest = manifest(str::to_string);
    let mut env = files(21000);
    env.insert("decode-1.env".into(), "SGLANG_PORT=21006\n".into()); // decode-0's
    let router = env["router.env"].replace(
        "decode-1.decode.sim-self.svc:21007",
        "decode-1.decode.sim-self.svc:21006",
    );
    env.insert("router.env".into(), router);
    let configmaps = BTreeMap::from([("sglang-pd-env".to_string(), env)]);
    let (a, b) = (Ipv4Addr::new(10, 201, 0, 1), Ipv4Addr::new(10, 201, 0, 2));
    let networks = super::netns::NodeNetworks::new([("node-a", a), ("node-b", b)]);
    let placed = |decode1_node: (&str, Ipv4Addr)| {
        let mut pods = pods::pods(&manifest, NS);
        for pod in &mut pods {
            let (node, ip) = if pod.name == "decode-1" {
                decode1_node
            } else {
                ("node-a", a)
            };
            pod.node = node.to_string();
            pod.host_ip = ip.to_string();
        }
        pods
    };
    let apart = placed(("node-b", b));
    let dns = pods::dns(&manifest, &apart, NS);
    let outcome = run::run_on_nodes(&apart, &dns, &configmaps, &networks, Duration::from_secs(5));
    outcome.assert_clean();
    let router = outcome
        .runs
        .iter()
        .find(|r| r.pod.workload == "Deployment/router")
        .unwrap();
    assert!(
        outcome.reached(&router.pod.name).contains("decode-1"),
        "{}",
        outcome.summary()
    );
    drop(outcome);

    let together = placed(("node-a", a));
    let outcome = run::run_on_nodes(
        &together,
        &dns,
        &configmaps,
        &networks,
        Duration::from_secs(5),
    );
    assert!(!outcome.all_up);
    assert!(
        outcome
            .refused_binds()
            .iter()
            .any(|b| b.contains("21006") && b.contains("EADDRINUSE")),
        "{:?}\n{}",
        outcome.refused_binds(),
        outcome.summary()
    );
}

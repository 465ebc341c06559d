//! `spec.configMap`: the env follows the allocation. `create`, `sync NAME`, `sync --all` and
//! `release` keep the named ConfigMap equal to what spec and status say, write nothing when it
//! already is, never write one for an allocation that did not happen, and never undo an
//! allocation because its ConfigMap could not be written.
//!
//! Assertions stay on what holds whatever the env files' keys and reference formats become:
//! roles without a workload keep `<role>-<index>.env`, and each file holds its pod's own ports.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use portalloc::api::PortAllocation;

use crate::support::cli::{self, Run};
use crate::support::{self};

const PD: &str = r#"apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata:
  name: @NAME@
spec:
  pool: @POOL@
  configMap: {name: @CM@}
  roles:
  - name: router
    replicas: 1
    ports:
    - {name: http, scope: RoleScoped, env: ROUTER_PORT}
  - name: prefill
    replicas: @PREFILL@
    ports:
    - {name: bootstrap, scope: PodScoped, env: BOOTSTRAP_PORT}
  - name: decode
    replicas: @DECODE@
    ports:
    - {name: http, scope: PodScoped, env: DECODE_PORT}
    references:
    - {env: PREFILL_BOOTSTRAP_PORTS, from: "prefill.bootstrap[*]"}
"#;

pub fn pd(name: &str, pool: &str, configmap: &str, prefill: u32, decode: u32) -> String {
    PD.replace("@NAME@", name)
        .replace("@POOL@", pool)
        .replace("@CM@", configmap)
        .replace("@PREFILL@", &prefill.to_string())
        .replace("@DECODE@", &decode.to_string())
}

/// The `configmap/NAME <change> (<n> env files)` line of a run, as (change, n).
pub fn configmap_line(run: &Run, name: &str) -> Option<(String, usize)> {
    let prefix = format!("configmap/{name} ");
    run.stdout.lines().find_map(|line| {
        let rest = line.strip_prefix(&prefix)?;
        let (change, count) = rest.split_once(" (")?;
        let count = count
            .strip_suffix(" env files)")
            .or_else(|| count.strip_suffix(" env file)"))?;
        Some((change.to_string(), count.parse().ok()?))
    })
}

fn assert_line(run: &Run, name: &str, change: &str, files: usize) {
    assert!(run.ok(), "{run}");
    assert_eq!(
        configmap_line(run, name),
        Some((change.to_string(), files)),
        "{run}"
    );
}

/// The names of its env files.
/// `topology.yaml` lists every pod of `pa` with the ports its status records.
pub fn assert_topology(cm: &ConfigMap, pa: &PortAllocation) {
    let text = &cm.data.as_ref().unwrap()["topology.yaml"];
    let written: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
    let expected = serde_yaml::to_value(pa.topology().unwrap()).unwrap();
    assert_eq!(written, expected, "{text}");
}

/// The env files of `cm` (every key but `topology.yaml`).
pub fn files(cm: &ConfigMap) -> BTreeSet<String> {
    let mut keys: BTreeSet<String> = cm.data.clone().unwrap_or_default().into_keys().collect();
    keys.remove("topology.yaml");
    keys
}

/// `VAR`'s value in an env file (`VAR=value` lines).
pub fn env_value(cm: &ConfigMap, file: &str, var: &str) -> Option<String> {
    let text = cm.data.as_ref()?.get(file)?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{var}=")))
        .map(|v| v.trim_matches('\'').to_string())
}

/// Every own port of every pod of `pa` is in its pod's file, under its env name.
pub fn assert_own_ports(cm: &ConfigMap, pa: &PortAllocation) {
    for role in &pa.spec.roles {
        for port in &role.ports {
            let values = pa.allocated_values(&role.name, &port.name);
            for index in 0..role.replicas as usize {
                let value = match port.scope {
                    portalloc::api::PortScope::RoleScoped => values[0],
                    portalloc::api::PortScope::PodScoped => values[index],
                };
                let file = format!("{}-{index}.env", role.name);
                assert_eq!(
                    env_value(cm, &file, &port.env),
                    Some(value.to_string()),
                    "{file} in {:?}",
                    cm.data
                );
            }
        }
    }
}

fn keys(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn the_configmap_follows_create_scale_sync_and_release() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cm-follows").await;
    let pool = support::unique_name("cm-follows");
    support::create_pool(&pool, "37000-37099");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let allocations: Api<PortAllocation> = Api::namespaced(client.clone(), &ns);
    let manifest = pd("pd", &pool, "pd-env", 2, 2);

    // create -f: one file per pod, owned by the PortAllocation.
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &manifest);
    assert_line(&run, "pd-env", "created", 5);
    let pa = allocations.get("pd").await.unwrap();
    let cm = configmaps.get("pd-env").await.unwrap();
    assert_eq!(
        files(&cm),
        keys(&[
            "router-0.env",
            "prefill-0.env",
            "prefill-1.env",
            "decode-0.env",
            "decode-1.env"
        ])
    );
    assert_own_ports(&cm, &pa);
    assert_topology(&cm, &pa);
    let owner = &cm.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.controller
        ),
        ("portalloc.dev/v1alpha1", "PortAllocation", "pd", Some(true))
    );
    assert_eq!(Some(&owner.uid), pa.metadata.uid.as_ref());
    let managers: Vec<_> = cm
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| (m.manager.clone(), m.operation.clone()))
        .collect();
    assert!(
        managers.contains(&(Some("kubectl-portalloc".into()), Some("Apply".into()))),
        "{managers:?}"
    );

    // Nothing changed: nothing written, whichever verb.
    let version = cm.metadata.resource_version.clone();
    assert_line(
        &cli::run(&["sync", "pd", "-n", &ns]),
        "pd-env",
        "unchanged",
        5,
    );
    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &manifest);
    assert_line(&run, "pd-env", "unchanged", 5);
    assert_line(
        &cli::run(&["sync", "--all", "-n", &ns]),
        "pd-env",
        "unchanged",
        5,
    );
    let same = configmaps.get("pd-env").await.unwrap();
    assert_eq!(
        same.metadata.resource_version, version,
        "an unchanged sync wrote"
    );
    // Machine-readable output is the PortAllocation alone.
    let name = cli::run(&["sync", "pd", "-n", &ns, "-o", "name"]);
    assert_eq!(name.stdout, "portallocation.portalloc.dev/pd\n", "{name}");
    let json = cli::run(&["sync", "pd", "-n", &ns, "-o", "json"]);
    serde_json::from_str::<PortAllocation>(&json.stdout).expect("-o json is one object");

    // Scale as GitOps does (the spec replaced through the API), then sync: files follow.
    let mut scaled = allocations.get("pd").await.unwrap();
    scaled.spec.roles[1].replicas = 1;
    scaled.spec.roles[2].replicas = 4;
    allocations
        .replace("pd", &PostParams::default(), &scaled)
        .await
        .unwrap();
    assert_line(
        &cli::run(&["sync", "pd", "-n", &ns]),
        "pd-env",
        "updated",
        6,
    );
    let pa = allocations.get("pd").await.unwrap();
    let cm = configmaps.get("pd-env").await.unwrap();
    assert_eq!(
        files(&cm),
        keys(&[
            "router-0.env",
            "prefill-0.env",
            "decode-0.env",
            "decode-1.env",
            "decode-2.env",
            "decode-3.env"
        ])
    );
    assert_own_ports(&cm, &pa);
    // The topology follows the scaling too: a router re-reading it needs no restart.
    assert_topology(&cm, &pa);
    assert_ne!(cm.metadata.resource_version, version);
    let version = cm.metadata.resource_version.clone();
    assert_line(
        &cli::run(&["sync", "pd", "-n", &ns]),
        "pd-env",
        "unchanged",
        6,
    );
    assert_eq!(
        configmaps
            .get("pd-env")
            .await
            .unwrap()
            .metadata
            .resource_version,
        version
    );

    // Deleted by hand: the next sync --all writes it again. Edited by hand: put right.
    configmaps
        .delete("pd-env", &DeleteParams::default())
        .await
        .unwrap();
    assert_line(
        &cli::run(&["sync", "--all", "-n", &ns]),
        "pd-env",
        "created",
        6,
    );
    configmaps
        .patch(
            "pd-env",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"decode-0.env": "DECODE_PORT=1\n"}})),
        )
        .await
        .unwrap();
    assert_line(
        &cli::run(&["sync", "pd", "-n", &ns]),
        "pd-env",
        "updated",
        6,
    );
    assert_own_ports(&configmaps.get("pd-env").await.unwrap(), &pa);

    // Release: no file may go on naming ports the pool can hand to someone else.
    let decode_ports = pa.allocated_values("decode", "http");
    let run = cli::run(&["release", "pd", "--role", "decode", "-n", &ns]);
    assert_line(&run, "pd-env", "updated", 0);
    let cm = configmaps.get("pd-env").await.unwrap();
    assert!(files(&cm).is_empty(), "{:?}", cm.data);
    assert!(
        allocations
            .get("pd")
            .await
            .unwrap()
            .allocated_values("decode", "http")
            .is_empty()
    );
    for port in &decode_ports {
        assert!(
            !format!("{:?}", cm.data).contains(&port.to_string()),
            "{port} still in {:?}",
            cm.data
        );
    }
    // The next sync allocates again and writes every file with the new ports.
    assert_line(
        &cli::run(&["sync", "pd", "-n", &ns]),
        "pd-env",
        "updated",
        6,
    );
    let pa = allocations.get("pd").await.unwrap();
    assert_own_ports(&configmaps.get("pd-env").await.unwrap(), &pa);
    assert!(cli::run(&["repair", "--pool", &pool]).ok());
}

#[tokio::test]
async fn no_configmap_for_an_allocation_that_did_not_happen() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cm-refused").await;
    let pool = support::unique_name("cm-refused");
    // Three ports; the manifest needs five.
    support::create_pool(&pool, "37100-37102");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let manifest = pd("pd", &pool, "pd-env", 2, 2);

    let run = cli::run_stdin(&["create", "-f", "-", "-n", &ns], &manifest);
    assert_eq!(run.code, 4, "{run}");
    assert!(configmap_line(&run, "pd-env").is_none(), "{run}");
    assert!(configmaps.get_opt("pd-env").await.unwrap().is_none());

    // Applied by GitOps, then synced: refused, recorded, and still no ConfigMap.
    let pa: PortAllocation = serde_yaml::from_str(&manifest).unwrap();
    Api::<PortAllocation>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &pa)
        .await
        .unwrap();
    let run = cli::run(&["sync", "pd", "-n", &ns]);
    assert_eq!(run.code, 4, "{run}");
    assert!(configmaps.get_opt("pd-env").await.unwrap().is_none());
}

#[tokio::test]
async fn a_configmap_controlled_by_another_object_is_refused_and_the_ports_stay() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cm-foreign").await;
    let pool = support::unique_name("cm-foreign");
    support::create_pool(&pool, "37200-37299");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let run = cli::run_stdin(
        &["create", "-f", "-", "-n", &ns],
        &pd("a", &pool, "shared-env", 1, 1),
    );
    assert_line(&run, "shared-env", "created", 3);
    let before = configmaps.get("shared-env").await.unwrap();

    let run = cli::run_stdin(
        &["create", "-f", "-", "-n", &ns],
        &pd("b", &pool, "shared-env", 2, 2),
    );
    assert_eq!(run.code, 4, "{run}");
    assert!(
        run.stderr.contains(
            "controlled by PortAllocation \"a\"; name another one in spec.configMap.name"
        ),
        "{run}"
    );
    // b is created and holds its ports: the ConfigMap never undoes an allocation.
    assert!(run.stdout.contains("portallocation/b in"), "{run}");
    let b = Api::<PortAllocation>::namespaced(client.clone(), &ns)
        .get("b")
        .await
        .unwrap();
    assert_eq!(b.allocated_values("decode", "http").len(), 2);
    let after = configmaps.get("shared-env").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(files(&after).len(), 3);
}

//! The pods a manifest's workloads would make, as their controllers name and label them, with
//! each container's command line, env and mounts as the kubelet would give them; and the DNS
//! names cluster DNS would serve for them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Deserialize;
use serde_json::Value;

use super::expand::expand;

/// The documents of one YAML file.
pub struct Manifest {
    pub docs: Vec<Value>,
}

impl Manifest {
    pub fn parse(text: &str) -> Manifest {
        let docs = serde_yaml::Deserializer::from_str(text)
            .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
            .filter(|v| !v.is_null())
            .collect();
        Manifest { docs }
    }

    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.docs.iter().filter(move |d| d["kind"] == kind)
    }

    pub fn to_yaml(&self) -> String {
        self.docs
            .iter()
            .map(|d| serde_yaml::to_string(d).unwrap())
            .collect::<Vec<_>>()
            .join("---\n")
    }
}

/// Where a container's mount comes from.
#[derive(Clone, Debug)]
pub enum Source {
    ConfigMap { name: String, optional: bool },
    EmptyDir,
}

#[derive(Clone, Debug)]
pub struct Mount {
    pub path: String,
    pub source: Source,
}

#[derive(Clone, Debug)]
pub struct Container {
    pub name: String,
    /// command + args after `$(VAR)` expansion.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
}

#[derive(Clone, Debug)]
pub struct Pod {
    pub name: String,
    /// `StatefulSet/prefill`, `LeaderWorkerSet/sglang`, ...
    pub workload: String,
    /// The LeaderWorkerSet group, if any.
    pub group: Option<u32>,
    pub labels: BTreeMap<String, String>,
    /// `hostname.subdomain` for the DNS record of a pod behind a headless Service.
    pub subdomain: Option<String>,
    /// Whether the pod resolves cluster names (hostNetwork pods need ClusterFirstWithHostNet).
    pub cluster_dns: bool,
    pub containers: Vec<Container>,
    /// The pod spec it was made from (its template's, or the admitted pod's).
    pub spec: Value,
    /// The node it runs on and that node's address (every pod's node and address on one
    /// node, [`NODE`] and 127.0.0.1).
    pub node: String,
    pub host_ip: String,
}

const LWS: &str = "leaderworkerset.sigs.k8s.io";
/// The node every simulated pod runs on: one node, so every port is shared by all pods.
pub const NODE: &str = "sim-node";

/// Every pod of every workload in the manifest.
pub fn pods(manifest: &Manifest, ns: &str) -> Vec<Pod> {
    pods_admitted(manifest, ns, &BTreeMap::new())
}

/// The same, each pod named in `admitted` run with that spec: the pod as the API server stored
/// it after admission (the pod webhook's env in its containers) instead of its template's.
pub fn pods_admitted(
    manifest: &Manifest,
    ns: &str,
    admitted: &BTreeMap<String, Value>,
) -> Vec<Pod> {
    pods_placed(manifest, ns, admitted, &BTreeMap::new())
}

/// The same, each pod whose admitted spec names a node of `nodes` (`spec.nodeName`) on that
/// node, at its address; every other pod on [`NODE`].
pub fn pods_placed(
    manifest: &Manifest,
    ns: &str,
    admitted: &BTreeMap<String, Value>,
    nodes: &BTreeMap<String, std::net::Ipv4Addr>,
) -> Vec<Pod> {
    let chosen = |name: &str, template: &Value| -> Value {
        match admitted.get(name) {
            Some(spec) => serde_json::json!({"metadata": template["metadata"], "spec": spec}),
            None => template.clone(),
        }
    };
    let placed = |template: &Value| -> Option<(String, String)> {
        let node = template["spec"]["nodeName"].as_str()?;
        let address = nodes.get(node)?;
        Some((node.to_string(), address.to_string()))
    };
    let mut pods = Vec::new();
    for sts in manifest.of_kind("StatefulSet") {
        let name = sts["metadata"]["name"].as_str().unwrap();
        let replicas = sts["spec"]["replicas"].as_u64().unwrap_or(1) as u32;
        let service = sts["spec"]["serviceName"].as_str().map(str::to_string);
        for i in 0..replicas {
            let pod_name = format!("{name}-{i}");
            let extra = BTreeMap::from([
                (
                    "statefulset.kubernetes.io/pod-name".into(),
                    pod_name.clone(),
                ),
                ("apps.kubernetes.io/pod-index".into(), i.to_string()),
            ]);
            let template = chosen(&pod_name, &sts["spec"]["template"]);
            pods.push(pod(
                ns,
                &pod_name,
                &format!("StatefulSet/{name}"),
                None,
                &template,
                extra,
                service.clone(),
                Vec::new(),
                placed(&template),
            ));
        }
    }
    for lws in manifest.of_kind("LeaderWorkerSet") {
        let name = lws["metadata"]["name"].as_str().unwrap();
        let groups = lws["spec"]["replicas"].as_u64().unwrap_or(1) as u32;
        let lwt = &lws["spec"]["leaderWorkerTemplate"];
        let size = lwt["size"].as_u64().unwrap_or(1) as u32;
        let unique = lws["spec"]["networkConfig"]["subdomainPolicy"] == "UniquePerReplica";
        for g in 0..groups {
            let subdomain = if unique {
                format!("{name}-{g}")
            } else {
                name.to_string()
            };
            for w in 0..size {
                let (pod_name, template) = if w == 0 {
                    let leader = &lwt["leaderTemplate"];
                    let template = if leader.is_null() {
                        &lwt["workerTemplate"]
                    } else {
                        leader
                    };
                    (format!("{name}-{g}"), template)
                } else {
                    (format!("{name}-{g}-{w}"), &lwt["workerTemplate"])
                };
                let extra = BTreeMap::from([
                    (format!("{LWS}/name"), name.to_string()),
                    (format!("{LWS}/group-index"), g.to_string()),
                    (format!("{LWS}/worker-index"), w.to_string()),
                ]);
                // LWS puts its variables first in every container's env; its values win.
                let injected = vec![
                    (
                        "LWS_LEADER_ADDRESS".to_string(),
                        format!("{name}-{g}.{subdomain}.{ns}"),
                    ),
                    ("LWS_GROUP_SIZE".to_string(), size.to_string()),
                    ("LWS_WORKER_INDEX".to_string(), w.to_string()),
                ];
                let template = chosen(&pod_name, template);
                pods.push(pod(
                    ns,
                    &pod_name,
                    &format!("LeaderWorkerSet/{name}"),
                    Some(g),
                    &template,
                    extra,
                    Some(subdomain.clone()),
                    injected,
                    placed(&template),
                ));
            }
        }
    }
    for deployment in manifest.of_kind("Deployment") {
        let name = deployment["metadata"]["name"].as_str().unwrap();
        let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1) as u32;
        for i in 0..replicas {
            // A ReplicaSet hash and a random suffix: names no env file can be keyed on.
            let pod_name = format!(
                "{name}-6d4cf56db6-{}",
                ["x7k2q", "m9w4z", "p3v8t"][i as usize % 3]
            );
            let template = chosen(&pod_name, &deployment["spec"]["template"]);
            let extra = BTreeMap::from([("pod-template-hash".into(), "6d4cf56db6".into())]);
            let subdomain = template["spec"]["subdomain"].as_str().map(str::to_string);
            pods.push(pod(
                ns,
                &pod_name,
                &format!("Deployment/{name}"),
                None,
                &template,
                extra,
                subdomain,
                Vec::new(),
                placed(&template),
            ));
        }
    }
    pods
}

/// The pods as the cluster has them: made by the workload controllers, admitted (the pod
/// webhook's env and declared ports in their spec), each bound to a node (`nodes`: each node's
/// address). Every pod must be bound.
pub fn from_cluster(
    live: &[k8s_openapi::api::core::v1::Pod],
    ns: &str,
    nodes: &BTreeMap<String, std::net::Ipv4Addr>,
) -> Vec<Pod> {
    live.iter()
        .map(|p| {
            let name = p.metadata.name.clone().expect("a pod has a name");
            let spec = p.spec.as_ref().expect("a pod has a spec");
            let node = spec
                .node_name
                .clone()
                .unwrap_or_else(|| panic!("pod {name} is not bound to a node"));
            let ip = nodes
                .get(&node)
                .unwrap_or_else(|| panic!("pod {name} is bound to {node}, no node of the test"));
            let owner = p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true));
            let workload = match owner {
                // A ReplicaSet `<deployment>-<pod-template-hash>`.
                Some(o) if o.kind == "ReplicaSet" => {
                    let hash = p
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("pod-template-hash"))
                        .cloned()
                        .unwrap_or_default();
                    let deployment = o.name.strip_suffix(&format!("-{hash}")).unwrap_or(&o.name);
                    format!("Deployment/{deployment}")
                }
                Some(o) => format!("{}/{}", o.kind, o.name),
                None => format!("Pod/{name}"),
            };
            let group = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(&format!("{LWS}/group-index")))
                .and_then(|g| g.parse().ok());
            let template = serde_json::json!({
                "metadata": {"labels": p.metadata.labels, "annotations": p.metadata.annotations},
                "spec": spec,
            });
            pod(
                ns,
                &name,
                &workload,
                group,
                &template,
                BTreeMap::new(),
                spec.subdomain.clone(),
                Vec::new(),
                Some((node, ip.to_string())),
            )
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn pod(
    ns: &str,
    name: &str,
    workload: &str,
    group: Option<u32>,
    template: &Value,
    extra_labels: BTreeMap<String, String>,
    subdomain: Option<String>,
    injected: Vec<(String, String)>,
    node: Option<(String, String)>,
) -> Pod {
    let mut labels: BTreeMap<String, String> =
        serde_json::from_value(template["metadata"]["labels"].clone()).unwrap_or_default();
    labels.extend(extra_labels);
    let annotations: BTreeMap<String, String> =
        serde_json::from_value(template["metadata"]["annotations"].clone()).unwrap_or_default();
    let (node, host_ip) = node.unwrap_or_else(|| (NODE.to_string(), "127.0.0.1".to_string()));
    let spec = &template["spec"];
    let host_network = spec["hostNetwork"].as_bool().unwrap_or(false);
    let dns_policy = spec["dnsPolicy"].as_str().unwrap_or("ClusterFirst");
    let cluster_dns = match dns_policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network,
        _ => false,
    };
    let meta = PodMeta {
        ns,
        name,
        labels: &labels,
        annotations: &annotations,
        node: &node,
        host_ip: &host_ip,
    };
    let containers = spec["containers"]
        .as_array()
        .unwrap_or_else(|| panic!("{workload}: no containers"))
        .iter()
        .map(|c| container(c, spec, &meta, &injected, workload))
        .collect();
    Pod {
        name: name.to_string(),
        workload: workload.to_string(),
        group,
        subdomain,
        cluster_dns,
        containers,
        labels,
        spec: spec.clone(),
        node,
        host_ip,
    }
}

struct PodMeta<'a> {
    ns: &'a str,
    name: &'a str,
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    node: &'a str,
    host_ip: &'a str,
}

/// The downward API's fieldRef paths the simulation can answer.
fn field_ref(path: &str, meta: &PodMeta) -> String {
    let keyed = |prefix: &str, map: &BTreeMap<String, String>| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix("']"))
            .map(|key| map.get(key).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => meta.name.to_string(),
        "metadata.namespace" => meta.ns.to_string(),
        "spec.nodeName" => meta.node.to_string(),
        // hostNetwork: the pod's address is its node's.
        "status.podIP" | "status.hostIP" => meta.host_ip.to_string(),
        _ => keyed("metadata.labels['", meta.labels)
            .or_else(|| keyed("metadata.annotations['", meta.annotations))
            .unwrap_or_else(|| panic!("fieldRef {path} is not simulated")),
    }
}

fn container(
    c: &Value,
    pod_spec: &Value,
    meta: &PodMeta,
    injected: &[(String, String)],
    workload: &str,
) -> Container {
    let name = c["name"].as_str().unwrap().to_string();
    let mut env: Vec<(String, String)> = injected.to_vec();
    let mut vars: HashMap<String, String> = injected.iter().cloned().collect();
    for e in c["env"].as_array().into_iter().flatten() {
        let key = e["name"].as_str().unwrap().to_string();
        if injected.iter().any(|(k, _)| *k == key) {
            continue;
        }
        let value = if let Some(v) = e["value"].as_str() {
            expand(v, &vars)
        } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            field_ref(path, meta)
        } else if e["valueFrom"].is_null() {
            String::new()
        } else {
            panic!("{workload}: env {key}: only value and fieldRef are simulated")
        };
        vars.insert(key.clone(), value.clone());
        env.push((key, value));
    }
    assert!(
        c["envFrom"].is_null(),
        "{workload}: envFrom is not simulated"
    );
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|s| expand(s.as_str().unwrap(), &vars))
            .collect()
    };
    let mut argv = strings(&c["command"]);
    assert!(
        !argv.is_empty(),
        "{workload}/{name}: the simulation needs an explicit command (it has no image entrypoint)"
    );
    argv.extend(strings(&c["args"]));
    let volumes = pod_spec["volumes"].as_array().cloned().unwrap_or_default();
    let mounts = c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            assert!(
                m["subPath"].is_null(),
                "{workload}: subPath is not simulated"
            );
            let volume = volumes
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap_or_else(|| panic!("{workload}: no volume {}", m["name"]));
            let source = if volume["configMap"].is_object() {
                assert!(
                    volume["configMap"]["items"].is_null(),
                    "{workload}: configMap items are not simulated"
                );
                Source::ConfigMap {
                    name: volume["configMap"]["name"].as_str().unwrap().to_string(),
                    optional: volume["configMap"]["optional"].as_bool().unwrap_or(false),
                }
            } else if volume["emptyDir"].is_object() {
                Source::EmptyDir
            } else {
                panic!("{workload}: volume {} is not simulated", volume["name"])
            };
            Mount {
                path: m["mountPath"].as_str().unwrap().to_string(),
                source,
            }
        })
        .collect();
    Container {
        name,
        argv,
        env,
        mounts,
    }
}

/// A Service of the manifest, or one a LeaderWorkerSet creates for itself.
struct Service {
    name: String,
    selector: BTreeMap<String, String>,
    headless: bool,
    publish_not_ready: bool,
}

fn services(manifest: &Manifest) -> Vec<Service> {
    let mut out: Vec<Service> = manifest
        .of_kind("Service")
        .map(|s| Service {
            name: s["metadata"]["name"].as_str().unwrap().to_string(),
            selector: serde_json::from_value(s["spec"]["selector"].clone()).unwrap_or_default(),
            headless: s["spec"]["clusterIP"] == "None",
            publish_not_ready: s["spec"]["publishNotReadyAddresses"] == true,
        })
        .collect();
    for lws in manifest.of_kind("LeaderWorkerSet") {
        let name = lws["metadata"]["name"].as_str().unwrap().to_string();
        // The Shared headless Service LWS makes (clusterIP None, publishNotReadyAddresses).
        out.push(Service {
            selector: BTreeMap::from([(format!("{LWS}/name"), name.clone())]),
            name,
            headless: true,
            publish_not_ready: true,
        });
    }
    out
}

/// Every name cluster DNS answers for the pods, in every form a pod of `ns` can look it up
/// through its search path, mapped to the pods it leads to. Pods are never Ready in the
/// simulation (nothing probes them), so only Services with publishNotReadyAddresses publish
/// them, as with peers that must meet before any of them is Ready.
pub fn dns(manifest: &Manifest, pods: &[Pod], ns: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut add = |relative: String, pod: &str| {
        // relative is `<x>` of `<x>.<ns>.svc.cluster.local`.
        for form in [
            relative.clone(),
            format!("{relative}.{ns}"),
            format!("{relative}.{ns}.svc"),
            format!("{relative}.{ns}.svc.cluster.local"),
        ] {
            names.entry(form).or_default().insert(pod.to_string());
        }
    };
    for service in services(manifest) {
        if !service.publish_not_ready || service.selector.is_empty() {
            continue;
        }
        for pod in pods {
            if !service
                .selector
                .iter()
                .all(|(k, v)| pod.labels.get(k) == Some(v))
            {
                continue;
            }
            add(service.name.clone(), &pod.name);
            if service.headless && pod.subdomain.as_deref() == Some(&service.name) {
                add(format!("{}.{}", pod.name, service.name), &pod.name);
            }
        }
    }
    names
}

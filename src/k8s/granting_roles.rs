//! Which of our roles grants a verb on a resource, so a Forbidden can name the role to bind.
//! The table mirrors the ClusterRoles and Roles of rbac/ and deploy/ (the chart rendered); a
//! test compares it with those files, so it cannot drift from them.

/// One rule of a role: API groups, resources (`name/subresource` for a subresource), verbs, and
/// the object names it is narrowed to (empty: every object).
struct Rule {
    groups: &'static [&'static str],
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
    names: &'static [&'static str],
}

/// A role of ours: `ClusterRole` or `Role` (in `portalloc-system`, the agent's in
/// `portalloc-node-agent`), its name and its file.
struct Role {
    kind: &'static str,
    name: &'static str,
    file: &'static str,
    rules: &'static [Rule],
}

const fn rule(
    groups: &'static [&'static str],
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
) -> Rule {
    Rule {
        groups,
        resources,
        verbs,
        names: &[],
    }
}

const ALL_POOL_VERBS: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];
const STATUS: &[&str] = &["get", "update"];
const CONFIGMAP_VERBS: &[&str] = &["get", "create", "patch"];
const EVENT_GROUPS: &[&str] = &["", "events.k8s.io"];

/// Users' roles (rbac/) first: they are the ones a person asks to be bound to.
const ROLES: &[Role] = &[
    Role {
        kind: "ClusterRole",
        name: "portalloc-user",
        file: "rbac/portalloc-user.yaml",
        rules: &[
            rule(&["portalloc.dev"], &["portallocations"], ALL_POOL_VERBS),
            rule(&["portalloc.dev"], &["portallocations/status"], STATUS),
            rule(&[""], &["configmaps"], CONFIGMAP_VERBS),
        ],
    },
    Role {
        kind: "ClusterRole",
        name: "portalloc-pool-user",
        file: "rbac/portalloc-user.yaml",
        rules: &[
            rule(
                &["portalloc.dev"],
                &["portpools"],
                &["get", "list", "watch"],
            ),
            rule(
                &["portalloc.dev"],
                &["portpoolshards"],
                &["get", "list", "watch", "create"],
            ),
            rule(&["portalloc.dev"], &["portpoolshards/status"], STATUS),
        ],
    },
    Role {
        kind: "ClusterRole",
        name: "portalloc-admin",
        file: "rbac/portalloc-admin.yaml",
        rules: &[
            rule(
                &["apiextensions.k8s.io"],
                &["customresourcedefinitions"],
                &["get", "list", "watch", "create", "patch", "update"],
            ),
            rule(&["portalloc.dev"], &["portpools"], ALL_POOL_VERBS),
            rule(&["portalloc.dev"], &["portpools/status"], STATUS),
            rule(&["portalloc.dev"], &["portpoolshards"], ALL_POOL_VERBS),
            rule(&["portalloc.dev"], &["portpoolshards/status"], STATUS),
            rule(
                &["portalloc.dev"],
                &["portallocations"],
                &["get", "list", "watch", "update"],
            ),
            rule(&["portalloc.dev"], &["portallocations/status"], STATUS),
            rule(&[""], &["configmaps"], CONFIGMAP_VERBS),
            rule(&[""], &["services"], &["list"]),
            rule(&["coordination.k8s.io"], &["leases"], &["list"]),
            Rule {
                groups: &["admissionregistration.k8s.io"],
                resources: &[
                    "validatingadmissionpolicies",
                    "validatingadmissionpolicybindings",
                ],
                verbs: &["get", "create", "patch", "update"],
                names: &["portalloc-pool-overlap"],
            },
        ],
    },
    Role {
        kind: "ClusterRole",
        name: "portalloc-watcher",
        file: "deploy/watcher.yaml",
        rules: &[
            rule(
                &["portalloc.dev"],
                &["portallocations"],
                &["get", "list", "watch", "update"],
            ),
            rule(&["portalloc.dev"], &["portallocations/status"], STATUS),
            rule(
                &["portalloc.dev"],
                &["portpools"],
                &["get", "list", "watch"],
            ),
            rule(&["portalloc.dev"], &["portpools/status"], &["update"]),
            rule(
                &["portalloc.dev"],
                &["portpoolshards"],
                &["get", "list", "watch", "create", "update", "delete"],
            ),
            rule(&["portalloc.dev"], &["portpoolshards/status"], STATUS),
            rule(&[""], &["configmaps"], CONFIGMAP_VERBS),
            rule(EVENT_GROUPS, &["events"], &["create", "patch"]),
            rule(&[""], &["nodes"], &["get", "list", "watch"]),
        ],
    },
    Role {
        kind: "Role",
        name: "portalloc-watcher-leader",
        file: "deploy/watcher.yaml",
        rules: &[
            rule(&["coordination.k8s.io"], &["leases"], &["create"]),
            Rule {
                groups: &["coordination.k8s.io"],
                resources: &["leases"],
                verbs: &["get", "update"],
                names: &["portalloc-watcher"],
            },
        ],
    },
    Role {
        kind: "ClusterRole",
        name: "portalloc-webhook",
        file: "deploy/webhook.yaml",
        rules: &[
            rule(
                &["admissionregistration.k8s.io"],
                &["mutatingwebhookconfigurations"],
                &["create"],
            ),
            Rule {
                groups: &["admissionregistration.k8s.io"],
                resources: &["mutatingwebhookconfigurations"],
                verbs: &["get", "patch"],
                names: &["portalloc"],
            },
        ],
    },
    Role {
        kind: "Role",
        name: "portalloc-webhook",
        file: "deploy/webhook.yaml",
        rules: &[
            rule(&[""], &["secrets"], &["create"]),
            Rule {
                groups: &[""],
                resources: &["secrets"],
                verbs: &["get"],
                names: &["portalloc-webhook-ca"],
            },
        ],
    },
    Role {
        kind: "ClusterRole",
        name: "portalloc-node-agent",
        file: "deploy/node-agent/node-agent.yaml",
        rules: &[
            rule(&[""], &["pods"], &["get", "list", "watch"]),
            rule(
                &["portalloc.dev"],
                &["portpools"],
                &["get", "list", "watch"],
            ),
            rule(&["portalloc.dev"], &["portallocations"], &["get"]),
            rule(&["portalloc.dev"], &["portpoolshards"], &["get", "list"]),
            rule(EVENT_GROUPS, &["events"], &["create", "patch"]),
        ],
    },
    Role {
        kind: "Role",
        name: "portalloc-node-agent",
        file: "deploy/node-agent/node-agent.yaml",
        rules: &[
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["get", "create", "update"],
            ),
            // Its own DaemonSet, read on SIGTERM: gone or deleting means an uninstall.
            rule(&["apps"], &["daemonsets"], &["get"]),
        ],
    },
];

/// `portpools.portalloc.dev/status` -> (`portalloc.dev`, `portpools/status`); `configmaps` ->
/// (``, `configmaps`).
pub fn split_resource(resource: &str) -> (&str, String) {
    let (plural, sub) = match resource.split_once('/') {
        Some((plural, sub)) => (plural, Some(sub)),
        None => (resource, None),
    };
    let (name, group) = plural.split_once('.').unwrap_or((plural, ""));
    let name = match sub {
        Some(sub) => format!("{name}/{sub}"),
        None => name.to_string(),
    };
    (group, name)
}

/// The roles of ours that grant `verb` on `resource` in API `group` (for the object `name`,
/// if one is named), as `ClusterRole portalloc-admin (rbac/portalloc-admin.yaml)`: the users'
/// roles (rbac/) that do, or else the workloads' (deploy/: the watcher's, the webhook's, the
/// node agent's), which a person only needs to run those themselves.
pub fn granting(verb: &str, group: &str, resource: &str, name: Option<&str>) -> Vec<String> {
    let grants = |role: &&Role| {
        role.rules.iter().any(|r| {
            r.groups.contains(&group)
                && r.resources.contains(&resource)
                && r.verbs.contains(&verb)
                && (r.names.is_empty() || name.is_some_and(|n| r.names.contains(&n)))
        })
    };
    let (users, workloads): (Vec<&Role>, Vec<&Role>) = ROLES
        .iter()
        .filter(grants)
        .partition(|role| role.file.starts_with("rbac/"));
    let chosen = if users.is_empty() { workloads } else { users };
    chosen
        .iter()
        .map(|role| format!("{} {} ({})", role.kind, role.name, role.file))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;

    /// (kind, role, group, resource, verb, name or "") for every grant.
    type Grant = (String, String, String, String, String, String);

    fn table() -> BTreeSet<Grant> {
        let mut grants = BTreeSet::new();
        for role in ROLES {
            for rule in role.rules {
                let names: Vec<&str> = if rule.names.is_empty() {
                    vec![""]
                } else {
                    rule.names.to_vec()
                };
                for group in rule.groups {
                    for resource in rule.resources {
                        for verb in rule.verbs {
                            for name in &names {
                                grants.insert((
                                    role.kind.into(),
                                    role.name.into(),
                                    group.to_string(),
                                    resource.to_string(),
                                    verb.to_string(),
                                    name.to_string(),
                                ));
                            }
                        }
                    }
                }
            }
        }
        grants
    }

    fn strings(value: &serde_yaml::Value, key: &str) -> Vec<String> {
        value[key]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    }

    /// Every grant of the roles in `files` (paths from the repository's root).
    fn grants_in(files: &[&str]) -> BTreeSet<Grant> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut grants = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(root.join(file)).unwrap();
            for document in serde_yaml::Deserializer::from_str(&text) {
                let doc = serde_yaml::Value::deserialize(document).unwrap();
                let kind = doc["kind"].as_str().unwrap_or_default().to_string();
                if kind != "ClusterRole" && kind != "Role" {
                    continue;
                }
                let role = doc["metadata"]["name"].as_str().unwrap().to_string();
                for rule in doc["rules"].as_sequence().into_iter().flatten() {
                    let mut names = strings(rule, "resourceNames");
                    if names.is_empty() {
                        names.push(String::new());
                    }
                    for group in strings(rule, "apiGroups") {
                        for resource in strings(rule, "resources") {
                            for verb in strings(rule, "verbs") {
                                for name in &names {
                                    grants.insert((
                                        kind.clone(),
                                        role.clone(),
                                        group.clone(),
                                        resource.clone(),
                                        verb.clone(),
                                        name.clone(),
                                    ));
                                }
                            }
                        }
                    }
                }
            }
        }
        grants
    }

    use serde::Deserialize;

    #[test]
    fn the_table_is_exactly_the_roles_of_rbac_and_deploy() {
        let mut files: Vec<String> = ROLES.iter().map(|r| r.file.to_string()).collect();
        for dir in ["rbac", "deploy", "deploy/node-agent"] {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
            for entry in std::fs::read_dir(root).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "yaml") {
                    files.push(format!(
                        "{dir}/{}",
                        path.file_name().unwrap().to_string_lossy()
                    ));
                }
            }
        }
        files.sort();
        files.dedup();
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        let (want, have) = (grants_in(&files), table());
        let missing: Vec<_> = want.difference(&have).collect();
        let extra: Vec<_> = have.difference(&want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "src/k8s/granting_roles.rs differs from the roles in rbac/ and deploy/:\n  \
             missing from the table: {missing:?}\n  in the table only: {extra:?}"
        );
    }

    #[test]
    fn a_forbidden_request_finds_the_roles_that_grant_it() {
        let (group, resource) = split_resource("customresourcedefinitions.apiextensions.k8s.io");
        assert_eq!(
            granting("patch", group, &resource, None),
            ["ClusterRole portalloc-admin (rbac/portalloc-admin.yaml)"]
        );
        let (group, resource) = split_resource("portpoolshards.portalloc.dev/status");
        assert_eq!(
            (group, resource.as_str()),
            ("portalloc.dev", "portpoolshards/status")
        );
        // A user's roles only, when one grants it.
        assert_eq!(
            granting("update", group, &resource, None),
            [
                "ClusterRole portalloc-pool-user (rbac/portalloc-user.yaml)",
                "ClusterRole portalloc-admin (rbac/portalloc-admin.yaml)"
            ]
        );
        // The watcher's, when none does.
        assert_eq!(
            granting("list", "", "nodes", None),
            ["ClusterRole portalloc-watcher (deploy/watcher.yaml)"]
        );
        // Narrowed to one name: granted for it, not for another.
        let (group, resource) = split_resource("secrets");
        assert_eq!(
            granting("get", group, &resource, Some("portalloc-webhook-ca")).len(),
            1
        );
        assert!(granting("get", group, &resource, Some("other")).is_empty());
        assert!(granting("deletecollection", "portalloc.dev", "portallocations", None).is_empty());
    }
}

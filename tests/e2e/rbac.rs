//! The ClusterRoles of rbac/ with real, unprivileged identities (client certificates of the
//! local control plane), and the tenancy ValidatingAdmissionPolicy with two tenants.
//!
//! Each test has a control plane of its own: cluster-wide bindings and an admission policy must
//! not change what the other tests' identities may do.

use kube::Client;
use kube::api::Api;

use crate::support::apply::{apply_yaml, bind, create_namespace};
use crate::support::cli::Run;
use crate::support::invariants::assert_consistent;
use crate::support::private_cluster::PrivateCluster;
use crate::support::{self, USER_CONTEXT, USER_NAME};

const USER2_CONTEXT: &str = "portalloc-local-user2";
const USER2_NAME: &str = "portalloc-user2";

fn rbac_file(name: &str) -> String {
    std::fs::read_to_string(support::repo_root().join("rbac").join(name)).unwrap()
}

fn group(name: &str, pool: &str) -> String {
    format!(
        r#"apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata:
  name: {name}
spec:
  pool: {pool}
  roles:
  - name: prefill
    replicas: 2
    ports:
    - {{name: bootstrap, scope: PodScoped, env: BOOTSTRAP_PORT}}
  - name: decode
    replicas: 2
    ports:
    - {{name: http, scope: PodScoped, env: DECODE_PORT}}
    references:
    - {{env: PREFILL_BOOTSTRAP_PORTS, from: "prefill.bootstrap[*]"}}
"#
    )
}

fn as_user(cluster: &PrivateCluster, context: &str, args: &[&str]) -> Run {
    let mut all = vec!["--context", context];
    all.extend_from_slice(args);
    cluster.run(&all)
}

fn as_user_stdin(cluster: &PrivateCluster, context: &str, args: &[&str], input: &str) -> Run {
    let path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(path.path(), input).unwrap();
    let mut all = args.to_vec();
    all.extend_from_slice(&["-f", path.path().to_str().unwrap()]);
    as_user(cluster, context, &all)
}

/// The one-line Forbidden message naming `verb` on `resource`, with exit code 5.
fn assert_forbidden(run: &Run, verb: &str, resource: &str) {
    assert_eq!(run.code, 5, "{run}");
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| !l.starts_with("warning"))
        .collect();
    assert_eq!(lines.len(), 1, "one line: {run}");
    assert!(
        lines[0].contains(&format!("forbidden: you may not {verb} {resource}")),
        "{verb} {resource} not named: {run}"
    );
    crate::support::error_text::assert_clean(&format!("{verb} {resource}"), lines[0]);
}

/// The Forbidden line of `run` names `role` as the one that grants what was refused.
fn assert_granted_by(run: &Run, role: &str) {
    assert!(
        run.stderr.contains(&format!("ClusterRole {role} (rbac/"))
            && run.stderr.contains("ask a cluster administrator to bind"),
        "{role} not named: {run}"
    );
}

#[tokio::test]
async fn the_user_role_is_enough_to_allocate_and_without_it_the_refusal_is_named() {
    let Some(cluster) = PrivateCluster::start("rbac", true) else {
        return;
    };
    let admin = cluster.client().await;
    apply_yaml(&admin, &rbac_file("portalloc-user.yaml"), None).await;
    apply_yaml(&admin, &rbac_file("portalloc-admin.yaml"), None).await;
    create_namespace(&admin, "team-a").await;
    create_namespace(&admin, "team-none").await;
    bind(
        &admin,
        "portalloc-user",
        "portalloc-user",
        USER_NAME,
        Some("team-a"),
    )
    .await;
    bind(
        &admin,
        "portalloc-pool-user",
        "portalloc-pool-user",
        USER_NAME,
        None,
    )
    .await;
    assert!(
        cluster
            .run(&["pool", "create", "shared", "--range", "23000-23099"])
            .ok()
    );

    // Every verb of an allocating user, with the user role and nothing else.
    let ctx = USER_CONTEXT;
    let run = as_user_stdin(
        &cluster,
        ctx,
        &["create", "-n", "team-a"],
        &group("pd", "shared"),
    );
    assert!(run.ok(), "create: {run}");
    for args in [
        vec!["get", "-n", "team-a"],
        vec!["sync", "pd", "-n", "team-a"],
        vec!["sync", "--all", "-n", "team-a"],
        vec!["describe", "pd", "-n", "team-a"],
        vec![
            "resolve", "pd", "--role", "decode", "--index", "1", "-n", "team-a",
        ],
        vec![
            "resolve",
            "pd",
            "--all",
            "-o",
            "configmap",
            "--apply",
            "-n",
            "team-a",
        ],
        vec!["release", "pd", "--role", "decode", "-n", "team-a"],
        vec!["sync", "pd", "-n", "team-a"],
        vec!["pool", "get"],
        vec!["pool", "describe", "shared"],
        vec!["delete", "pd", "-n", "team-a"],
    ] {
        let run = as_user(&cluster, ctx, &args);
        assert!(run.ok(), "{args:?} as {USER_NAME}: {run}");
        // What it could not read (pool describe: Services, node agents' Leases) is said in words.
        let debug = crate::support::error_text::defects(&format!("{}{}", run.stdout, run.stderr));
        assert!(
            !debug.iter().any(|d| !d.starts_with("said twice")),
            "{args:?}: {debug:?}: {run}"
        );
    }
    assert!(
        cluster.run(&["repair", "--pool", "shared"]).ok(),
        "the user's work left the pool exact"
    );

    // Without the role, each refusal names the verb and the resource, exit 5, one line.
    let run = as_user_stdin(
        &cluster,
        ctx,
        &["create", "-n", "team-none"],
        &group("pd", "shared"),
    );
    assert_forbidden(&run, "create", "portallocations.portalloc.dev");
    assert!(
        run.stderr.contains(
            "ClusterRole portalloc-user (rbac/portalloc-user.yaml) grants it: ask a cluster \
             administrator to bind it to you in namespace \"team-none\" (a RoleBinding)"
        ),
        "{run}"
    );
    assert_forbidden(
        &as_user(&cluster, ctx, &["sync", "--all", "-A"]),
        "list",
        "portallocations.portalloc.dev",
    );
    let pool_create = as_user(
        &cluster,
        ctx,
        &["pool", "create", "mine", "--range", "23100-23199"],
    );
    assert_forbidden(&pool_create, "create", "portpools.portalloc.dev");
    assert_granted_by(&pool_create, "portalloc-admin");
    eprintln!("rbac: pool create as a user: {}", pool_create.stderr.trim());
    assert_forbidden(
        &as_user(&cluster, ctx, &["repair"]),
        "list",
        "portallocations.portalloc.dev",
    );
    let install = as_user(&cluster, ctx, &["install"]);
    assert_forbidden(&install, "patch", "customresourcedefinitions");
    assert_granted_by(&install, "portalloc-admin");
    assert!(
        !install.stderr.contains("ClusterRole portalloc-user"),
        "{install}"
    );
    // The second user has no binding at all.
    assert_forbidden(
        &as_user(&cluster, USER2_CONTEXT, &["pool", "get"]),
        "list",
        "portpools.portalloc.dev",
    );
    assert_forbidden(
        &as_user(&cluster, USER2_CONTEXT, &["get", "-n", "team-a"]),
        "list",
        "portallocations.portalloc.dev",
    );

    // The admin role: install, pools, repair.
    bind(
        &admin,
        "portalloc-admin",
        "portalloc-admin",
        USER2_NAME,
        None,
    )
    .await;
    for args in [
        vec!["install", "--timeout", "60s"],
        vec!["pool", "create", "team-pool", "--range", "23200-23299"],
        vec!["pool", "describe", "team-pool"],
        vec!["repair", "--apply"],
        vec!["pool", "delete", "team-pool"],
    ] {
        let run = as_user(&cluster, USER2_CONTEXT, &args);
        assert!(
            run.ok(),
            "{args:?} as {USER2_NAME} with portalloc-admin: {run}"
        );
    }
}

/// A ClusterRole with the user role's rights on PortAllocations and only `verbs` on ConfigMaps.
async fn user_role_with_configmaps(admin: &Client, name: &str, verbs: &[&str]) {
    let mut rules = vec![
        serde_json::json!({"apiGroups": ["portalloc.dev"], "resources": ["portallocations"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}),
        serde_json::json!({"apiGroups": ["portalloc.dev"], "resources": ["portallocations/status"],
         "verbs": ["get", "update"]}),
    ];
    if !verbs.is_empty() {
        rules.push(
            serde_json::json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs}),
        );
    }
    crate::support::apply::apply_value(
        admin,
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        }),
        None,
    )
    .await;
}

#[tokio::test]
async fn the_user_role_keeps_configmaps_and_without_it_the_ports_stay_and_the_verb_is_named() {
    let Some(cluster) = PrivateCluster::start("rbac-cm", true) else {
        return;
    };
    let admin = cluster.client().await;
    apply_yaml(&admin, &rbac_file("portalloc-user.yaml"), None).await;
    bind(
        &admin,
        "portalloc-pool-user",
        "portalloc-pool-user",
        USER_NAME,
        None,
    )
    .await;
    assert!(
        cluster
            .run(&["pool", "create", "shared", "--range", "23400-23499"])
            .ok()
    );
    let ctx = USER_CONTEXT;
    let manifest = crate::configmap::pd("pd", "shared", "pd-env", 2, 2);

    // The user role: create, sync, release and sync again keep the ConfigMap.
    create_namespace(&admin, "team-a").await;
    bind(
        &admin,
        "portalloc-user",
        "portalloc-user",
        USER_NAME,
        Some("team-a"),
    )
    .await;
    for (args, change, files) in [
        (vec!["create", "-n", "team-a"], "created", 5),
        (vec!["sync", "pd", "-n", "team-a"], "unchanged", 5),
        (
            vec!["release", "pd", "--role", "prefill", "-n", "team-a"],
            "updated",
            0,
        ),
        (vec!["sync", "--all", "-n", "team-a"], "updated", 5),
    ] {
        let run = if args[0] == "create" {
            as_user_stdin(&cluster, ctx, &args, &manifest)
        } else {
            as_user(&cluster, ctx, &args)
        };
        assert!(run.ok(), "{args:?}: {run}");
        assert_eq!(
            crate::configmap::configmap_line(&run, "pd-env"),
            Some((change.to_string(), files)),
            "{args:?}: {run}"
        );
    }

    // Each missing right: exit 5 naming the verb, the PortAllocation created and its ports
    // held all the same.
    for (ns, verbs, refused) in [
        ("team-get", vec!["get"], "patch"),
        ("team-patch", vec!["get", "patch"], "create"),
        ("team-none", vec![], "get"),
    ] {
        let role = format!("portalloc-user-{ns}");
        user_role_with_configmaps(&admin, &role, &verbs).await;
        create_namespace(&admin, ns).await;
        bind(&admin, &role, &role, USER_NAME, Some(ns)).await;
        let run = as_user_stdin(&cluster, ctx, &["create", "-n", ns], &manifest);
        assert_forbidden(&run, refused, "configmaps");
        eprintln!("rbac: {ns}: {}", run.stderr.trim());
        assert!(
            run.stderr.contains(&format!(
                "PortAllocation {ns}/pd: its ports are held, but ConfigMap \"pd-env\" was not written"
            )),
            "{run}"
        );
        assert!(run.stdout.contains("portallocation/pd in"), "{run}");
        let pa = Api::<portalloc::api::PortAllocation>::namespaced(admin.clone(), ns)
            .get("pd")
            .await
            .unwrap();
        assert_eq!(pa.allocated_values("decode", "http").len(), 2, "{ns}");
        // sync fails the same way and still leaves everything allocated.
        assert_forbidden(
            &as_user(&cluster, ctx, &["sync", "pd", "-n", ns]),
            refused,
            "configmaps",
        );
    }
    assert_consistent(&admin, "shared").await;
    let repair = cluster.run(&["repair", "--pool", "shared"]);
    assert!(repair.ok(), "nothing leaked: {repair}");
}

//! The objects the cases run against (a pool with a holder, a second pool, files) and the
//! manifest builders the case tables write their documents with.

use tempfile::TempDir;

use crate::support::{self, cli};

/// What the case tables refer to, set up once for the whole run.
pub struct Fixture {
    pub ns: String,
    /// Every pool of the run is named with it, so the snapshot finds them.
    pub prefix: String,
    /// 35000-35049 without 35040-35049; `owner` holds 35005 in it.
    pub pool: String,
    /// 35050-35059, empty.
    pub second: String,
    /// A name no pool has: the pool the bad pool manifests and flags would create.
    pub other_pool: String,
    /// Neither a pool nor a namespace by that name exists.
    pub nowhere: String,
    /// The manifest of `owner`, the PortAllocation holding 35005 in `pool`.
    pub owner: String,
    pub garbled_kubeconfig: String,
    pub missing_kubeconfig: String,
    /// A kubeconfig whose server nothing listens on (port 1 of loopback).
    pub unreachable_kubeconfig: String,
    pub dir: TempDir,
}

impl Fixture {
    pub async fn set_up(client: &kube::Client) -> Fixture {
        let ns = support::namespace(client, "bad-input").await;
        let prefix = support::unique_name("bad");
        let pool = format!("{prefix}-pool");
        let run = cli::run(&[
            "pool",
            "create",
            &pool,
            "--range",
            "35000-35049",
            "--exclude",
            "35040-35049",
            "--allow-overlap",
        ]);
        assert!(run.ok(), "{run}");
        let owner = pa_doc(
            "owner",
            &pool,
            "  - name: admin\n    replicas: 1\n    ports:\n    - {name: ctl, scope: RoleScoped, env: CTL_PORT, port: 35005}\n",
        );
        assert!(cli::run_stdin(&["create", "-f", "-", "-n", &ns], &owner).ok());
        let second = format!("{prefix}-second");
        let run = cli::run(&[
            "pool",
            "create",
            &second,
            "--range",
            "35050-35059",
            "--allow-overlap",
        ]);
        assert!(run.ok(), "{run}");

        let dir = tempfile::tempdir().unwrap();
        let garbled = dir.path().join("garbled");
        std::fs::write(&garbled, "apiVersion: v1\nclusters: [oops\n").unwrap();
        let missing = dir.path().join("missing");
        let unreachable = dir.path().join("unreachable");
        std::fs::write(&unreachable, UNREACHABLE_KUBECONFIG).unwrap();
        Fixture {
            unreachable_kubeconfig: unreachable.to_str().unwrap().to_string(),
            other_pool: format!("{prefix}-other"),
            nowhere: format!("{prefix}-nowhere"),
            garbled_kubeconfig: garbled.to_str().unwrap().to_string(),
            missing_kubeconfig: missing.to_str().unwrap().to_string(),
            ns,
            prefix,
            pool,
            second,
            owner,
            dir,
        }
    }

    /// PortAllocation `x` in the fixture's pool with `roles`.
    pub fn x(&self, roles: &str) -> String {
        pa_doc("x", &self.pool, roles)
    }

    /// A PortPool named `other_pool` with `spec`.
    pub fn bad_pool(&self, spec: &str) -> String {
        pool_doc(&self.other_pool, spec)
    }
}

/// A cluster at a loopback port nothing listens on.
const UNREACHABLE_KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: gone
  cluster: {server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true}
users:
- name: someone
  user: {token: nothing}
contexts:
- name: gone
  context: {cluster: gone, user: someone}
current-context: gone
";

pub fn pool_doc(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortPool\nmetadata:\n  name: {name}\nspec:\n{spec}"
    )
}

pub fn pa_doc(name: &str, pool: &str, roles: &str) -> String {
    format!(
        "apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata:\n  name: {name}\nspec:\n  pool: {pool}\n  roles:\n{roles}"
    )
}

/// A pool spec's `ranges` line.
pub fn ranges(r: &str) -> String {
    format!("  ranges: [{r}]\n")
}

/// One role `web` with `replicas` and the given port lines.
pub fn web(replicas: &str, ports: &str) -> String {
    format!("  - name: web\n    replicas: {replicas}\n    ports:\n{ports}")
}

pub const HTTP: &str = "    - {name: http, scope: PodScoped, env: HTTP_PORT}\n";

/// Roles `router` (RoleScoped http), `prefill` (2 replicas, PodScoped bootstrap) and `decode`
/// with one reference `from`.
pub fn with_reference(from: &str) -> String {
    format!(
        "  - name: router\n    replicas: 1\n    ports:\n    - {{name: http, scope: RoleScoped, env: ROUTER_PORT}}\n  - name: prefill\n    replicas: 2\n    ports:\n    - {{name: bootstrap, scope: PodScoped, env: BOOTSTRAP_PORT}}\n  - name: decode\n    replicas: 1\n    ports:\n{HTTP}    references:\n    - {{env: REF, from: \"{from}\"}}\n"
    )
}

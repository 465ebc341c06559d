//! The unpacked root filesystem under chroot as UID 65532: the static binary, with a mounted
//! ServiceAccount, reaches a real API server over TLS.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::common::control_plane::ControlPlane;
use crate::watcher;
use crate::{
    Privilege, USER, VERSION, build_image, privilege, release_binary, repo, require_tools, run_ok,
    show, tag, tree, unable,
};

/// `chroot --userspec=65532:65532 ROOTFS /kubectl-portalloc ARGS` with an empty environment but
/// for `env`, as root or through sudo.
pub(crate) fn chroot_command(
    privilege: Privilege,
    rootfs: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> Command {
    let chroot = ["/usr/sbin/chroot", "/usr/bin/chroot", "/sbin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chroot (coreutils)");
    let mut command = match privilege {
        Privilege::Root => Command::new("env"),
        Privilege::Sudo => {
            let mut sudo = Command::new("sudo");
            sudo.args(["-n", "env"]);
            sudo
        }
    };
    command.arg("-i");
    for (key, value) in env {
        command.arg(format!("{key}={value}"));
    }
    command
        .arg(chroot)
        .arg(format!("--userspec={USER}"))
        .arg(rootfs)
        .arg("/kubectl-portalloc")
        .args(args)
        .stdin(Stdio::null());
    command
}

fn in_chroot(privilege: Privilege, rootfs: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    chroot_command(privilege, rootfs, env, args)
        .output()
        .expect("run chroot")
}

/// What the kubelet gives a pod of ServiceAccount `name` in `default`: a token from the
/// TokenRequest API, the cluster's CA and the namespace, written where in-cluster configuration
/// reads them (under `rootfs`). Returns the API server's port. `bind` grants cluster-admin.
pub(crate) fn mount_service_account(
    kubeconfig: &Path,
    rootfs: &Path,
    namespace: &str,
    name: &str,
    bind: bool,
) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
    use kube::api::{Api, ObjectMeta, PostParams};
    use kube::config::{KubeConfigOptions, Kubeconfig};

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (token, ca, server) = runtime.block_on(async {
        let parsed = Kubeconfig::read_from(kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
            .await
            .unwrap();
        let server = config.cluster_url.to_string();
        let ca = config.root_cert.clone().expect("a CA in the kubeconfig");
        let client = kube::Client::try_from(config).unwrap();
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        let meta = ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        };
        let account = ServiceAccount {
            metadata: meta.clone(),
            ..Default::default()
        };
        // deploy/watcher.yaml creates its own account; the others are made here.
        if accounts.get_opt(name).await.unwrap().is_none() {
            accounts
                .create(&PostParams::default(), &account)
                .await
                .unwrap();
        }
        if bind {
            let binding = ClusterRoleBinding {
                metadata: meta,
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: "cluster-admin".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: name.into(),
                    namespace: Some(namespace.into()),
                    ..Default::default()
                }]),
            };
            Api::<ClusterRoleBinding>::all(client.clone())
                .create(&PostParams::default(), &binding)
                .await
                .unwrap();
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![],
                expiration_seconds: Some(600),
                ..Default::default()
            },
            ..Default::default()
        };
        let issued = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .unwrap();
        let token = issued.status.expect("a token").token;
        (token, ca, server)
    });
    let dir = rootfs.join("var/run/secrets/kubernetes.io/serviceaccount");
    fs::create_dir_all(&dir).unwrap();
    let pem: String = ca
        .iter()
        .map(|der| {
            let b64 = run_ok_stdin("base64", Command::new("base64").arg("-w64"), der);
            format!("-----BEGIN CERTIFICATE-----\n{b64}-----END CERTIFICATE-----\n")
        })
        .collect();
    for (file, content) in [
        ("token", token),
        ("ca.crt", pem),
        ("namespace", namespace.into()),
    ] {
        fs::write(dir.join(file), content).unwrap();
    }
    let mut walk = Some(dir.as_path());
    while let Some(at) = walk.filter(|p| p.starts_with(rootfs) && *p != rootfs) {
        fs::set_permissions(at, fs::Permissions::from_mode(0o755)).unwrap();
        walk = at.parent();
    }
    for file in ["token", "ca.crt", "namespace"] {
        fs::set_permissions(dir.join(file), fs::Permissions::from_mode(0o644)).unwrap();
    }
    server
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string()
}

fn run_ok_stdin(what: &str, command: &mut Command, input: &[u8]) -> String {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    child.stdin.take().unwrap().write_all(input).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{what} failed: {}", show(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
#[ignore = "needs umoci, skopeo, root and the static binary in PORTALLOC_RELEASE_BINARY; .ci/run runs it"]
fn the_unpacked_root_filesystem_runs_the_static_binary_against_a_real_api_server() {
    let test = "chroot";
    require_tools(test, true);
    let Some(binary) = release_binary() else {
        unable(
            test,
            "needs the static release binary: PORTALLOC_RELEASE_BINARY=$(scripts/build-image.sh --build-only)",
        );
    };
    let privilege = privilege().unwrap();
    let described = run_ok("file", Command::new("file").arg("-L").arg(&binary));
    assert!(
        described.contains("statically linked") || described.contains("static-pie linked"),
        "not static: {described}"
    );
    let ldd = Command::new("ldd").arg(&binary).output().unwrap();
    let ldd_text = String::from_utf8_lossy(&ldd.stdout) + String::from_utf8_lossy(&ldd.stderr);
    assert!(
        ldd_text.contains("not a dynamic executable") || ldd_text.contains("statically linked"),
        "ldd: {ldd_text}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let image = build_image(&binary, &tmp.path().join("dist"), &[], None);
    let bundle = tmp.path().join("bundle");
    let reference = format!("{}:{}", image.layout.display(), tag());
    let mut unpack = Command::new("umoci");
    unpack.arg("unpack");
    if privilege == Privilege::Sudo {
        unpack.arg("--rootless");
    }
    run_ok(
        "umoci unpack",
        unpack.arg("--image").arg(&reference).arg(&bundle),
    );

    // The runtime bundle umoci wrote says the same user and entrypoint.
    let runtime: Value =
        serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(runtime["process"]["user"]["uid"], 65532);
    assert_eq!(runtime["process"]["user"]["gid"], 65532);
    assert_eq!(
        runtime["process"]["args"],
        serde_json::json!(["/kubectl-portalloc"])
    );

    // Nothing in the root filesystem but the binary, executable and read-only to its user.
    let rootfs = bundle.join("rootfs");
    let files = tree(&rootfs);
    assert_eq!(
        files.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
        [PathBuf::from("kubectl-portalloc")]
    );
    assert_eq!(
        files[0].1,
        fs::read(&binary).unwrap(),
        "the binary as given"
    );
    let mode = fs::metadata(rootfs.join("kubectl-portalloc"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755);

    let version = in_chroot(privilege, &rootfs, &[], &["version"]);
    assert!(version.status.success(), "{}", show(&version));
    let printed = String::from_utf8_lossy(&version.stdout);
    assert!(
        printed.starts_with(&format!("kubectl-portalloc v{VERSION} ")),
        "version printed: {printed}"
    );

    // TLS and HTTP from the bare root filesystem, as UID 65532: the kubeconfig
    // (https://127.0.0.1:PORT, CA and client certificate embedded) and the quickstart example
    // are the only other files.
    let cluster = ControlPlane::up("image-cluster").unwrap_or_else(|e| panic!("{e:#}"));
    for (from, to) in [
        (cluster.kubeconfig.clone(), "kubeconfig"),
        (repo().join("examples/quickstart.yaml"), "quickstart.yaml"),
    ] {
        fs::copy(&from, rootfs.join(to)).unwrap();
        fs::set_permissions(rootfs.join(to), fs::Permissions::from_mode(0o644)).unwrap();
    }
    let env = [("KUBECONFIG", "/kubeconfig")];
    let run = |args: &[&str]| {
        let output = in_chroot(privilege, &rootfs, &env, args);
        assert!(
            output.status.success(),
            "{args:?} in chroot: {}",
            show(&output)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    run(&["install", "--timeout", "60s"]);
    run(&["create", "-f", "/quickstart.yaml"]);
    let pools = run(&["pool", "get"]);
    assert!(
        pools.lines().any(|l| l.starts_with("quickstart ")),
        "pool get in chroot: {pools}"
    );
    let listed = run(&["get", "-A"]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains("sglang-pd") && l.contains("9/9") && l.contains("Allocated")),
        "get -A in chroot: {listed}"
    );

    // In-cluster configuration, as in a pod: no kubeconfig, the API server by IP from
    // KUBERNETES_SERVICE_HOST/PORT, and the service account's token and CA at their mounted paths
    // (so the image needs no CA bundle of its own). Without RBAC the identity shows in a clean
    // Forbidden (exit 5); bound, the same call works.
    fs::remove_file(rootfs.join("kubeconfig")).unwrap();
    let port = mount_service_account(&cluster.kubeconfig, &rootfs, "default", "unbound", false);
    let pod_env = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", port.as_str()),
    ];
    let forbidden = in_chroot(privilege, &rootfs, &pod_env, &["pool", "get"]);
    assert_eq!(forbidden.status.code(), Some(5), "{}", show(&forbidden));
    let stderr = String::from_utf8_lossy(&forbidden.stderr);
    assert!(
        stderr.contains("you may not list portpools")
            && stderr.contains("system:serviceaccount:default:unbound"),
        "{stderr}"
    );
    mount_service_account(&cluster.kubeconfig, &rootfs, "default", "bound", true);
    let in_pod = in_chroot(privilege, &rootfs, &pod_env, &["get", "-A"]);
    assert!(in_pod.status.success(), "{}", show(&in_pod));
    assert!(
        String::from_utf8_lossy(&in_pod.stdout).contains("sglang-pd"),
        "{}",
        show(&in_pod)
    );

    // The watcher from this root filesystem, in-cluster, as the ServiceAccount deploy/ ships
    // (its ClusterRole and binding applied from deploy/watcher.yaml): a PortAllocation applied
    // with kubectl becomes Ready, and a deleted one's ports are freed.
    watcher::in_the_image(privilege, &rootfs, &cluster.kubeconfig);

    // A server that is not there is a clean "unavailable" (exit 6), not a crash in the resolver.
    drop(cluster);
    let gone = in_chroot(
        privilege,
        &rootfs,
        &pod_env,
        &["pool", "get", "--request-timeout", "5s"],
    );
    assert_eq!(gone.status.code(), Some(6), "{}", show(&gone));
}

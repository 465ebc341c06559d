//! The OCI image built by `scripts/build-image.sh` with umoci and skopeo: what a registry client
//! sees (`skopeo inspect`), that two builds are the same bytes, and that the unpacked root
//! filesystem, holding nothing but the binary, runs it under chroot as UID 65532 and reaches a
//! real API server over TLS.
//!
//! Which binary: `PORTALLOC_RELEASE_BINARY` (the static release build; .ci/run builds it once
//! and sets it) for every test. Without it the structure and reproducibility tests package the
//! dynamically linked debug binary (`--allow-dynamic`); the chroot test needs the static one.
//!
//! They need umoci and skopeo (scripts/install-deps.sh) and root (or passwordless sudo) for
//! chroot, so they are `#[ignore]`d with that reason: `cargo test` lists them as ignored, never
//! as passed without running. .ci/run installs the tools, builds the static binary and runs them
//! (`cargo test --test image -- --ignored`), where a missing tool is a failure.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

mod chroot;
#[path = "../common/mod.rs"]
mod common;
mod kubelet_node;
mod real_node;
mod watcher;

use common::{agent_node, control_plane, controllers};

const DEBUG_BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");
const VERSION: &str = env!("CARGO_PKG_VERSION");
const REPOSITORY: &str = env!("CARGO_PKG_REPOSITORY");
const LICENSE: &str = env!("CARGO_PKG_LICENSE");
/// The image's user: the conventional "nonroot" UID/GID, numeric so no /etc/passwd is needed.
const USER: &str = "65532:65532";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Why a test that was asked to run cannot: a failure that says what to install.
fn unable(test: &str, why: &str) -> ! {
    panic!("{test}: {why}")
}

fn has(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// How chroot can be run: directly as root, or through passwordless sudo (a CI runner's user).
#[derive(Clone, Copy, PartialEq)]
enum Privilege {
    Root,
    Sudo,
}

fn privilege() -> Option<Privilege> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Some(Privilege::Root);
    }
    let sudo = Command::new("sudo")
        .args(["-n", "true"])
        .stderr(Stdio::null())
        .status();
    sudo.is_ok_and(|s| s.success()).then_some(Privilege::Sudo)
}

/// Fail unless this test can run here: umoci and skopeo installed (and, with `chroot`, a way to
/// run chroot).
fn require_tools(test: &str, chroot: bool) {
    let missing: Vec<&str> = ["umoci", "skopeo", "file", "tar"]
        .into_iter()
        .filter(|t| !has(t))
        .collect();
    if !missing.is_empty() {
        unable(
            test,
            &format!(
                "{} not installed (scripts/install-deps.sh)",
                missing.join(", ")
            ),
        );
    }
    if chroot && privilege().is_none() {
        unable(test, "chroot needs root or passwordless sudo");
    }
}

/// The static release binary, if one was given.
fn release_binary() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os("PORTALLOC_RELEASE_BINARY")?);
    assert!(
        path.is_file(),
        "PORTALLOC_RELEASE_BINARY={} is not a file",
        path.display()
    );
    Some(path)
}

/// The binary the structure tests package, and the flags that lets through. The debug build is
/// packaged stripped (180 MB of debug info would make each build take tens of seconds).
fn binary_under_test() -> (PathBuf, Vec<&'static str>) {
    static STRIPPED: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    match release_binary() {
        Some(path) => (path, vec![]),
        None => {
            let (_, path) = STRIPPED.get_or_init(|| {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("kubectl-portalloc");
                run_ok(
                    "strip",
                    Command::new("strip").arg(DEBUG_BIN).arg("-o").arg(&path),
                );
                (dir, path)
            });
            (path.clone(), vec!["--allow-dynamic"])
        }
    }
}

fn show(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn run_ok(what: &str, command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(output.status.success(), "{what} failed: {}", show(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn git(args: &[&str]) -> String {
    run_ok("git", Command::new("git").arg("-C").arg(repo()).args(args))
        .trim()
        .to_string()
}

/// The image's tag and names, as the script makes them.
fn tag() -> String {
    format!("v{VERSION}")
}

struct Image {
    archive: PathBuf,
    layout: PathBuf,
}

/// Run scripts/build-image.sh; `epoch` overrides SOURCE_DATE_EPOCH.
fn build_image(binary: &Path, out: &Path, extra: &[&str], epoch: Option<&str>) -> Image {
    let mut command = Command::new(repo().join("scripts/build-image.sh"));
    command
        .arg("--binary")
        .arg(binary)
        .arg("--out")
        .arg(out)
        .args(extra)
        .env_remove("SOURCE_DATE_EPOCH");
    if let Some(epoch) = epoch {
        command.env("SOURCE_DATE_EPOCH", epoch);
    }
    let stdout = run_ok("scripts/build-image.sh", &mut command);
    let archive = PathBuf::from(stdout.lines().last().expect("printed a path").trim());
    assert!(archive.is_file(), "no archive at {}", archive.display());
    let layout = archive.with_extension("");
    assert!(
        layout.join("index.json").is_file(),
        "no OCI layout at {}",
        layout.display()
    );
    Image { archive, layout }
}

fn skopeo_json(args: &[&str], image: &Path) -> Value {
    let reference = format!("oci-archive:{}:{}", image.display(), tag());
    let out = run_ok(
        "skopeo inspect",
        Command::new("skopeo")
            .arg("inspect")
            .args(args)
            .arg(reference),
    );
    serde_json::from_str(&out).expect("skopeo prints JSON")
}

fn sha256(path: &Path) -> String {
    let out = run_ok("sha256sum", Command::new("sha256sum").arg(path));
    out.split_whitespace().next().unwrap().to_string()
}

/// Every file under `dir` with its bytes, by relative path.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = fs::read(&path).unwrap();
                files.push((path.strip_prefix(dir).unwrap().to_path_buf(), bytes));
            }
        }
    }
    files.sort();
    files
}

/// The commit time as the image records it (RFC 3339, UTC).
fn commit_created() -> String {
    let epoch = git(&["log", "-1", "--format=%ct"]);
    run_ok(
        "date",
        Command::new("date").args(["-u", "-d", &format!("@{epoch}"), "+%Y-%m-%dT%H:%M:%SZ"]),
    )
    .trim()
    .to_string()
}

/// Built once and shared by the tests that only read it.
fn shared_image() -> &'static (tempfile::TempDir, Image) {
    static IMAGE: OnceLock<(tempfile::TempDir, Image)> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let (binary, flags) = binary_under_test();
        let tmp = tempfile::tempdir().unwrap();
        let image = build_image(&binary, &tmp.path().join("a"), &flags, None);
        (tmp, image)
    })
}

#[test]
#[ignore = "needs umoci and skopeo (scripts/install-deps.sh); .ci/run runs it"]
fn skopeo_inspect_shows_the_platform_user_entrypoint_and_labels() {
    require_tools("skopeo_inspect", false);
    let (_, image) = shared_image();
    let name = image.archive.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        name,
        format!("kubectl-portalloc_v{VERSION}_image_linux_amd64.tar")
    );

    let config = skopeo_json(&["--config"], &image.archive);
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["os"], "linux");
    assert_eq!(config["config"]["User"], USER);
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/kubectl-portalloc"])
    );
    // No shell, so no PATH-based command; nothing else configured.
    assert!(config["config"]["Cmd"].is_null(), "{config:#}");
    let created = commit_created();
    assert_eq!(config["created"], created.as_str());

    let labels = &config["config"]["Labels"];
    let label = |key: &str| labels[format!("org.opencontainers.image.{key}")].clone();
    assert_eq!(label("source"), REPOSITORY);
    assert_eq!(label("version"), format!("v{VERSION}").as_str());
    assert_eq!(label("revision"), git(&["rev-parse", "HEAD"]).as_str());
    assert_eq!(label("licenses"), LICENSE);
    assert_eq!(label("created"), created.as_str());

    // One layer, one history entry, and nothing in it about the machine that built it.
    let layers = config["rootfs"]["diff_ids"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{config:#}");
    let history = config["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{config:#}");
    assert_eq!(history[0]["created"], created.as_str());
    assert_eq!(
        history[0]["created_by"],
        "scripts/build-image.sh: /kubectl-portalloc"
    );
    let text = config.to_string();
    let host = run_ok("hostname", &mut Command::new("hostname"));
    assert!(
        !text.contains(host.trim()),
        "host name in the config: {text}"
    );
    assert!(
        !text.contains(repo().to_str().unwrap()),
        "a build path in the config: {text}"
    );

    // The manifest as a registry would store it: OCI media types, a gzip layer.
    let manifest = skopeo_json(&["--raw"], &image.archive);
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    assert_eq!(
        manifest["layers"][0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let summary = skopeo_json(&[], &image.archive);
    assert_eq!(summary["Layers"].as_array().unwrap().len(), 1);
}

#[test]
#[ignore = "needs umoci and skopeo (scripts/install-deps.sh); .ci/run runs it"]
fn two_builds_are_the_same_bytes_and_the_time_is_the_commits() {
    require_tools("reproducible", false);
    let (binary, flags) = binary_under_test();
    let (_, first) = shared_image();
    // A second later, into another directory: nothing of the wall clock or the path may show.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let tmp = tempfile::tempdir().unwrap();
    let second = build_image(&binary, &tmp.path().join("elsewhere/b"), &flags, None);

    let digest = |image: &Image| skopeo_json(&[], &image.archive)["Digest"].clone();
    assert_eq!(digest(&second), digest(first), "manifest digests differ");
    assert_eq!(
        sha256(&second.archive),
        sha256(&first.archive),
        "oci-archive tarballs differ"
    );
    assert!(
        tree(&second.layout) == tree(&first.layout),
        "the OCI layout directories differ"
    );

    // The commit time really is in the image: another SOURCE_DATE_EPOCH gives another digest.
    let other = build_image(&binary, &tmp.path().join("c"), &flags, Some("86400"));
    assert_ne!(digest(&other), digest(first));
    assert_eq!(
        skopeo_json(&["--config"], &other.archive)["created"],
        "1970-01-02T00:00:00Z"
    );
}

#[test]
#[ignore = "needs umoci and skopeo (scripts/install-deps.sh); .ci/run runs it"]
fn a_dynamically_linked_binary_is_refused() {
    require_tools("dynamic_refused", false);
    let described = run_ok("file", Command::new("file").arg("-L").arg(DEBUG_BIN));
    assert!(
        described.contains("dynamically linked"),
        "expected a dynamic debug build: {described}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let output = Command::new(repo().join("scripts/build-image.sh"))
        .arg("--binary")
        .arg(DEBUG_BIN)
        .arg("--out")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!output.status.success(), "{}", show(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("dynamically linked"), "{stderr}");
    assert!(
        fs::read_dir(tmp.path()).unwrap().next().is_none(),
        "nothing is written"
    );
}

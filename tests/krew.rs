//! Krew packaging: the checked-in manifest matches the crate, the release archive holds what it
//! should, and krew itself (built from its Go module by `scripts/build-krew.sh`) validates a
//! manifest and installs the plugin from a locally built archive, which kubectl then runs.
//!
//! The archive installed here packages the debug binary (`release-archive.sh --binary`): an LTO
//! release build would add minutes to every test run and tests nothing more about packaging.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_yaml::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");
const VERSION: &str = env!("CARGO_PKG_VERSION");
const REPOSITORY: &str = env!("CARGO_PKG_REPOSITORY");

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn script(name: &str) -> Command {
    Command::new(repo().join("scripts").join(name))
}

/// Run to completion; panic with everything it printed unless it succeeded.
fn run_ok(what: &str, command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(output.status.success(), "{what} failed: {}", show(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn show(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The last line a script printed: the path it made.
fn last_line(stdout: &str) -> PathBuf {
    PathBuf::from(stdout.lines().last().expect("printed a path").trim())
}

fn sha256(path: &Path) -> String {
    let out = run_ok("sha256sum", Command::new("sha256sum").arg(path));
    out.split_whitespace().next().unwrap().to_string()
}

/// Krew's name for the platform these tests run on (Go's GOOS/GOARCH).
fn host_platform() -> (&'static str, &'static str) {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    };
    (os, arch)
}

fn archive_name(os: &str, arch: &str) -> String {
    format!("kubectl-portalloc_v{VERSION}_{os}_{arch}.tar.gz")
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut at = value;
    for key in path {
        at = &at[*key];
    }
    at.as_str()
        .unwrap_or_else(|| panic!("{} is not a string: {at:?}", path.join(".")))
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Everything a krew manifest of this plugin must satisfy whatever platforms it lists; returns
/// the (os, arch) pairs it lists.
fn check_manifest(text: &str) -> Vec<(String, String)> {
    let manifest: Value = serde_yaml::from_str(text).expect("the manifest is YAML");
    assert_eq!(
        str_at(&manifest, &["apiVersion"]),
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(str_at(&manifest, &["kind"]), "Plugin");
    assert_eq!(str_at(&manifest, &["metadata", "name"]), "portalloc");
    assert_eq!(
        str_at(&manifest, &["spec", "version"]),
        format!("v{VERSION}"),
        "the manifest's version must be Cargo.toml's: regenerate it with scripts/krew-manifest.sh"
    );
    assert_eq!(str_at(&manifest, &["spec", "homepage"]), REPOSITORY);
    assert!(!str_at(&manifest, &["spec", "shortDescription"]).contains('\n'));
    let platforms = manifest["spec"]["platforms"]
        .as_sequence()
        .expect("spec.platforms is a list");
    assert!(!platforms.is_empty(), "no platforms");
    let mut seen = BTreeSet::new();
    let mut listed = Vec::new();
    for platform in platforms {
        let labels = platform["selector"]["matchLabels"]
            .as_mapping()
            .expect("each platform selects by matchLabels");
        assert_eq!(labels.len(), 2, "select by exactly os and arch: {labels:?}");
        let os = str_at(platform, &["selector", "matchLabels", "os"]).to_string();
        let arch = str_at(platform, &["selector", "matchLabels", "arch"]).to_string();
        assert!(
            ["linux", "darwin"].contains(&os.as_str()),
            "unexpected os {os}"
        );
        assert!(
            ["amd64", "arm64"].contains(&arch.as_str()),
            "unexpected arch {arch}"
        );
        assert!(
            seen.insert((os.clone(), arch.clone())),
            "{os}/{arch} is selected twice"
        );
        assert_eq!(
            str_at(platform, &["uri"]),
            format!(
                "{REPOSITORY}/releases/download/v{VERSION}/{}",
                archive_name(&os, &arch)
            )
        );
        let sum = str_at(platform, &["sha256"]);
        assert!(is_sha256(sum), "not a lowercase sha256: {sum}");
        assert_eq!(str_at(platform, &["bin"]), "kubectl-portalloc");
        listed.push((os, arch));
    }
    listed
}

#[test]
fn checked_in_manifest_has_the_crate_version_and_well_formed_platforms() {
    let text = fs::read_to_string(repo().join("krew/portalloc.yaml")).expect("krew/portalloc.yaml");
    let listed = check_manifest(&text);
    // Whatever is left out must be said in the file (scripts/krew-manifest.sh --allow-partial).
    if listed.len() < 4 {
        assert!(
            text.contains("no archive was built for"),
            "a partial manifest must say which platforms it leaves out"
        );
    }
}

/// A stand-in for the binary: prints the completion hook like the real one, and is tiny, so
/// packaging it is instant.
fn fake_binary(dir: &Path) -> PathBuf {
    let hook = run_ok(
        "completion kubectl-plugin",
        Command::new(BIN).args(["completion", "kubectl-plugin"]),
    );
    let path = dir.join("fake-kubectl-portalloc");
    fs::write(&path, format!("#!/bin/sh\ncat <<'EOF'\n{}EOF\n", hook)).unwrap();
    run_ok("chmod", Command::new("chmod").arg("+x").arg(&path));
    path
}

fn package(binary: &Path, out: &Path, extra: &[&str]) -> PathBuf {
    let stdout = run_ok(
        "scripts/release-archive.sh",
        script("release-archive.sh")
            .arg("--binary")
            .arg(binary)
            .arg("--out")
            .arg(out)
            .args(extra),
    );
    last_line(&stdout)
}

#[test]
fn release_archive_holds_the_binary_the_completion_hook_and_the_license() {
    let tmp = tempfile::tempdir().unwrap();
    let binary = fake_binary(tmp.path());
    let archive = package(
        &binary,
        &tmp.path().join("a"),
        &["--os", "darwin", "--arch", "arm64"],
    );
    assert_eq!(
        archive.file_name().unwrap(),
        archive_name("darwin", "arm64").as_str()
    );

    let listing = run_ok("tar -tvzf", Command::new("tar").arg("-tvzf").arg(&archive));
    let mut names: Vec<&str> = listing
        .lines()
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["LICENSE", "kubectl-portalloc", "kubectl_complete-portalloc"]
    );
    for line in listing.lines() {
        let executable = !line.ends_with("LICENSE");
        let mode = if executable {
            "-rwxr-xr-x"
        } else {
            "-rw-r--r--"
        };
        assert!(line.starts_with(mode), "mode of {line}");
        assert!(line.contains(" 0/0 "), "owned by root: {line}");
    }

    let unpacked = tmp.path().join("unpacked");
    fs::create_dir(&unpacked).unwrap();
    run_ok(
        "tar -xzf",
        Command::new("tar")
            .arg("-xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&unpacked),
    );
    assert_eq!(
        fs::read(unpacked.join("kubectl-portalloc")).unwrap(),
        fs::read(&binary).unwrap()
    );
    assert_eq!(
        fs::read(unpacked.join("LICENSE")).unwrap(),
        fs::read(repo().join("LICENSE")).unwrap()
    );
    let hook = fs::read_to_string(unpacked.join("kubectl_complete-portalloc")).unwrap();
    assert!(hook.starts_with("#!/bin/sh\n") && hook.contains("kubectl-portalloc __complete"));

    // The .sha256 beside it is right, and packaging again gives the same bytes.
    let sidecar = fs::read_to_string(archive.with_extension("gz.sha256")).unwrap();
    assert_eq!(
        sidecar,
        format!(
            "{}  {}\n",
            sha256(&archive),
            archive_name("darwin", "arm64")
        )
    );
    let again = package(
        &binary,
        &tmp.path().join("b"),
        &["--target", "aarch64-apple-darwin"],
    );
    assert_eq!(again.file_name(), archive.file_name());
    assert_eq!(
        sha256(&again),
        sha256(&archive),
        "the archive is reproducible"
    );
}

#[test]
fn manifest_generator_never_invents_a_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let dist = tmp.path().join("dist");
    let archive = package(
        &fake_binary(tmp.path()),
        &dist,
        &["--os", "linux", "--arch", "arm64"],
    );
    let out = tmp.path().join("krew/portalloc.yaml");

    // By default every release platform needs its archive: nothing is written without them.
    let refused = script("krew-manifest.sh")
        .arg("--dist")
        .arg(&dist)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!refused.status.success(), "{}", show(&refused));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("darwin/amd64"),
        "names what is missing: {stderr}"
    );
    assert!(!out.exists());

    // --allow-partial lists only what was built, with the archive's own hash.
    run_ok(
        "krew-manifest.sh --allow-partial",
        script("krew-manifest.sh")
            .arg("--dist")
            .arg(&dist)
            .arg("--out")
            .arg(&out)
            .arg("--allow-partial"),
    );
    let text = fs::read_to_string(&out).unwrap();
    assert_eq!(
        check_manifest(&text),
        [("linux".to_string(), "arm64".to_string())]
    );
    assert!(text.contains(&format!("sha256: {}\n", sha256(&archive))));
    assert!(text.contains("no archive was built for: linux/amd64 darwin/amd64 darwin/arm64"));
}

/// The directory with krew, validate-krew-manifest and kubectl (built once, cached across runs).
fn tools() -> &'static Path {
    static TOOLS: OnceLock<PathBuf> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let stdout = run_ok(
            "scripts/build-krew.sh",
            script("build-krew.sh").stderr(std::process::Stdio::inherit()),
        );
        last_line(&stdout)
    })
}

fn validate(manifest: &Path) {
    // --skip-install: its install step would download every platform's uri.
    run_ok(
        "validate-krew-manifest",
        Command::new(tools().join("validate-krew-manifest"))
            .arg("-manifest")
            .arg(manifest)
            .arg("-skip-install"),
    );
}

#[test]
fn checked_in_manifest_passes_validate_krew_manifest() {
    validate(&repo().join("krew/portalloc.yaml"));
}

/// A PATH of krew's bin directory, the built tools, and the system's basics (for `sh`).
fn path_with(krew_root: &Path) -> OsString {
    let dirs = [
        krew_root.join("bin"),
        tools().to_path_buf(),
        PathBuf::from("/usr/bin"),
        PathBuf::from("/bin"),
    ];
    std::env::join_paths(dirs).unwrap()
}

fn krew(krew_root: &Path, os: &str, arch: &str) -> Command {
    let mut command = Command::new(tools().join("krew"));
    command
        .env("KREW_ROOT", krew_root)
        .env("KREW_OS", os)
        .env("KREW_ARCH", arch)
        .env("PATH", path_with(krew_root));
    command
}

#[test]
fn krew_installs_the_plugin_from_the_archive_and_kubectl_runs_it() {
    let (os, arch) = host_platform();
    let tmp = tempfile::tempdir().unwrap();
    let dist = tmp.path().join("dist");
    let archive = package(Path::new(BIN), &dist, &["--os", os, "--arch", arch]);

    // The manifest for this platform, from this archive; krew wants it named <plugin>.yaml.
    let manifest = tmp.path().join("portalloc.yaml");
    run_ok(
        "krew-manifest.sh",
        script("krew-manifest.sh")
            .arg("--dist")
            .arg(&dist)
            .arg("--out")
            .arg(&manifest)
            .args(["--platforms", &format!("{os}/{arch}")]),
    );
    let text = fs::read_to_string(&manifest).unwrap();
    assert_eq!(check_manifest(&text), [(os.to_string(), arch.to_string())]);
    assert!(text.contains(&format!("sha256: {}\n", sha256(&archive))));
    validate(&manifest);

    // A manifest whose hash is not the archive's is refused.
    let bad_root = tmp.path().join("bad-krew");
    let bad = tmp.path().join("bad/portalloc.yaml");
    fs::create_dir_all(bad.parent().unwrap()).unwrap();
    let wrong = format!("sha256: {}\n", "ab".repeat(32));
    let with_wrong_hash = text.replace(&format!("sha256: {}\n", sha256(&archive)), &wrong);
    fs::write(&bad, with_wrong_hash).unwrap();
    let refused = krew(&bad_root, os, arch)
        .arg("install")
        .arg(format!("--manifest={}", bad.display()))
        .arg(format!("--archive={}", archive.display()))
        .output()
        .unwrap();
    assert!(!refused.status.success(), "{}", show(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("checksum does not match"),
        "{}",
        show(&refused)
    );

    let root = tmp.path().join("krew");
    run_ok(
        "krew install",
        krew(&root, os, arch)
            .arg("install")
            .arg(format!("--manifest={}", manifest.display()))
            .arg(format!("--archive={}", archive.display())),
    );
    let store = root.join(format!("store/portalloc/v{VERSION}"));
    for file in ["kubectl-portalloc", "kubectl_complete-portalloc", "LICENSE"] {
        assert!(
            store.join(file).is_file(),
            "{file} not in {}",
            store.display()
        );
    }
    // krew's record of the install (`krew list` would need the index, a git clone).
    let receipt = fs::read_to_string(root.join("receipts/portalloc.yaml")).expect("a receipt");
    assert!(
        receipt.contains(&format!("version: v{VERSION}")),
        "receipt: {receipt}"
    );

    // kubectl finds the plugin through krew's bin directory and runs it.
    let kubectl = || {
        let mut command = Command::new(tools().join("kubectl"));
        command
            .env("PATH", path_with(&root))
            .env("KUBECONFIG", tmp.path().join("no-kubeconfig"))
            .env("HOME", tmp.path());
        command
    };
    let plugins = run_ok("kubectl plugin list", kubectl().args(["plugin", "list"]));
    let expected = root.join("bin/kubectl-portalloc");
    assert!(
        plugins
            .lines()
            .any(|l| l.trim() == expected.to_str().unwrap()),
        "kubectl plugin list does not show {}: {plugins}",
        expected.display()
    );
    let version = run_ok(
        "kubectl portalloc version",
        kubectl().args(["portalloc", "version"]),
    );
    assert!(
        version.starts_with(&format!("kubectl-portalloc v{VERSION} ")),
        "kubectl portalloc version printed: {version}"
    );
}

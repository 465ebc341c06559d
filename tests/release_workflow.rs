//! The GitHub Actions workflows (.github/workflows): actionlint (built from its Go module by
//! `scripts/build-actionlint.sh`, with Debian's shellcheck linting every `run:` script) accepts
//! them, and the release workflow builds, collects and publishes what a release needs: every
//! krew platform's archive on a runner of that platform, the krew manifest from exactly those
//! archives, the image from the same linux binary, and the Helm chart packaged with the plugin's
//! version (`scripts/package-chart.sh`, run here with Helm built from its Go module).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_yaml::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn show(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn actionlint() -> PathBuf {
    let output = Command::new(repo().join("scripts/build-actionlint.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/build-actionlint.sh");
    assert!(output.status.success(), "{}", show(&output));
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

fn workflows() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(repo().join(".github/workflows"))
        .expect(".github/workflows")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .collect();
    files.sort();
    files
}

fn shellcheck_installed() -> bool {
    Command::new("shellcheck")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn lint(dir: &Path, files: &[PathBuf]) -> Output {
    Command::new(actionlint())
        .current_dir(dir)
        .args(["-color=false", "-shellcheck"])
        .arg(if shellcheck_installed() {
            "shellcheck"
        } else {
            ""
        })
        .args(files)
        .output()
        .expect("run actionlint")
}

#[test]
fn actionlint_accepts_every_workflow() {
    let files = workflows();
    let names: BTreeSet<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.contains("release.yml") && names.contains("ci.yml"),
        "{names:?}"
    );
    if !shellcheck_installed() {
        assert!(
            !in_ci(),
            "shellcheck is not installed (scripts/install-deps.sh)"
        );
        eprintln!("actionlint: shellcheck not installed, run: scripts are not linted");
    }
    let output = lint(repo(), &files);
    assert!(output.status.success(), "actionlint: {}", show(&output));
}

/// The linter really looks: a broken copy of the release workflow is rejected, for an unknown
/// runner label, a job that needs a job that does not exist, and (with shellcheck) an unquoted
/// variable in a run: script.
#[test]
fn actionlint_rejects_a_broken_workflow() {
    let text = fs::read_to_string(repo().join(".github/workflows/release.yml")).unwrap();
    let broken = text
        .replace("runner: macos-15-intel", "runner: macos-12-nonexistent")
        .replace("needs: build", "needs: biuld")
        .replace(
            "scripts/krew-manifest.sh --dist dist",
            "scripts/krew-manifest.sh --dist $DIST_DIR",
        );
    assert_ne!(broken, text);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".github/workflows");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("release.yml"), broken).unwrap();
    let output = lint(tmp.path(), &[dir.join("release.yml")]);
    assert!(!output.status.success(), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("macos-12-nonexistent"), "{stdout}");
    assert!(stdout.contains("biuld"), "{stdout}");
    if shellcheck_installed() {
        assert!(stdout.contains("SC2086"), "{stdout}");
    }
}

fn release() -> Value {
    let text = fs::read_to_string(repo().join(".github/workflows/release.yml")).unwrap();
    serde_yaml::from_str(&text).expect("release.yml is YAML")
}

/// Every `run:` of a job, joined.
fn scripts(job: &Value) -> String {
    job["steps"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|s| s["run"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn release_runs_on_version_tags_and_builds_every_krew_platform_natively() {
    let workflow = release();
    let tags = &workflow["on"]["push"]["tags"];
    assert_eq!(tags, &serde_yaml::from_str::<Value>("['v*']").unwrap());

    let build = &workflow["jobs"]["build"];
    let matrix = build["strategy"]["matrix"]["include"]
        .as_sequence()
        .unwrap();
    let platforms: BTreeSet<(String, String)> = matrix
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap().to_string();
            // The runner's own architecture, so the completion hook comes from the binary itself.
            let (runner, target) = (s("runner"), s("target"));
            let native = match (s("os").as_str(), s("arch").as_str()) {
                ("linux", "amd64") => runner == "ubuntu-24.04" && target.starts_with("x86_64-"),
                ("linux", "arm64") => runner.ends_with("-arm") && target.starts_with("aarch64-"),
                ("darwin", "amd64") => runner.ends_with("-intel") && target.starts_with("x86_64-"),
                ("darwin", "arm64") => runner == "macos-15" && target.starts_with("aarch64-"),
                other => panic!("unexpected platform {other:?}"),
            };
            assert!(native, "{runner} does not natively run {target}");
            (s("os"), s("arch"))
        })
        .collect();
    let expected: BTreeSet<(String, String)> = ["linux", "darwin"]
        .iter()
        .flat_map(|os| ["amd64", "arm64"].map(|arch| (os.to_string(), arch.to_string())))
        .collect();
    assert_eq!(platforms, expected);

    let steps = scripts(build);
    assert!(
        steps.contains("scripts/build-image.sh --build-only"),
        "linux binaries are the static build of the image"
    );
    assert!(steps.contains("scripts/release-archive.sh --binary"));
    assert!(
        steps.contains("GITHUB_REF_NAME"),
        "checks the tag against Cargo.toml"
    );
}

#[test]
fn release_job_publishes_the_manifest_of_exactly_the_built_archives_and_the_image() {
    let workflow = release();
    let job = &workflow["jobs"]["release"];
    assert_eq!(job["needs"], "build");
    assert_eq!(job["permissions"]["contents"], "write");
    assert_eq!(workflow["permissions"]["contents"], "read");
    let steps = scripts(job);
    let at = |needle: &str| {
        steps
            .find(needle)
            .unwrap_or_else(|| panic!("the release job does not run {needle}"))
    };
    // Without --allow-partial: a missing platform fails the release instead of leaving it out.
    assert!(!steps.contains("--allow-partial"));
    assert!(at("sha256sum -c") < at("scripts/krew-manifest.sh"));
    assert!(at("scripts/krew-manifest.sh") < at("validate-krew-manifest"));
    assert!(at("validate-krew-manifest") < at("gh release create"));
    assert!(at("scripts/build-image.sh --binary") < at("gh release create"));
    assert!(at("scripts/package-chart.sh --out dist") < at("gh release create"));
    let create = &steps[at("gh release create")..];
    for asset in [
        "*.tar.gz",
        "*.tar.gz.sha256",
        "*_image_*.tar",
        "kubectl-portalloc-*.tgz",
        "kubectl-portalloc-*.tgz.sha256",
        "krew/portalloc.yaml",
    ] {
        assert!(create.contains(asset), "{asset} is not uploaded: {create}");
    }
    let sums = &steps[at("SHA256SUMS")..];
    assert!(sums.contains("./kubectl-portalloc-*.tgz"), "{sums}");
    // Helm is built from its Go module by the script: the job sets up Go and caches its modules.
    let go = job["steps"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("actions/setup-go@"))
        })
        .expect("setup-go in the release job");
    let cached = go["with"]["cache-dependency-path"].as_str().unwrap();
    assert!(cached.contains("tests/tools/helm/go.sum"), "{cached}");
}

fn cargo_version() -> String {
    let cargo = fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("a version in Cargo.toml")
        .to_string()
}

/// What the release job uploads: the chart at Cargo.toml's version, with the CRDs, the schema
/// and the templates, and a checksum that matches it.
#[test]
fn package_chart_packages_the_chart_at_the_plugins_version() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(repo().join("scripts/package-chart.sh"))
        .args(["--out", out.path().to_str().unwrap()])
        .output()
        .expect("run scripts/package-chart.sh");
    assert!(output.status.success(), "{}", show(&output));
    let version = cargo_version();
    let name = format!("kubectl-portalloc-{version}.tgz");
    let package = out.path().join(&name);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).lines().last(),
        Some(package.to_str().unwrap())
    );
    let listing = Command::new("tar")
        .arg("-tzf")
        .arg(&package)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    for file in [
        "kubectl-portalloc/Chart.yaml",
        "kubectl-portalloc/values.yaml",
        "kubectl-portalloc/values.schema.json",
        "kubectl-portalloc/crds/portalloc-crds.yaml",
        "kubectl-portalloc/templates/watcher.yaml",
        "kubectl-portalloc/templates/webhook-configuration.yaml",
        "kubectl-portalloc/files/argocd/PortAllocation.lua",
    ] {
        assert!(
            listing.lines().any(|l| l == file),
            "{file} not in {name}: {listing}"
        );
    }
    let chart = Command::new("tar")
        .arg("-xzOf")
        .arg(&package)
        .arg("kubectl-portalloc/Chart.yaml")
        .output()
        .unwrap();
    let chart: Value = serde_yaml::from_slice(&chart.stdout).unwrap();
    assert_eq!(chart["version"].as_str(), Some(version.as_str()));
    assert_eq!(chart["appVersion"].as_str(), Some(version.as_str()));
    let check = Command::new("sha256sum")
        .args(["-c", &format!("{name}.sha256")])
        .current_dir(out.path())
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", show(&check));
}

/// Every action is pinned by a full commit SHA, with the version in a comment.
#[test]
fn actions_are_pinned_by_commit() {
    for file in workflows() {
        let text = fs::read_to_string(&file).unwrap();
        for line in text.lines().filter(|l| l.contains("uses:")) {
            let reference = line.split("uses:").nth(1).unwrap().trim();
            let (action, rest) = reference.split_once('@').expect("action@ref");
            let sha: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
            assert!(
                sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
                "{}: {action} is not pinned by commit: {line}",
                file.display()
            );
            assert!(
                rest.contains("# v"),
                "{}: no version comment: {line}",
                file.display()
            );
        }
    }
}

//! argocd-lua against Argo CD itself: the Argo CD module (from the Go module proxy, pinned by
//! version and checksum) carries its built-in health checks with their health_test.yaml cases,
//! and its go.mod names the Lua libraries. Passing all of Argo CD's own cases is the evidence
//! that argocd-lua runs scripts the way Argo CD does.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::support::*;

/// The Argo CD release whose Lua environment argocd-lua reproduces.
const ARGO_CD: &str = "github.com/argoproj/argo-cd/v3@v3.5.1";
/// Its module checksum (as in go.sum), so the cases are exactly the pinned ones.
const ARGO_CD_SUM: &str = "h1:jtwPLEFX9mNj3jSq88ugFcScGnOZVs2DWaXFuZxrRT8=";

/// The extracted Argo CD module (downloaded once into the Go module cache, then reused).
fn argo_cd() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Outside any module, so nothing of ours is resolved or changed.
        let outside = tempfile::tempdir().unwrap();
        let output = Command::new("go")
            .args(["mod", "download", "-json", ARGO_CD])
            .current_dir(outside.path())
            .output()
            .expect("run go mod download");
        assert!(
            output.status.success(),
            "go mod download {ARGO_CD}: {}",
            show(&output)
        );
        let info: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(
            info["Sum"], ARGO_CD_SUM,
            "{ARGO_CD} is not the pinned module: {info}"
        );
        PathBuf::from(info["Dir"].as_str().expect("Dir"))
    })
}

/// How many cases the health_test.yaml files under `dir` list.
fn count_cases(dir: &Path) -> usize {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            count += count_cases(&path);
        } else if path.file_name().is_some_and(|n| n == "health_test.yaml") {
            let tests = read_yaml(&path);
            count += tests["tests"].as_sequence().map_or(0, Vec::len);
        }
    }
    count
}

#[test]
fn argocd_lua_passes_every_health_test_of_argo_cd_itself() {
    let dir = argo_cd().join("resource_customizations");
    let output = run("argocd-lua", &["-test", dir.to_str().unwrap()], None);
    let lines = json_lines(&output);
    let failed: Vec<String> = lines
        .iter()
        .filter(|l| l["pass"] != true)
        .map(|l| l.to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed:\n{}",
        failed.len(),
        lines.len(),
        failed.join("\n")
    );
    assert!(output.status.success(), "{}", show(&output));
    let listed = count_cases(&dir);
    assert!(
        listed > 500,
        "Argo CD ships many checks, found {listed} cases"
    );
    assert_eq!(lines.len(), listed);
}

/// The version a go.mod requires of a module.
fn required(go_mod: &Path, module: &str) -> String {
    let text = std::fs::read_to_string(go_mod).unwrap();
    text.lines()
        .map(|line| line.trim().trim_start_matches("require").trim())
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next() == Some(module)).then(|| fields.next().unwrap().to_string())
        })
        .unwrap_or_else(|| panic!("{} does not require {module}", go_mod.display()))
}

#[test]
fn argocd_lua_pins_the_libraries_argo_cd_pins() {
    let ours = repo().join("tests/tools/argocd-lua/go.mod");
    let theirs = argo_cd().join("go.mod");
    for module in [
        "github.com/yuin/gopher-lua",
        "layeh.com/gopher-json",
        "k8s.io/apimachinery",
        "sigs.k8s.io/yaml",
    ] {
        assert_eq!(
            required(&ours, module),
            required(&theirs, module),
            "{module}"
        );
    }
}

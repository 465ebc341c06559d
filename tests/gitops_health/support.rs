//! Running the GitOps test tools (built from pinned Go modules by scripts/build-test-tools.sh)
//! and reading what they print.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value as Json;
use serde_yaml::Value as Yaml;

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn argocd_dir() -> PathBuf {
    repo().join("integrations/argocd")
}

pub fn customizations() -> PathBuf {
    argocd_dir().join("resource_customizations")
}

/// `resource_customizations/portalloc.dev/<kind>`: health.lua, health_test.yaml, testdata/.
pub fn kind_dir(kind: &str) -> PathBuf {
    customizations().join("portalloc.dev").join(kind)
}

pub fn fixture(kind: &str, name: &str) -> PathBuf {
    kind_dir(kind).join("testdata").join(format!("{name}.yaml"))
}

pub fn read_yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The message of the fixture's condition of this type.
pub fn condition_message(kind: &str, name: &str, condition: &str) -> String {
    let obj = read_yaml(&fixture(kind, name));
    let conditions = obj["status"]["conditions"]
        .as_sequence()
        .unwrap_or_else(|| panic!("{kind}/{name} has no conditions"));
    conditions
        .iter()
        .find(|c| c["type"].as_str() == Some(condition))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_else(|| panic!("{kind}/{name} has no {condition} condition with a message"))
        .to_string()
}

pub fn show(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The directory holding kstatus and argocd-lua, built once per test binary (the script itself
/// caches across runs and locks against parallel test binaries).
fn tools() -> &'static Path {
    static TOOLS: OnceLock<PathBuf> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let output = Command::new(repo().join("scripts/build-test-tools.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/build-test-tools.sh");
        assert!(
            output.status.success(),
            "build-test-tools.sh: {}",
            show(&output)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        PathBuf::from(stdout.lines().last().expect("printed the bin dir").trim())
    })
}

/// Run a tool with these arguments, feeding `stdin` if given.
pub fn run(tool: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(tools().join(tool))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

/// Run a tool that must succeed; its JSON lines.
pub fn run_json(tool: &str, args: &[&str], stdin: Option<&str>) -> Vec<Json> {
    let output = run(tool, args, stdin);
    assert!(
        output.status.success(),
        "{tool} {args:?}: {}",
        show(&output)
    );
    json_lines(&output)
}

pub fn json_lines(output: &Output) -> Vec<Json> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// (status, message) of one printed object.
pub fn verdict(line: &Json) -> (String, String) {
    let field = |name: &str| line[name].as_str().unwrap_or_default().to_string();
    (field("status"), field("message"))
}

/// The health Argo CD shows for a single object given as YAML, through a script run directly.
pub fn lua_health(script: &str, open_libs: bool, object: &str) -> Json {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("health.lua");
    std::fs::write(&path, script).unwrap();
    let path = path.to_str().unwrap();
    let mut args = vec!["-script", path];
    if open_libs {
        args.push("-open-libs");
    }
    let mut lines = run_json("argocd-lua", &args, Some(object));
    assert_eq!(lines.len(), 1, "one object in, one line out: {lines:?}");
    lines.remove(0)
}

//! How GitOps tools judge our objects, on fixture objects in every state (no server needed):
//! Argo CD through our health checks (integrations/argocd), run in the Lua environment Argo CD
//! embeds, in both the resource_customizations form and the argocd-cm form; Flux through kstatus
//! (sigs.k8s.io/cli-utils), the library its health checks use. Both tools are built from pinned
//! Go modules by scripts/build-test-tools.sh. The fixtures are the health_test.yaml testdata.

mod runner;
mod support;
mod upstream;

use std::collections::BTreeSet;
use std::process::Command;

use support::*;

const WAITING: &str = "Waiting for kubectl portalloc sync: no ports allocated yet";
const GEN2_NOT_SYNCED: &str = "Waiting for kubectl portalloc sync: spec generation 2 not yet allocated (status is for generation 1)";

/// What a message must be: given, or the fixture's condition of that type says it.
#[derive(Clone, Copy, Debug)]
enum Msg {
    Is(&'static str),
    FromCondition(&'static str),
}

/// One fixture and what Argo CD (through our check) and Flux (through kstatus) must say of it.
struct State {
    kind: &'static str,
    fixture: &'static str,
    argocd: (&'static str, Msg),
    kstatus: (&'static str, Msg),
}

const fn state(
    kind: &'static str,
    fixture: &'static str,
    argocd: (&'static str, Msg),
    kstatus: (&'static str, Msg),
) -> State {
    State {
        kind,
        fixture,
        argocd,
        kstatus,
    }
}

const PA: &str = "PortAllocation";
const PP: &str = "PortPool";

fn states() -> Vec<State> {
    use Msg::*;
    vec![
        // Applied by GitOps, never synced: no status. kstatus cannot tell (no generation
        // observed, no conditions): Current. This is the gap the API server has to close.
        state(
            PA,
            "unsynced",
            ("Progressing", Is(WAITING)),
            ("Current", Is("Resource is current")),
        ),
        state(
            PA,
            "unsynced-generation-zero",
            ("Progressing", Is(WAITING)),
            (
                "InProgress",
                Is("PortAllocation generation is 1, but latest observed generation is 0"),
            ),
        ),
        state(
            PA,
            "allocated",
            ("Healthy", FromCondition("Ready")),
            ("Current", Is("Resource is Ready")),
        ),
        state(
            PA,
            "spec-changed",
            ("Progressing", Is(GEN2_NOT_SYNCED)),
            (
                "InProgress",
                Is("PortAllocation generation is 2, but latest observed generation is 1"),
            ),
        ),
        state(
            PA,
            "reconciling",
            ("Progressing", FromCondition("Reconciling")),
            ("InProgress", FromCondition("Reconciling")),
        ),
        state(
            PA,
            "stalled-pool-full",
            ("Degraded", FromCondition("Stalled")),
            ("Failed", FromCondition("Stalled")),
        ),
        state(
            PA,
            "stalled-pool-not-found",
            ("Degraded", FromCondition("Stalled")),
            ("Failed", FromCondition("Stalled")),
        ),
        // A failure recorded for generation 1 says nothing about the fixed spec of generation 2.
        state(
            PA,
            "stalled-then-spec-changed",
            ("Progressing", Is(GEN2_NOT_SYNCED)),
            (
                "InProgress",
                Is("PortAllocation generation is 2, but latest observed generation is 1"),
            ),
        ),
        state(
            PP,
            "new",
            ("Healthy", Is("PortPool exists")),
            ("Current", Is("Resource is current")),
        ),
        state(
            PP,
            "defaulted-status",
            ("Healthy", Is("PortPool exists")),
            ("Current", Is("Resource is current")),
        ),
        state(
            PP,
            "sized",
            ("Healthy", Is("PortPool of 2768 ports")),
            ("Current", Is("Resource is current")),
        ),
        // The usage the watcher counted, and when.
        state(
            PP,
            "counted",
            (
                "Healthy",
                Is(
                    "PortPool of 2768 ports: 120 allocated, 2648 free (largest free run 2510), counted at 2026-11-22T15:04:10Z",
                ),
            ),
            ("Current", Is("Resource is current")),
        ),
        // Sharing ports with another pool (written before the overlap policy): said first, and
        // Healthy, as kstatus (which knows no Overlap condition) says Current.
        state(
            PP,
            "overlap",
            (
                "Healthy",
                Is(
                    "PortPool shares TCP ports 32000-32767 with PortPool cpu-ports (change the ranges of one of them); PortPool of 2768 ports: 120 allocated, 2648 free (largest free run 2510), counted at 2026-11-22T15:04:10Z",
                ),
            ),
            ("Current", Is("Resource is current")),
        ),
    ]
}

fn expected_message(s: &State, msg: Msg) -> String {
    match msg {
        Msg::Is(text) => text.to_string(),
        Msg::FromCondition(condition) => condition_message(s.kind, s.fixture, condition),
    }
}

fn fixture_paths(states: &[State]) -> Vec<String> {
    states
        .iter()
        .map(|s| fixture(s.kind, s.fixture).to_str().unwrap().to_string())
        .collect()
}

/// Run a tool on every fixture at once and check each object's verdict against `pick`.
fn check_states(tool: &str, args: &[&str], pick: fn(&State) -> (&'static str, Msg)) {
    let states = states();
    let paths = fixture_paths(&states);
    let mut all_args: Vec<&str> = args.to_vec();
    all_args.extend(paths.iter().map(String::as_str));
    let lines = run_json(tool, &all_args, None);
    assert_eq!(
        lines.len(),
        states.len(),
        "one line per fixture: {lines:#?}"
    );
    let mut wrong = Vec::new();
    for (s, line) in states.iter().zip(&lines) {
        let (status, msg) = pick(s);
        let want = (status.to_string(), expected_message(s, msg));
        if verdict(line) != want {
            wrong.push(format!(
                "{}/{}: want {want:?}, got {:?}",
                s.kind,
                s.fixture,
                verdict(line)
            ));
        }
        assert_eq!(line["kind"], s.kind, "{line}");
    }
    assert!(wrong.is_empty(), "{tool} {args:?}:\n{}", wrong.join("\n"));
}

#[test]
fn argocd_health_of_every_state_from_the_resource_customizations_files() {
    // Argo CD opens the standard libraries for the scripts it ships (the upstream form).
    for kind in [PA, PP] {
        let script = kind_dir(kind).join("health.lua");
        let script = script.to_str().unwrap();
        let states: Vec<State> = states().into_iter().filter(|s| s.kind == kind).collect();
        let paths = fixture_paths(&states);
        let mut args = vec!["-script", script, "-open-libs"];
        args.extend(paths.iter().map(String::as_str));
        let lines = run_json("argocd-lua", &args, None);
        assert_eq!(lines.len(), states.len());
        for (s, line) in states.iter().zip(&lines) {
            let want = (s.argocd.0.to_string(), expected_message(s, s.argocd.1));
            assert_eq!(verdict(line), want, "{kind}/{}", s.fixture);
        }
    }
}

#[test]
fn argocd_health_of_every_state_from_argocd_cm() {
    // As users install it: argocd-cm keys, no useOpenLibs, so the checks run without the
    // standard libraries.
    let cm = argocd_dir().join("argocd-cm.yaml");
    check_states("argocd-lua", &["-argocd-cm", cm.to_str().unwrap()], |s| {
        s.argocd
    });
}

#[test]
fn kstatus_of_every_state_as_flux_computes_it() {
    check_states("kstatus", &[], |s| s.kstatus);
}

#[test]
fn argocd_and_flux_agree_on_every_state_but_the_never_synced_object_without_status() {
    let agree = |argocd: &str, kstatus: &str| {
        matches!(
            (argocd, kstatus),
            ("Healthy", "Current") | ("Progressing", "InProgress") | ("Degraded", "Failed")
        )
    };
    let disagree: Vec<String> = states()
        .iter()
        .filter(|s| !agree(s.argocd.0, s.kstatus.0))
        .map(|s| format!("{}/{}", s.kind, s.fixture))
        .collect();
    assert_eq!(disagree, ["PortAllocation/unsynced"]);
}

#[test]
fn deleting_objects_are_pending_deletion_in_argocd_and_terminating_in_kstatus() {
    let cm = argocd_dir().join("argocd-cm.yaml");
    for (kind, name) in [(PA, "allocated"), (PA, "stalled-pool-full"), (PP, "sized")] {
        let text = std::fs::read_to_string(fixture(kind, name)).unwrap();
        let deleting = text.replacen(
            "metadata:\n",
            "metadata:\n  deletionTimestamp: \"2026-11-22T16:00:00Z\"\n  finalizers: [example.com/keep]\n",
            1,
        );
        assert_ne!(deleting, text);
        let argocd = run_json(
            "argocd-lua",
            &["-argocd-cm", cm.to_str().unwrap()],
            Some(&deleting),
        );
        assert_eq!(
            verdict(&argocd[0]),
            ("Progressing".into(), "Pending deletion".into())
        );
        let kstatus = run_json("kstatus", &[], Some(&deleting));
        assert_eq!(
            verdict(&kstatus[0]),
            (
                "Terminating".into(),
                "Resource scheduled for deletion".into()
            )
        );
    }
}

#[test]
fn argocd_cm_form_is_generated_from_the_files() {
    let generator = argocd_dir().join("gen-argocd-cm.sh");
    let output = Command::new(&generator).arg("--stdout").output().unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let checked_in = std::fs::read_to_string(argocd_dir().join("argocd-cm.yaml")).unwrap();
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        checked_in,
        "argocd-cm.yaml is stale: run integrations/argocd/gen-argocd-cm.sh"
    );

    let cm = read_yaml(&argocd_dir().join("argocd-cm.yaml"));
    assert_eq!(cm["kind"].as_str(), Some("ConfigMap"));
    assert_eq!(cm["metadata"]["name"].as_str(), Some("argocd-cm"));
    let data = cm["data"].as_mapping().expect("data");
    let keys: BTreeSet<&str> = data.keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            "resource.customizations.health.portalloc.dev_PortAllocation",
            "resource.customizations.health.portalloc.dev_PortPool",
        ])
    );
    for kind in [PA, PP] {
        let key = format!("resource.customizations.health.portalloc.dev_{kind}");
        let file = std::fs::read_to_string(kind_dir(kind).join("health.lua")).unwrap();
        assert_eq!(data[key.as_str()].as_str(), Some(file.as_str()), "{key}");
    }
}

/// Every (inputPath, status) listed by the health_test.yaml files.
fn listed_cases() -> Vec<(String, String)> {
    let mut cases = Vec::new();
    for kind in [PA, PP] {
        let tests = read_yaml(&kind_dir(kind).join("health_test.yaml"));
        for test in tests["tests"].as_sequence().expect("tests") {
            let input = test["inputPath"].as_str().expect("inputPath");
            let status = test["healthStatus"]["status"].as_str().expect("status");
            cases.push((format!("portalloc.dev/{kind}/{input}"), status.to_string()));
        }
    }
    cases
}

#[test]
fn health_test_yaml_cases_pass_as_argo_cd_tests_its_own_checks() {
    let dir = customizations();
    let lines = run_json("argocd-lua", &["-test", dir.to_str().unwrap()], None);
    let ran: Vec<(String, String)> = lines
        .iter()
        .map(|l| {
            assert_eq!(l["pass"], true, "{l}");
            // Argo CD picks a script by the object's kind: each case must use its own directory's.
            let case = l["case"].as_str().unwrap();
            assert!(
                case.starts_with(&format!("{}/", l["script"].as_str().unwrap())),
                "{l}"
            );
            (
                l["case"].as_str().unwrap().to_string(),
                l["want"]["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut listed = listed_cases();
    let mut ran_sorted = ran.clone();
    listed.sort();
    ran_sorted.sort();
    assert_eq!(ran_sorted, listed);

    // Every fixture is a case, and the cases cover every health the checks can give our kinds.
    let fixtures: BTreeSet<String> = states()
        .iter()
        .map(|s| format!("portalloc.dev/{}/testdata/{}.yaml", s.kind, s.fixture))
        .collect();
    let cased: BTreeSet<String> = ran.iter().map(|(case, _)| case.clone()).collect();
    assert_eq!(cased, fixtures);
    let statuses: BTreeSet<&str> = ran.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        statuses,
        BTreeSet::from(["Degraded", "Healthy", "Progressing"])
    );
}

#[test]
fn a_wrong_expectation_in_health_test_yaml_fails() {
    let copy = tempfile::tempdir().unwrap();
    let status = Command::new("cp")
        .arg("-r")
        .arg(customizations())
        .arg(copy.path())
        .status()
        .unwrap();
    assert!(status.success());
    let root = copy.path().join("resource_customizations");
    let tests = root.join("portalloc.dev/PortPool/health_test.yaml");
    let text = std::fs::read_to_string(&tests).unwrap();
    let wrong = text.replacen("PortPool of 2768 ports", "PortPool of 2769 ports", 1);
    assert_ne!(wrong, text);
    std::fs::write(&tests, wrong).unwrap();

    let output = run("argocd-lua", &["-test", root.to_str().unwrap()], None);
    assert_eq!(output.status.code(), Some(1), "{}", show(&output));
    let failed: Vec<String> = json_lines(&output)
        .iter()
        .filter(|l| l["pass"] != true)
        .map(|l| l["case"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(failed, ["portalloc.dev/PortPool/testdata/sized.yaml"]);
}

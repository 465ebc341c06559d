//! The test tools behave as what they stand in for, so a passing health test means something:
//! argocd-lua gives scripts Argo CD's Lua environment (libraries, globals, limits, result
//! handling), and kstatus reads objects as a client of the API server does.

use std::time::{Duration, Instant};

use super::support::*;

const OBJ: &str = "apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: x, namespace: ns, generation: 7}
spec:
  roles: [{name: a}, {name: b}]
";

fn health(script: &str, open_libs: bool) -> (String, String) {
    verdict(&lua_health(script, open_libs, OBJ))
}

#[test]
fn standard_libraries_only_with_open_libs() {
    let script = r#"return {status = "Healthy", message = string.format("%d", 5)}"#;
    let closed = lua_health(script, false, OBJ);
    assert_eq!(closed["status"], "Unknown", "{closed}");
    let error = closed["error"].as_str().unwrap();
    assert!(error.contains("string"), "{error}");
    assert!(
        !error.contains("stack traceback"),
        "Argo CD drops the trace: {error}"
    );
    assert_eq!(health(script, true), ("Healthy".into(), "5".into()));
}

#[test]
fn base_table_and_a_reduced_os_are_always_there() {
    let script = r#"
        local t = {}
        table.insert(t, tostring(type(os.time())))
        table.insert(t, tostring(os.exit == nil))
        table.insert(t, tostring(os.getenv == nil))
        local required = require("os")
        table.insert(t, tostring(required.time ~= nil and required.exit == nil))
        table.insert(t, tostring(type(actionParams)))
        return {status = "Healthy", message = table.concat(t, ",")}"#;
    assert_eq!(
        health(script, false),
        ("Healthy".into(), "number,true,true,true,table".into())
    );
    // With the standard libraries open first, gopher-lua's whole os table stays (as in Argo CD).
    let (_, open) = health(script, true);
    assert!(open.starts_with("number,false,false,"), "{open}");
    let date = r#"return {status = "Healthy", message = os.date("!%Y", 0)}"#;
    let (_, year) = health(date, false);
    assert!(year.len() == 4 && year.starts_with("19"), "{year}");
}

#[test]
fn the_object_is_the_global_obj_with_numbers_and_arrays() {
    let script = r#"
        local names = ""
        for _, role in ipairs(obj.spec.roles) do names = names .. role.name end
        return {status = "Progressing", message = obj.kind .. " " .. (obj.metadata.generation + 1) .. " " .. names}"#;
    assert_eq!(
        health(script, false),
        ("Progressing".into(), "PortAllocation 8 ab".into())
    );
}

#[test]
fn results_are_read_as_argo_cd_reads_them() {
    let cases = [
        ("return {}", ("", "")),
        ("return nil", ("", "")),
        (
            r#"return {status = "Fine"}"#,
            ("Unknown", "Lua returned an invalid health status"),
        ),
        (r#"return {status = 3}"#, ("", "")),
        (
            r#"return {status = "Suspended", message = "paused"}"#,
            ("Suspended", "paused"),
        ),
        (r#"return {status = "Missing"}"#, ("Missing", "")),
    ];
    for (script, (status, message)) in cases {
        let line = lua_health(script, false, OBJ);
        assert_eq!(line.get("error"), None, "{script}: {line}");
        assert_eq!(verdict(&line), (status.into(), message.into()), "{script}");
    }
    let line = lua_health(r#"return "Healthy""#, false, OBJ);
    assert_eq!(line["status"], "Unknown");
    assert_eq!(
        line["error"],
        "expect table output from Lua script, not string"
    );
}

#[test]
fn a_script_that_never_ends_is_stopped_after_a_second() {
    let start = Instant::now();
    let line = lua_health("while true do end", false, OBJ);
    let took = start.elapsed();
    assert_eq!(line["status"], "Unknown", "{line}");
    assert!(
        line["error"]
            .as_str()
            .unwrap()
            .contains("context deadline exceeded"),
        "{line}"
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "{took:?}"
    );
}

#[test]
fn argocd_cm_without_a_script_for_the_kind_gives_no_health() {
    let cm = argocd_dir().join("argocd-cm.yaml");
    let lines = run_json(
        "argocd-lua",
        &["-argocd-cm", cm.to_str().unwrap()],
        Some("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"),
    );
    assert_eq!(lines[0]["noHealthCheck"], true, "{}", lines[0]);
    assert_eq!(verdict(&lines[0]), ("".into(), "".into()));
}

#[test]
fn kstatus_reads_lists_and_json_and_whole_numbers_as_integers() {
    let list = r#"{"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "portalloc.dev/v1alpha1", "kind": "PortPool", "metadata": {"name": "p", "generation": 1}},
        {"apiVersion": "portalloc.dev/v1alpha1", "kind": "PortAllocation",
         "metadata": {"name": "a", "namespace": "n", "generation": 3}, "status": {"observedGeneration": 3}}]}"#;
    let lines = run_json("kstatus", &[], Some(list));
    let got: Vec<(String, String, String)> = lines
        .iter()
        .map(|l| {
            (
                l["kind"].as_str().unwrap().into(),
                l["name"].as_str().unwrap().into(),
                l["status"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("PortPool".into(), "p".into(), "Current".into()),
            ("PortAllocation".into(), "a".into(), "Current".into()),
        ]
    );
    assert_eq!(lines[1]["namespace"], "n");

    // A generation no API server would send: kstatus cannot compute, and says Unknown.
    let odd = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, generation: 1.5}\n";
    let line = &run_json("kstatus", &[], Some(odd))[0];
    assert_eq!(line["status"], "Unknown");
    assert!(
        line["message"].as_str().unwrap().contains("generation"),
        "{line}"
    );
}

#[test]
fn kstatus_text_output_is_one_line_per_object() {
    let input = std::fs::read_to_string(fixture("PortAllocation", "stalled-pool-full")).unwrap();
    let output = run("kstatus", &["-o", "text"], Some(&input));
    assert!(output.status.success(), "{}", show(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    let fields: Vec<&str> = text.trim_end().split('\t').collect();
    assert_eq!(
        fields[..2],
        ["inference/PortAllocation/sglang-pd", "Failed"]
    );
    assert_eq!(text.lines().count(), 1);
}

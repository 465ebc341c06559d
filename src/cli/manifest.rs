//! Reading PortPool and PortAllocation manifests from a file or stdin (`-f -`).

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{CliError, Exit};
use crate::api::{GROUP, PortAllocation, PortPool, VERSION};

/// One document of a manifest stream.
#[derive(Clone, Debug)]
pub enum Manifest {
    Pool(PortPool),
    Allocation(PortAllocation),
}

/// Read every document; fail on the first bad one, naming it, before anything is applied.
pub fn read_manifests(path: &str) -> Result<Vec<Manifest>, CliError> {
    read_manifest_paths(&[path.to_string()], false)
}

/// Every document of every `-f`: a file, `-` for standard input, or a directory, whose
/// `*.yaml`, `*.yml` and `*.json` files are read in name order (and those of its
/// subdirectories with `recursive`, as `kubectl -R` does). Fails on the first bad document.
pub fn read_manifest_paths(paths: &[String], recursive: bool) -> Result<Vec<Manifest>, CliError> {
    let invalid = |message: String| CliError::new(Exit::Invalid, message);
    let mut manifests = Vec::new();
    for path in paths {
        if path == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| invalid(format!("cannot read standard input: {e}")))?;
            manifests.extend(parse_documents("<stdin>", &text)?);
            continue;
        }
        let files = manifest_files(Path::new(path), recursive, true)?;
        if files.is_empty() {
            return Err(invalid(format!(
                "{path}: no *.yaml, *.yml or *.json files in this directory{}",
                if recursive {
                    ""
                } else {
                    " (-R reads its subdirectories)"
                }
            )));
        }
        for file in files {
            let source = file.display().to_string();
            let text = std::fs::read_to_string(&file)
                .map_err(|e| invalid(format!("cannot read {source}: {e}")))?;
            manifests.extend(parse_documents(&source, &text)?);
        }
    }
    if manifests.is_empty() {
        return Err(invalid(format!(
            "{}: no PortPool or PortAllocation found",
            match paths {
                [one] if one == "-" => "<stdin>".to_string(),
                _ => paths.join(", "),
            }
        )));
    }
    Ok(manifests)
}

/// `path` itself when it is a file; a directory's manifest files, sorted, descending into
/// subdirectories when `recursive` (`top`: the directory named on the command line).
fn manifest_files(path: &Path, recursive: bool, top: bool) -> Result<Vec<PathBuf>, CliError> {
    let unreadable = |e: std::io::Error| {
        CliError::new(
            Exit::Invalid,
            format!("cannot read {}: {e}", path.display()),
        )
    };
    if !path.is_dir() {
        // A file named on the command line is read whatever its extension, as kubectl does.
        return Ok(if top {
            vec![path.to_path_buf()]
        } else {
            Vec::new()
        });
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(unreadable)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(unreadable)?;
    entries.sort();
    let mut files = Vec::new();
    for entry in entries {
        if entry.is_dir() {
            if recursive {
                files.extend(manifest_files(&entry, true, false)?);
            }
        } else if entry
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        {
            files.push(entry);
        }
    }
    Ok(files)
}

/// One text's documents, at least one of ours (what the tests read).
#[cfg(test)]
fn parse_manifests(source: &str, text: &str) -> Result<Vec<Manifest>, CliError> {
    let manifests = parse_documents(source, text)?;
    if manifests.is_empty() {
        return Err(CliError::new(
            Exit::Invalid,
            format!("{source}: no PortPool or PortAllocation found"),
        ));
    }
    Ok(manifests)
}

/// The PortPools and PortAllocations of one file (none is fine: a directory may hold others).
fn parse_documents(source: &str, text: &str) -> Result<Vec<Manifest>, CliError> {
    let invalid = |message: String| CliError::new(Exit::Invalid, message);
    let mut manifests = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let at = format!("{source}: document {}", index + 1);
        let value = serde_yaml::Value::deserialize(document)
            .map_err(|e| invalid(format!("{at}: not valid YAML: {e}")))?;
        if value.is_null() {
            continue;
        }
        let api_version = value
            .get("apiVersion")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let kind = value
            .get("kind")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let expected = format!("{GROUP}/{VERSION}");
        // Mixed files (the CRs next to the workloads that use them) are normal: other kinds are
        // kubectl's business. Within our own group, an unknown kind or version is a mistake.
        let ours = api_version.split('/').next() == Some(GROUP);
        if !ours && !api_version.is_empty() && !kind.is_empty() {
            eprintln!(
                "{source}: document {}: skipping {kind} ({api_version}): not a portalloc.dev kind",
                index + 1
            );
            continue;
        }
        if api_version != expected || !matches!(kind, "PortPool" | "PortAllocation") {
            return Err(invalid(format!(
                "{at}: kind {kind:?} of apiVersion {api_version:?} is not for this plugin: \
                 expected kind PortPool or PortAllocation with apiVersion {expected}"
            )));
        }
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            return Err(invalid(format!("{at}: {kind} has no metadata.name")));
        }
        let at = format!("{at} ({kind} {name:?})");
        let manifest = if kind == "PortPool" {
            Manifest::Pool(strict(&at, value)?)
        } else {
            Manifest::Allocation(strict(&at, value)?)
        };
        manifests.push(manifest);
    }
    Ok(manifests)
}

/// Deserialize, refusing fields the type does not have: a typo like `replica:` must not be
/// silently dropped.
fn strict<T: serde::de::DeserializeOwned>(
    at: &str,
    value: serde_yaml::Value,
) -> Result<T, CliError> {
    let mut unknown = Vec::new();
    let copy = value.clone();
    let typed: Result<T, _> = serde_ignored::deserialize(value, |path| {
        let path = path.to_string();
        // apiVersion and kind were checked above; the typed object does not keep them.
        if !path.starts_with("status") && path != "apiVersion" && path != "kind" {
            unknown.push(path);
        }
    });
    // An unknown field is usually the cause of a missing one (`range:` for `ranges:`): say it first.
    match (typed, unknown.first()) {
        (Ok(typed), None) => Ok(typed),
        (Ok(_), Some(field)) => Err(CliError::new(
            Exit::Invalid,
            format!("{at}: unknown field {field:?}"),
        )),
        (Err(e), Some(field)) => Err(CliError::new(
            Exit::Invalid,
            format!("{at}: unknown field {field:?} ({e})"),
        )),
        (Err(e), None) => Err(CliError::new(
            Exit::Invalid,
            format!(
                "{at}: {}",
                with_field::<T>(copy).unwrap_or_else(|| e.to_string())
            ),
        )),
    }
}

/// The same error with the field it is about (`spec.roles[0].replicas: invalid type: ...`):
/// deserializing from a `Value` loses the path, deserializing from text keeps it. The line and
/// column would be those of the re-serialized document, not the user's, so they are dropped.
fn with_field<T: serde::de::DeserializeOwned>(value: serde_yaml::Value) -> Option<String> {
    let text = serde_yaml::to_string(&value).ok()?;
    let message = serde_yaml::from_str::<T>(&text).err()?.to_string();
    let message = match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message,
    };
    message.contains(": ").then_some(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "
apiVersion: portalloc.dev/v1alpha1
kind: PortPool
metadata: {name: p}
spec: {ranges: [\"30000-30100\"]}
---
apiVersion: portalloc.dev/v1alpha1
kind: PortAllocation
metadata: {name: a, namespace: ns}
spec:
  pool: p
  roles:
  - {name: web, replicas: 2, ports: [{name: http, env: HTTP_PORT}]}
";

    #[test]
    fn reads_pools_and_allocations() {
        let manifests = parse_manifests("t", GOOD).unwrap();
        assert!(matches!(&manifests[0], Manifest::Pool(p) if p.spec.ranges.len() == 1));
        assert!(matches!(&manifests[1], Manifest::Allocation(a) if a.spec.roles[0].replicas == 2));
    }

    #[test]
    fn bad_documents_are_named() {
        let cases = [
            (
                "kind: Pod\napiVersion: v1\nmetadata: {name: x}".to_string(),
                "no PortPool or PortAllocation found",
            ),
            (
                str::replace(GOOD, "kind: PortPool", "kind: PortPol"),
                "document 1: kind \"PortPol\"",
            ),
            (
                str::replace(GOOD, "v1alpha1\nkind: PortPool", "v1\nkind: PortPool"),
                "kind \"PortPool\" of apiVersion \"portalloc.dev/v1\"",
            ),
            (
                "metadata: {name: x}".to_string(),
                "kind \"\" of apiVersion \"\"",
            ),
            (
                str::replace(GOOD, "replicas: 2", "replica: 2"),
                "document 2 (PortAllocation \"a\"): ",
            ),
            (
                str::replace(GOOD, "ranges:", "range:"),
                "unknown field \"spec.range\"",
            ),
            ("a: [".to_string(), "not valid YAML"),
            (String::new(), "no PortPool or PortAllocation"),
            (str::replace(GOOD, "name: p}", "}"), "has no metadata.name"),
        ];
        for (text, expected) in cases {
            let err = parse_manifests("t", &text).unwrap_err();
            assert_eq!(err.exit, Exit::Invalid);
            assert!(
                err.message.contains(expected),
                "{expected:?} not in: {}",
                err.message
            );
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_field() {
        let err =
            parse_manifests("t", &str::replace(GOOD, "replicas: 2", "replicas: two")).unwrap_err();
        assert!(
            err.message.ends_with(
                "(PortAllocation \"a\"): spec.roles[0].replicas: invalid type: string \"two\", expected i32"
            ),
            "{}",
            err.message
        );
    }

    #[test]
    fn misspelled_fields_are_refused_not_dropped() {
        let text = str::replace(GOOD, "env: HTTP_PORT", "env: HTTP_PORT, prot: 80");
        let err = parse_manifests("t", &text).unwrap_err();
        assert!(
            err.message
                .contains("unknown field \"spec.roles.0.ports.0.prot\""),
            "{}",
            err.message
        );
    }
}

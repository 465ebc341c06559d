//! The JSON inside RBG's `port-allocator` and `component-discovery` annotations, read field by
//! field so that every error names the field path inside the annotation.

use serde_json::{Map, Value};

use super::Failure;
use crate::api::PortScope;

pub(super) struct Allocation {
    pub name: String,
    pub env: String,
    pub scope: PortScope,
    pub annotation_key: Option<String>,
}

/// A `references` entry of a role's `port-allocator` annotation: the env variable and the
/// `role.port` it takes its value from, as RBG writes it (the import turns it into a
/// [`crate::api::PortReference`]).
pub(super) struct AllocatorReference {
    pub env: String,
    pub from: String,
    /// Field path of `from`.
    pub field: String,
}

pub(super) struct AllocatorConfig {
    pub allocations: Vec<Allocation>,
    pub references: Vec<AllocatorReference>,
}

/// A `portRefs` or `addressRefs` entry: the pod `index` of `component` in the same instance.
pub(super) struct ComponentRef {
    pub env: String,
    pub component: String,
    /// Only for portRefs.
    pub port_name: String,
    pub index: i32,
    /// Field path of the entry.
    pub field: String,
}

pub(super) struct Discovery {
    pub address_refs: Vec<ComponentRef>,
    pub port_refs: Vec<ComponentRef>,
}

fn parse_object(text: &str, field: &str, what: &str) -> Result<Map<String, Value>, Failure> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Failure::new(field, format!("{what} must be a JSON object"))),
        Err(e) => Err(Failure::new(field, format!("not valid {what} JSON: {e}"))),
    }
}

fn entries<'a>(
    map: &'a Map<String, Value>,
    key: &str,
    field: &str,
) -> Result<&'a [Value], Failure> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(list)) => Ok(list),
        Some(_) => Err(Failure::new(format!("{field}.{key}"), "must be a list")),
    }
}

fn text(entry: &Value, key: &str, at: &str, required: bool) -> Result<Option<String>, Failure> {
    match entry.get(key) {
        None | Some(Value::Null) if !required => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(Value::String(_)) if !required => Ok(None),
        None | Some(Value::Null) | Some(Value::String(_)) => {
            Err(Failure::new(format!("{at}.{key}"), "is required"))
        }
        Some(other) => Err(Failure::new(
            format!("{at}.{key}"),
            format!("{other} is not a string"),
        )),
    }
}

fn required(entry: &Value, key: &str, at: &str) -> Result<String, Failure> {
    Ok(text(entry, key, at, true)?.unwrap_or_default())
}

pub(super) fn parse_allocator(value: &str, field: &str) -> Result<AllocatorConfig, Failure> {
    let map = parse_object(value, field, "port-allocator")?;
    let mut allocations = Vec::new();
    for (j, entry) in entries(&map, "allocations", field)?.iter().enumerate() {
        let at = format!("{field}.allocations[{j}]");
        // `scope` is RBG's field today; `policy: Dynamic|Static` is its earlier spelling.
        let scope = match (
            text(entry, "scope", &at, false)?.as_deref(),
            text(entry, "policy", &at, false)?.as_deref(),
        ) {
            (Some("PodScoped"), _) | (None, Some("Dynamic")) | (None, None) => PortScope::PodScoped,
            (Some("RoleScoped"), _) | (None, Some("Static")) => PortScope::RoleScoped,
            (Some(other), _) => {
                return Err(Failure::new(
                    format!("{at}.scope"),
                    format!("{other:?} is not PodScoped or RoleScoped"),
                ));
            }
            (None, Some(other)) => {
                return Err(Failure::new(
                    format!("{at}.policy"),
                    format!("{other:?} is not Dynamic or Static"),
                ));
            }
        };
        allocations.push(Allocation {
            name: required(entry, "name", &at)?,
            env: required(entry, "env", &at)?,
            scope,
            annotation_key: text(entry, "annotationKey", &at, false)?,
        });
    }
    let mut references = Vec::new();
    for (j, entry) in entries(&map, "references", field)?.iter().enumerate() {
        let at = format!("{field}.references[{j}]");
        references.push(AllocatorReference {
            env: required(entry, "env", &at)?,
            from: required(entry, "from", &at)?,
            field: format!("{at}.from"),
        });
    }
    Ok(AllocatorConfig {
        allocations,
        references,
    })
}

pub(super) fn parse_discovery(value: &str, field: &str) -> Result<Discovery, Failure> {
    let map = parse_object(value, field, "component-discovery")?;
    let read = |key: &str, with_port: bool| -> Result<Vec<ComponentRef>, Failure> {
        let mut out = Vec::new();
        for (j, entry) in entries(&map, key, field)?.iter().enumerate() {
            let at = format!("{field}.{key}[{j}]");
            let index = match entry.get("index") {
                None | Some(Value::Null) => 0,
                Some(v) => v
                    .as_i64()
                    .filter(|n| (0..=i64::from(i32::MAX)).contains(n))
                    .ok_or_else(|| {
                        Failure::new(format!("{at}.index"), format!("{v} is not a pod index"))
                    })? as i32,
            };
            out.push(ComponentRef {
                env: required(entry, "env", &at)?,
                component: required(entry, "component", &at)?,
                port_name: if with_port {
                    required(entry, "portName", &at)?
                } else {
                    String::new()
                },
                index,
                field: at,
            });
        }
        Ok(out)
    };
    Ok(Discovery {
        address_refs: read("addressRefs", false)?,
        port_refs: read("portRefs", true)?,
    })
}

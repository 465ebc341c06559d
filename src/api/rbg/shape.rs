//! Reading a RoleBasedGroup (v1alpha1 or v1alpha2, or an RBG Instance) into roles and
//! components, each component with the annotations RBG merges into its pods.
//!
//! RBG runs every role as role instances made of components: a standalone role has one
//! component named after the role (one pod), a leaderWorkerPattern role has `leader` (one pod)
//! and `worker` (size − 1 pods), a customComponentsPattern role has its listed components
//! (`size` pods each, default 1). v1alpha1 roles convert to the same three patterns.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Failure;

/// An annotation as a component's pods see it, with the field it was read from.
pub(super) struct Annotation {
    pub value: String,
    pub field: String,
}

pub(super) struct Component {
    /// RBG's component name (`leader`, `worker`, the role name, or a custom name).
    pub name: String,
    /// The PortAllocation role it becomes.
    pub role: String,
    /// Pods per role instance.
    pub size: i32,
    /// Merged pod-template annotations, by key.
    pub annotations: BTreeMap<String, Annotation>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Pattern {
    Standalone,
    LeaderWorker,
    Custom,
}

pub(super) struct RbgRole {
    pub name: String,
    /// Field path of the role, e.g. `spec.roles[1]`.
    pub at: String,
    /// Role instances (RBG `replicas`).
    pub replicas: i32,
    pub pattern: Pattern,
    pub components: Vec<Component>,
}

pub(super) struct Shape {
    /// v1alpha2 semantics for references (`<role>.<component>.<port>` only).
    pub v1alpha2: bool,
    pub roles: Vec<RbgRole>,
    /// Role- and group-level RBG annotations found on the way (none are translated).
    pub untranslated: Vec<(String, String)>,
}

const PATTERNS: [&str; 3] = [
    "standalonePattern",
    "leaderWorkerPattern",
    "customComponentsPattern",
];

pub(super) fn read(object: &Value) -> Result<Shape, Failure> {
    let mut untranslated = Vec::new();
    collect_untranslated(
        &object["metadata"]["annotations"],
        "metadata.annotations",
        &mut untranslated,
    );
    // An RBG Instance lists its components at the top: each is a one-component role.
    let (roles_json, list_field) = match (&object["spec"]["roles"], &object["spec"]["components"]) {
        (Value::Array(roles), _) => (roles, "spec.roles"),
        (_, Value::Array(components)) => (components, "spec.components"),
        _ => {
            return Err(Failure::new(
                "spec.roles",
                "no roles found: is this a RoleBasedGroup?",
            ));
        }
    };
    let v1alpha2 = object["apiVersion"]
        .as_str()
        .is_some_and(|v| v.ends_with("/v1alpha2"))
        || roles_json
            .iter()
            .any(|r| PATTERNS.iter().any(|p| r.get(*p).is_some()));
    let mut roles = Vec::new();
    for (i, role_json) in roles_json.iter().enumerate() {
        let at = format!("{list_field}[{i}]");
        let name = role_json["name"].as_str().unwrap_or_default().to_string();
        if name.is_empty() {
            return Err(Failure::new(format!("{at}.name"), "missing"));
        }
        collect_untranslated(
            &role_json["annotations"],
            &format!("{at}.annotations"),
            &mut untranslated,
        );
        let (replicas_key, replicas_default) = if list_field == "spec.components" {
            ("size", 1)
        } else {
            ("replicas", 1)
        };
        let replicas = count(role_json, replicas_key, &at, replicas_default, 0)?;
        let role = if v1alpha2 {
            read_v1alpha2_role(object, role_json, name, at, replicas)?
        } else {
            read_v1alpha1_role(object, role_json, name, at, replicas)?
        };
        roles.push(role);
    }
    Ok(Shape {
        v1alpha2,
        roles,
        untranslated,
    })
}

fn read_v1alpha2_role(
    object: &Value,
    role_json: &Value,
    name: String,
    at: String,
    replicas: i32,
) -> Result<RbgRole, Failure> {
    let present: Vec<&str> = PATTERNS
        .into_iter()
        .filter(|p| role_json.get(*p).is_some_and(|v| !v.is_null()))
        .collect();
    let pattern = match present.as_slice() {
        [one] => *one,
        [] => {
            return Err(Failure::new(
                at,
                "no pattern: a v1alpha2 role needs one of standalonePattern, leaderWorkerPattern, customComponentsPattern",
            ));
        }
        _ => {
            return Err(Failure::new(
                at,
                format!(
                    "{} are all set: a role has exactly one pattern",
                    present.join(", ")
                ),
            ));
        }
    };
    let holder = &role_json[pattern];
    let holder_at = format!("{at}.{pattern}");
    let base = |patch: Option<(&Value, String)>| {
        template_annotations(object, holder, &holder_at, "patch", patch)
    };
    match pattern {
        "standalonePattern" => Ok(standalone(name, at, replicas, base(None)?)),
        "leaderWorkerPattern" => {
            let size = count(holder, "size", &holder_at, 1, 1)?;
            let leader = overlay(
                base(None)?,
                &holder["leaderTemplatePatch"],
                &format!("{holder_at}.leaderTemplatePatch"),
            )?;
            let worker = overlay(
                base(None)?,
                &holder["workerTemplatePatch"],
                &format!("{holder_at}.workerTemplatePatch"),
            )?;
            Ok(leader_worker(name, at, replicas, size, leader, worker))
        }
        _ => {
            let components = holder["components"].as_array().cloned().unwrap_or_default();
            let mut out = Vec::new();
            for (j, component) in components.iter().enumerate() {
                let cat = format!("{holder_at}.components[{j}]");
                let (cname, size, mut annotations) = custom_component(object, component, &cat)?;
                // Component-level annotations are merged over the template's (RBG does so).
                annotations = overlay_map(
                    annotations,
                    &component["annotations"],
                    &format!("{cat}.annotations"),
                )?;
                out.push(Component {
                    role: joined(&name, &cname, &format!("{cat}.name"))?,
                    name: cname,
                    size,
                    annotations,
                });
            }
            Ok(RbgRole {
                name,
                at,
                replicas,
                pattern: Pattern::Custom,
                components: out,
            })
        }
    }
}

fn read_v1alpha1_role(
    object: &Value,
    role_json: &Value,
    name: String,
    at: String,
    replicas: i32,
) -> Result<RbgRole, Failure> {
    // v1alpha1 keeps the template on the role; `templatePatch` applies to a templateRef.
    let patch = Some((&role_json["templatePatch"], format!("{at}.templatePatch")));
    if let Some(lws) = role_json.get("leaderWorkerSet").filter(|v| v.is_object()) {
        let lws_at = format!("{at}.leaderWorkerSet");
        let size = count(lws, "size", &lws_at, 1, 1)?;
        let base = || template_annotations(object, role_json, &at, "", patch.clone());
        let leader = overlay(
            base()?,
            &lws["patchLeaderTemplate"],
            &format!("{lws_at}.patchLeaderTemplate"),
        )?;
        let worker = overlay(
            base()?,
            &lws["patchWorkerTemplate"],
            &format!("{lws_at}.patchWorkerTemplate"),
        )?;
        return Ok(leader_worker(name, at, replicas, size, leader, worker));
    }
    if let Some(components) = role_json["components"].as_array().filter(|c| !c.is_empty()) {
        let mut out = Vec::new();
        for (j, component) in components.iter().enumerate() {
            let cat = format!("{at}.components[{j}]");
            let (cname, size, annotations) = custom_component(object, component, &cat)?;
            out.push(Component {
                role: joined(&name, &cname, &format!("{cat}.name"))?,
                name: cname,
                size,
                annotations,
            });
        }
        return Ok(RbgRole {
            name,
            at,
            replicas,
            pattern: Pattern::Custom,
            components: out,
        });
    }
    let annotations = template_annotations(object, role_json, &at, "", patch)?;
    Ok(standalone(name, at, replicas, annotations))
}

fn standalone(
    name: String,
    at: String,
    replicas: i32,
    annotations: BTreeMap<String, Annotation>,
) -> RbgRole {
    RbgRole {
        components: vec![Component {
            name: name.clone(),
            role: name.clone(),
            size: 1,
            annotations,
        }],
        name,
        at,
        replicas,
        pattern: Pattern::Standalone,
    }
}

fn leader_worker(
    name: String,
    at: String,
    replicas: i32,
    size: i32,
    leader: BTreeMap<String, Annotation>,
    worker: BTreeMap<String, Annotation>,
) -> RbgRole {
    let mut components = vec![Component {
        name: "leader".into(),
        role: format!("{name}-leader"),
        size: 1,
        annotations: leader,
    }];
    // A group of one is a leader alone: RBG then runs no worker pods.
    if size > 1 {
        components.push(Component {
            name: "worker".into(),
            role: format!("{name}-worker"),
            size: size - 1,
            annotations: worker,
        });
    }
    RbgRole {
        name,
        at,
        replicas,
        pattern: Pattern::LeaderWorker,
        components,
    }
}

fn custom_component(
    object: &Value,
    component: &Value,
    at: &str,
) -> Result<(String, i32, BTreeMap<String, Annotation>), Failure> {
    let name = component["name"].as_str().unwrap_or_default().to_string();
    if name.is_empty() {
        return Err(Failure::new(format!("{at}.name"), "missing"));
    }
    let size = count(component, "size", at, 1, 0)?;
    let annotations = template_annotations(object, component, at, "", None)?;
    Ok((name, size, annotations))
}

/// `<role>-<component>`, which must still be a DNS label to name a PortAllocation role.
fn joined(role: &str, component: &str, field: &str) -> Result<String, Failure> {
    let name = format!("{role}-{component}");
    if name.len() > 63 {
        return Err(Failure::new(
            field,
            format!("role name {name:?} (<role>-<component>) is longer than 63 characters"),
        ));
    }
    Ok(name)
}

/// An optional non-negative integer field, at least `min`.
fn count(holder: &Value, key: &str, at: &str, default: i32, min: i64) -> Result<i32, Failure> {
    match holder.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value
            .as_i64()
            .filter(|n| (min..=i64::from(i32::MAX)).contains(n))
            .map(|n| n as i32)
            .ok_or_else(|| {
                Failure::new(
                    format!("{at}.{key}"),
                    format!("{value} is not an integer of at least {min}"),
                )
            }),
    }
}

/// The annotations of `holder.template`, or of the role template `holder.templateRef` names
/// with its patch (`holder.templateRef.<patch_key>` in v1alpha2, the role's `templatePatch`
/// in v1alpha1).
fn template_annotations(
    object: &Value,
    holder: &Value,
    holder_at: &str,
    patch_key: &str,
    patch: Option<(&Value, String)>,
) -> Result<BTreeMap<String, Annotation>, Failure> {
    if holder["template"].is_object() {
        return overlay(
            BTreeMap::new(),
            &holder["template"],
            &format!("{holder_at}.template"),
        );
    }
    let Some(reference) = holder["templateRef"].as_object() else {
        return Ok(BTreeMap::new());
    };
    let ref_name = reference
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let templates = object["spec"]["roleTemplates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let Some(k) = templates.iter().position(|t| t["name"] == ref_name) else {
        return Err(Failure::new(
            format!("{holder_at}.templateRef.name"),
            format!("names role template {ref_name:?}, which spec.roleTemplates does not have"),
        ));
    };
    let base = overlay(
        BTreeMap::new(),
        &templates[k]["template"],
        &format!("spec.roleTemplates[{k}].template"),
    )?;
    match (patch_key, patch) {
        ("", Some((patch, patch_at))) => overlay(base, patch, &patch_at),
        ("", None) => Ok(base),
        (key, _) => overlay(
            base,
            &holder["templateRef"][key],
            &format!("{holder_at}.templateRef.{key}"),
        ),
    }
}

/// `template`'s `metadata.annotations` merged over `base`, key by key, as a strategic merge
/// patch of a pod template does.
fn overlay(
    base: BTreeMap<String, Annotation>,
    template: &Value,
    at: &str,
) -> Result<BTreeMap<String, Annotation>, Failure> {
    overlay_map(
        base,
        &template["metadata"]["annotations"],
        &format!("{at}.metadata.annotations"),
    )
}

fn overlay_map(
    mut base: BTreeMap<String, Annotation>,
    map: &Value,
    at: &str,
) -> Result<BTreeMap<String, Annotation>, Failure> {
    let Some(map) = map.as_object() else {
        return Ok(base);
    };
    for (key, value) in map {
        let field = format!("{at}[{key}]");
        let Some(value) = value.as_str() else {
            return Err(Failure::new(field, "an annotation value must be a string"));
        };
        base.insert(
            key.clone(),
            Annotation {
                value: value.to_string(),
                field,
            },
        );
    }
    Ok(base)
}

/// RBG keys on objects where RBG reads no port settings: named in a note, never dropped silently.
fn collect_untranslated(map: &Value, at: &str, out: &mut Vec<(String, String)>) {
    if let Some(map) = map.as_object() {
        for key in map.keys().filter(|k| super::is_rbg_key(k)) {
            out.push((key.clone(), format!("{at}[{key}]")));
        }
    }
}

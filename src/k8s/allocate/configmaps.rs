//! Writing the ConfigMap of env files that pods source.
//!
//! Two ways in: `resolve --apply` writes one on request ([`apply_configmap`]), and every sync or
//! release of a PortAllocation with `spec.configMap` keeps its ConfigMap equal to what the
//! allocation now says ([`keep_env_configmap`]).
//!
//! Keeping it is read, compare, write: the ConfigMap is read first and applied only when its
//! files, our label or the controller reference differ. Reading costs one GET per sync but needs
//! no state anywhere else, and it sees what a hash kept in an annotation could not: a ConfigMap
//! deleted or edited by hand is put right by the next sync (or watcher resync), while an
//! unchanged sync writes nothing.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::api::{ALLOCATION_LABEL, PortAllocation, ResolveError, env_configmap};
use crate::k8s::client::FIELD_MANAGER;
use crate::k8s::error::{ApiErrorKind, KubeError, Target};
use crate::k8s::resources::CONFIGMAPS;
use crate::ledger::owner_of;

/// Server-side apply `configmap` (its fields owned by this plugin's field manager).
pub async fn apply_configmap(client: &Client, configmap: &ConfigMap) -> Result<(), KubeError> {
    let namespace = configmap.namespace().unwrap_or_default();
    let name = configmap.name_any();
    server_side_apply(client, configmap)
        .await
        .map_err(|e| KubeError::from_kube(e, CONFIGMAPS.on("patch", &name, Some(&namespace))))?;
    tracing::info!("applied ConfigMap {namespace}/{name}");
    Ok(())
}

async fn server_side_apply(client: &Client, configmap: &ConfigMap) -> Result<(), kube::Error> {
    let namespace = configmap.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    // Server-side apply needs the type fields, which the typed object leaves out.
    let mut body = serde_json::to_value(configmap).map_err(kube::Error::SerdeError)?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "ConfigMap".into();
    api.patch(
        &configmap.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
}

/// What keeping a PortAllocation's ConfigMap did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvConfigMap {
    pub namespace: String,
    pub name: String,
    /// How many env files it holds now.
    pub files: usize,
    pub change: ConfigMapChange,
}

/// What applying an env ConfigMap did to it: created it, rewrote its data, or found it as it
/// should be (not a repair's [`crate::ledger::Change`] to a pool's record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigMapChange {
    Created,
    Updated,
    Unchanged,
}

/// `configmap/NAME updated (7 env files)`: one stable line, as kubectl reports an object.
impl fmt::Display for EnvConfigMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let change = match self.change {
            ConfigMapChange::Created => "created",
            ConfigMapChange::Updated => "updated",
            ConfigMapChange::Unchanged => "unchanged",
        };
        let plural = if self.files == 1 { "" } else { "s" };
        write!(
            f,
            "configmap/{} {change} ({} env file{plural})",
            self.name, self.files
        )
    }
}

/// Why a PortAllocation's ConfigMap was not written. Its ports are allocated either way: the
/// ConfigMap follows the allocation and never undoes it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigMapError {
    /// The env files cannot be resolved from spec and status; nothing is written rather than
    /// a ConfigMap some of whose pods would find no (or a wrong) file.
    #[error(
        "PortAllocation {owner}: its ports are held, but ConfigMap {name:?} was not written: {source}"
    )]
    Unresolved {
        owner: String,
        name: String,
        #[source]
        source: ResolveError,
    },

    /// Another object controls a ConfigMap of that name.
    #[error(
        "PortAllocation {owner}: its ports are held, but ConfigMap {name:?} was not written: it is \
         controlled by {kind} {controller:?}; name another one in spec.configMap.name"
    )]
    Foreign {
        owner: String,
        name: String,
        kind: String,
        controller: String,
    },

    /// Reading or writing the ConfigMap failed (Forbidden, unavailable, invalid).
    #[error(
        "PortAllocation {owner}: its ports are held, but ConfigMap {name:?} was not written: {source}"
    )]
    Kube {
        owner: String,
        name: String,
        #[source]
        source: KubeError,
    },
}

impl ConfigMapError {
    /// Worth trying again in a moment (transport trouble), rather than at the next resync.
    pub fn is_transient(&self) -> bool {
        matches!(self, ConfigMapError::Kube { source, .. }
            if matches!(source.kind(), ApiErrorKind::Unavailable | ApiErrorKind::Conflict))
    }
}

/// Make the ConfigMap named by `pa.spec.configMap` hold exactly the env files of `pa` as it is
/// now (spec and status); `None` when it names none.
///
/// After a release (`released`) an env that no longer resolves because ports were given back
/// empties the ConfigMap instead: a file naming a port the pool may hand to someone else is
/// worse than none, and pods that wait for their file wait until the next sync writes it.
pub async fn keep_env_configmap(
    client: &Client,
    pa: &PortAllocation,
    released: bool,
) -> Option<Result<EnvConfigMap, ConfigMapError>> {
    let name = pa.spec.config_map.as_ref()?.name.clone();
    Some(keep(client, pa, name, released).await)
}

async fn keep(
    client: &Client,
    pa: &PortAllocation,
    name: String,
    released: bool,
) -> Result<EnvConfigMap, ConfigMapError> {
    let owner = owner_of(pa);
    let namespace = pa.namespace().unwrap_or_default();
    let desired = match env_configmap(pa, Some(&name)) {
        Ok(desired) => desired,
        Err(ResolveError::NotAllocated { .. }) if released => {
            let mut empty = env_configmap_shell(pa, &name);
            empty.data = Some(BTreeMap::new());
            empty
        }
        Err(source) => {
            return Err(ConfigMapError::Unresolved {
                owner,
                name,
                source,
            });
        }
    };
    let files = desired.data.as_ref().map_or(0, |data| {
        data.keys().filter(|k| k.ends_with(".env")).count()
    });
    let kube_error = |source| ConfigMapError::Kube {
        owner: owner.clone(),
        name: name.clone(),
        source,
    };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|e| kube_error(KubeError::from_kube(e, get_target(&name, &namespace))))?;
    if let Some(existing) = &existing {
        if let Some(other) = foreign_controller(existing, pa) {
            return Err(ConfigMapError::Foreign {
                owner,
                name,
                kind: other.kind.clone(),
                controller: other.name.clone(),
            });
        }
        if matches_desired(existing, &desired, pa) {
            return Ok(EnvConfigMap {
                namespace,
                name,
                files,
                change: ConfigMapChange::Unchanged,
            });
        }
    }
    server_side_apply(client, &desired)
        .await
        .map_err(|e| kube_error(write_error(e, &name, &namespace)))?;
    let change = if existing.is_some() {
        ConfigMapChange::Updated
    } else {
        ConfigMapChange::Created
    };
    tracing::info!(allocation = %owner, configmap = %name, files, ?change, "env files written");
    Ok(EnvConfigMap {
        namespace,
        name,
        files,
        change,
    })
}

/// The metadata `env_configmap` gives (name, namespace, label, controller reference), for a
/// ConfigMap whose files are withdrawn.
fn env_configmap_shell(pa: &PortAllocation, name: &str) -> ConfigMap {
    // A copy without roles always resolves: it has no pods, hence no files.
    let mut bare = pa.clone();
    bare.spec.roles.clear();
    let mut shell = env_configmap(&bare, Some(name)).unwrap_or_default();
    shell.data = None;
    shell
}

fn get_target(name: &str, namespace: &str) -> Target {
    CONFIGMAPS.on("get", name, Some(namespace))
}

/// Name the verb the server refused: an apply that would create the ConfigMap is authorized as
/// `patch` and then as `create`.
fn write_error(err: kube::Error, name: &str, namespace: &str) -> KubeError {
    let verb = match &err {
        kube::Error::Api(status) if status.message.contains("cannot create resource") => "create",
        _ => "patch",
    };
    KubeError::from_kube(err, CONFIGMAPS.on(verb, name, Some(namespace)))
}

/// The controller of `existing`, if it is neither `pa` nor an earlier PortAllocation of the same
/// name (deleted, since names are unique; its ConfigMap outlives it until the garbage collector
/// runs, and the apply moves the reference to the new object).
fn foreign_controller<'a>(
    existing: &'a ConfigMap,
    pa: &PortAllocation,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    existing.owner_references().iter().find(|o| {
        let predecessor = o.kind == "PortAllocation"
            && o.api_version.starts_with(crate::api::GROUP)
            && o.name == pa.name_any();
        o.controller == Some(true) && Some(&o.uid) != pa.metadata.uid.as_ref() && !predecessor
    })
}

/// Whether `existing` already says what `desired` says, in the parts this plugin owns: every
/// file, the label, and the controller reference to this PortAllocation.
fn matches_desired(existing: &ConfigMap, desired: &ConfigMap, pa: &PortAllocation) -> bool {
    let empty = BTreeMap::new();
    let data = existing.data.as_ref().unwrap_or(&empty);
    let want = desired.data.as_ref().unwrap_or(&empty);
    let labelled = existing.labels().get(ALLOCATION_LABEL) == Some(&pa.name_any());
    let owned = existing
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == pa.metadata.uid.as_ref());
    data == want && labelled && owned
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn pa(uid: &str) -> PortAllocation {
        let mut pa = PortAllocation::new("pd", Default::default());
        pa.metadata.namespace = Some("team".into());
        pa.metadata.uid = Some(uid.into());
        pa
    }

    fn configmap(uid: &str, files: &[(&str, &str)]) -> ConfigMap {
        let mut cm = env_configmap_shell(&pa(uid), "pd-env");
        cm.data = Some(
            files
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        cm
    }

    #[test]
    fn the_line_is_stable() {
        let mut report = EnvConfigMap {
            namespace: "team".into(),
            name: "pd-env".into(),
            files: 7,
            change: ConfigMapChange::Updated,
        };
        assert_eq!(report.to_string(), "configmap/pd-env updated (7 env files)");
        report.files = 1;
        report.change = ConfigMapChange::Unchanged;
        assert_eq!(
            report.to_string(),
            "configmap/pd-env unchanged (1 env file)"
        );
    }

    #[test]
    fn the_shell_carries_label_and_controller_but_no_files() {
        let cm = env_configmap_shell(&pa("u1"), "pd-env");
        assert_eq!(cm.name_any(), "pd-env");
        assert_eq!(cm.namespace().as_deref(), Some("team"));
        assert_eq!(
            cm.labels().get(ALLOCATION_LABEL).map(String::as_str),
            Some("pd")
        );
        let owner = &cm.owner_references()[0];
        assert_eq!((owner.uid.as_str(), owner.controller), ("u1", Some(true)));
        assert!(cm.data.unwrap_or_default().is_empty());
    }

    #[test]
    fn equal_files_label_and_owner_match_and_any_difference_does_not() {
        let want = configmap("u1", &[("a-0.env", "A=1\n")]);
        assert!(matches_desired(&want.clone(), &want, &pa("u1")));
        let other_value = configmap("u1", &[("a-0.env", "A=2\n")]);
        assert!(!matches_desired(&other_value, &want, &pa("u1")));
        let extra_file = configmap("u1", &[("a-0.env", "A=1\n"), ("a-1.env", "A=3\n")]);
        assert!(!matches_desired(&extra_file, &want, &pa("u1")));
        let mut unlabelled = want.clone();
        unlabelled.metadata.labels = None;
        assert!(!matches_desired(&unlabelled, &want, &pa("u1")));
        let mut unowned = want.clone();
        unowned.metadata.owner_references = None;
        assert!(!matches_desired(&unowned, &want, &pa("u1")));
        // The PortAllocation was recreated: same name, new UID.
        assert!(!matches_desired(&want, &want, &pa("u2")));
    }

    #[test]
    fn another_controller_is_named_but_a_predecessor_or_plain_owner_is_not() {
        let mut cm = configmap("u1", &[]);
        assert!(foreign_controller(&cm, &pa("u1")).is_none());
        // The same name with another UID: a deleted predecessor, taken over.
        assert!(foreign_controller(&cm, &pa("u2")).is_none());
        let mut other_pa = pa("u2");
        other_pa.metadata.name = Some("other".into());
        let other = foreign_controller(&cm, &other_pa).expect("pd controls it");
        assert_eq!(
            (other.kind.as_str(), other.name.as_str()),
            ("PortAllocation", "pd")
        );
        cm.metadata.owner_references = Some(vec![OwnerReference {
            uid: "u9".into(),
            controller: None,
            ..Default::default()
        }]);
        assert!(foreign_controller(&cm, &other_pa).is_none());
    }
}

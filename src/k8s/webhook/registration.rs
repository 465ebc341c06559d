//! The MutatingWebhookConfiguration `portalloc`, kept by the watchers themselves.
//!
//! Several replicas keep one configuration without fighting over it: every replica of a version
//! derives the same object from the same inputs (its flags and the CA Secret every replica
//! reads), and writes it by server-side apply under one field manager, so a second write of the
//! same object changes nothing. At start a replica applies the whole configuration (creating it
//! if need be); afterwards [`repair_registration`] only puts back what breaks admission, a
//! `clientConfig` that no longer reaches the Service with the Secret's CA, and leaves the other
//! fields alone, so during a rolling update an old and a new replica whose configurations
//! differ in, say, a timeout do not rewrite each other every check. It never creates the
//! configuration: a deleted one is an uninstall (`helm uninstall` and `kubectl delete -k deploy`
//! delete it first), and a replica still running must not bring it back to refuse every
//! labelled pod with no webhook left.
//!
//! A watcher registered by URL (out of the cluster, `--webhook-url`) is the only one the API
//! server calls, so when it stops cleanly it takes its registration away
//! ([`withdraw_registration`]): left behind, it would refuse every labelled pod. Only if the
//! configuration still calls its URL: several such watchers share the one configuration, the
//! last to start is the one called, and one that stops must not remove another's.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};

use super::WEBHOOK_TIMEOUT;
use crate::api::POD_ALLOCATION_LABEL;
use crate::k8s::client::FIELD_MANAGER;
use crate::k8s::error::{ApiErrorKind, KubeError};
use crate::k8s::resources::Resource;

/// The MutatingWebhookConfiguration the watcher keeps.
pub const WEBHOOK_CONFIGURATION: &str = "portalloc";
/// The one webhook in it.
const WEBHOOK_NAME: &str = "pods.portalloc.dev";

const WEBHOOK_CONFIGURATIONS: Resource = Resource {
    plural: "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    kind: "MutatingWebhookConfiguration",
};

/// How the API server reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientConfig {
    /// Through a Service in the cluster (the deploy/ manifests).
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
    /// At a URL (a webhook outside the cluster, as the tests run it).
    Url(String),
}

/// Create or update the MutatingWebhookConfiguration: labelled pods only (objectSelector), on
/// create, failing closed, within [`WEBHOOK_TIMEOUT`]; `ca_pem` as its caBundle (`None`: leave
/// it to cert-manager's CA injector).
pub async fn register_webhook(
    client: &Client,
    ca_pem: Option<&str>,
    config: &ClientConfig,
) -> Result<(), KubeError> {
    let webhook = MutatingWebhook {
        name: WEBHOOK_NAME.into(),
        admission_review_versions: vec!["v1".into()],
        client_config: client_config(ca_pem, config),
        side_effects: "NoneOnDryRun".into(),
        failure_policy: Some("Fail".into()),
        timeout_seconds: Some(WEBHOOK_TIMEOUT.as_secs() as i32),
        reinvocation_policy: Some("Never".into()),
        object_selector: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: POD_ALLOCATION_LABEL.into(),
                operator: "Exists".into(),
                values: None,
            }]),
            ..Default::default()
        }),
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(vec!["CREATE".into()]),
            resources: Some(vec!["pods".into()]),
            scope: Some("Namespaced".into()),
        }]),
        ..Default::default()
    };
    let mut configuration = MutatingWebhookConfiguration {
        webhooks: Some(vec![webhook]),
        ..Default::default()
    };
    configuration.metadata.name = Some(WEBHOOK_CONFIGURATION.into());
    configuration.metadata.labels = Some(BTreeMap::from([(
        "app.kubernetes.io/name".to_string(),
        "kubectl-portalloc".to_string(),
    )]));
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        &configuration.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&configuration),
    )
    .await
    .map(|_| ())
    .map_err(|e| {
        KubeError::from_kube(
            e,
            WEBHOOK_CONFIGURATIONS.on("patch", WEBHOOK_CONFIGURATION, None),
        )
    })
}

/// Patch the configuration's `clientConfig` if it differs from what `ca_pem` and `config` give
/// (with `ca_pem` `None`, the caBundle is cert-manager's and not compared). A configuration
/// that is gone stays gone: the patch is a strategic merge, which never creates (server-side
/// apply would), so even a deletion between the read and the write is not undone. Whether it
/// wrote.
pub async fn repair_registration(
    client: &Client,
    ca_pem: Option<&str>,
    config: &ClientConfig,
) -> Result<bool, KubeError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let at = |verb| WEBHOOK_CONFIGURATIONS.on(verb, WEBHOOK_CONFIGURATION, None);
    let current = api
        .get_opt(WEBHOOK_CONFIGURATION)
        .await
        .map_err(|e| KubeError::from_kube(e, at("get")))?;
    let Some(current) = current else {
        return Ok(false);
    };
    if reaches(&current, ca_pem, config) {
        return Ok(false);
    }
    let patch = client_config_patch(ca_pem, config);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api
        .patch(WEBHOOK_CONFIGURATION, &params, &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(KubeError::from_kube(e, at("patch"))),
    }
}

/// What [`withdraw_registration`] did with the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Withdrawal {
    /// Deleted: it called this webhook.
    Removed,
    /// There was none (deleted by hand, or by `helm uninstall`).
    Absent,
    /// Left alone: it calls this (another watcher registered since).
    Elsewhere(String),
}

/// Delete the configuration if it still calls `config` (a watcher registered by URL, stopping):
/// read it, then delete that very version (a precondition on its resourceVersion), so a watcher
/// that registered in between keeps its registration. Within [`WEBHOOK_TIMEOUT`]: a stopping
/// process does not wait on an API server that does not answer.
pub async fn withdraw_registration(
    client: &Client,
    config: &ClientConfig,
) -> Result<Withdrawal, KubeError> {
    tokio::time::timeout(WEBHOOK_TIMEOUT, withdraw(client, config))
        .await
        .unwrap_or_else(|_| {
            Err(KubeError::new(
                ApiErrorKind::Unavailable,
                WEBHOOK_CONFIGURATIONS.on("delete", WEBHOOK_CONFIGURATION, None),
                format!("no answer within {}s", WEBHOOK_TIMEOUT.as_secs()),
            ))
        })
}

async fn withdraw(client: &Client, config: &ClientConfig) -> Result<Withdrawal, KubeError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let at = |verb| WEBHOOK_CONFIGURATIONS.on(verb, WEBHOOK_CONFIGURATION, None);
    let Some(current) = api
        .get_opt(WEBHOOK_CONFIGURATION)
        .await
        .map_err(|e| KubeError::from_kube(e, at("get")))?
    else {
        return Ok(Withdrawal::Absent);
    };
    if !reaches(&current, None, config) {
        return Ok(Withdrawal::Elsewhere(calls(&current)));
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: current.metadata.uid.clone(),
            resource_version: current.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    match api.delete(WEBHOOK_CONFIGURATION, &params).await {
        Ok(_) => Ok(Withdrawal::Removed),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Withdrawal::Absent),
        // Changed since it was read: another watcher registered itself.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Withdrawal::Elsewhere(
            "another webhook (it was registered again while this one stopped)".into(),
        )),
        Err(e) => Err(KubeError::from_kube(e, at("delete"))),
    }
}

/// What the configuration's webhook calls, in words.
fn calls(configuration: &MutatingWebhookConfiguration) -> String {
    let config = configuration
        .webhooks
        .iter()
        .flatten()
        .find(|w| w.name == WEBHOOK_NAME)
        .map(|w| &w.client_config);
    match config {
        Some(WebhookClientConfig { url: Some(url), .. }) => url.clone(),
        Some(WebhookClientConfig {
            service: Some(s), ..
        }) => format!("Service {}/{}", s.namespace, s.name),
        _ => "no webhook of kubectl-portalloc".to_string(),
    }
}

/// A strategic merge patch that sets our webhook's `clientConfig` (by its name, the list's merge
/// key): the Service or the URL, the other one removed, and the caBundle when we have one.
fn client_config_patch(ca_pem: Option<&str>, config: &ClientConfig) -> serde_json::Value {
    let wanted = client_config(ca_pem, config);
    let mut client_config = serde_json::json!({
        "service": wanted.service,
        "url": wanted.url,
    });
    if let Some(bundle) = wanted.ca_bundle {
        client_config["caBundle"] = serde_json::to_value(bundle).unwrap_or_default();
    }
    serde_json::json!({
        "webhooks": [{"name": WEBHOOK_NAME, "clientConfig": client_config}],
    })
}

/// Whether `configuration`'s webhook calls `config` trusting `ca_pem`.
fn reaches(
    configuration: &MutatingWebhookConfiguration,
    ca_pem: Option<&str>,
    config: &ClientConfig,
) -> bool {
    let want = client_config(ca_pem, config);
    configuration
        .webhooks
        .iter()
        .flatten()
        .find(|w| w.name == WEBHOOK_NAME)
        .is_some_and(|w| {
            let mut have = w.client_config.clone();
            if want.ca_bundle.is_none() {
                have.ca_bundle = None;
            }
            have == want
        })
}

fn client_config(ca_pem: Option<&str>, config: &ClientConfig) -> WebhookClientConfig {
    let mut client_config = WebhookClientConfig {
        ca_bundle: ca_pem.map(|pem| ByteString(pem.as_bytes().to_vec())),
        ..Default::default()
    };
    match config {
        ClientConfig::Service {
            namespace,
            name,
            port,
        } => {
            client_config.service = Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some("/mutate".into()),
                port: Some(*port),
            })
        }
        ClientConfig::Url(url) => {
            client_config.url = Some(format!("{}/mutate", url.trim_end_matches('/')))
        }
    }
    client_config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configuration(client_config: WebhookClientConfig) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            webhooks: Some(vec![MutatingWebhook {
                name: WEBHOOK_NAME.into(),
                client_config,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn service() -> ClientConfig {
        ClientConfig::Service {
            namespace: "portalloc-system".into(),
            name: "portalloc-webhook".into(),
            port: 443,
        }
    }

    #[test]
    fn a_configuration_is_repaired_only_when_it_no_longer_reaches_the_service_with_the_ca() {
        let current = configuration(client_config(Some("CA-1"), &service()));
        assert!(reaches(&current, Some("CA-1"), &service()));
        // The Secret's CA changed: the caBundle must follow it.
        assert!(!reaches(&current, Some("CA-2"), &service()));
        // cert-manager's injector owns the caBundle: any is fine.
        assert!(reaches(&current, None, &service()));
        // Pointed elsewhere (a watcher run with --webhook-url registered last).
        let url = configuration(client_config(
            Some("CA-1"),
            &ClientConfig::Url("https://10.0.0.9:9443".into()),
        ));
        assert!(!reaches(&url, Some("CA-1"), &service()));
        // No webhook of ours in it.
        assert!(!reaches(
            &MutatingWebhookConfiguration::default(),
            Some("CA-1"),
            &service()
        ));
    }

    #[test]
    fn the_repair_patch_sets_one_way_to_call_and_leaves_a_foreign_ca_bundle_alone() {
        let patch = client_config_patch(Some("CA-1"), &service());
        let config = &patch["webhooks"][0]["clientConfig"];
        assert_eq!(patch["webhooks"][0]["name"], WEBHOOK_NAME);
        assert_eq!(config["service"]["name"], "portalloc-webhook");
        // A URL registered earlier is removed (a webhook has exactly one of the two).
        assert!(config["url"].is_null() && config.get("url").is_some());
        // PEM bytes, base64 as the API carries them.
        assert_eq!(config["caBundle"], "Q0EtMQ==");
        let patch = client_config_patch(None, &service());
        assert!(
            patch["webhooks"][0]["clientConfig"]
                .get("caBundle")
                .is_none()
        );
    }

    #[test]
    fn a_url_registration_is_withdrawn_only_while_it_calls_that_url() {
        let ours = ClientConfig::Url("https://10.0.0.9:9443".into());
        let registered = configuration(client_config(Some("CA-1"), &ours));
        // The caBundle is not compared: the URL decides whose it is.
        assert!(reaches(&registered, None, &ours));
        let theirs = ClientConfig::Url("https://10.0.0.7:9443".into());
        assert!(!reaches(&registered, None, &theirs));
        assert_eq!(calls(&registered), "https://10.0.0.9:9443/mutate");
        let service = configuration(client_config(None, &service()));
        assert!(!reaches(&service, None, &ours));
        assert_eq!(
            calls(&service),
            "Service portalloc-system/portalloc-webhook"
        );
    }

    #[test]
    fn fields_other_than_the_client_config_are_left_to_the_replica_that_starts() {
        // Another version's timeout or selector is not a reason to write.
        let mut current = configuration(client_config(Some("CA-1"), &service()));
        current.webhooks.as_mut().unwrap()[0].timeout_seconds = Some(30);
        assert!(reaches(&current, Some("CA-1"), &service()));
    }
}

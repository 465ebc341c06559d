//! TLS for the pod webhook with no extra component. A CA lives in a Secret (made by the first
//! watcher that finds none; replicas share it), each watcher process signs its own serving
//! certificate with it at start, and the MutatingWebhookConfiguration's `caBundle` is kept to
//! that CA by server-side apply. With cert-manager instead, mount its certificate
//! (`--webhook-cert-dir`) and let its CA injector fill the `caBundle`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::WEBHOOK_TIMEOUT;
use crate::api::POD_ALLOCATION_LABEL;
use crate::k8s::FIELD_MANAGER;
use crate::k8s::error::KubeError;
use crate::k8s::resources::Resource;

/// The Secret (in the watcher's namespace) that holds the CA: `ca.crt`, `ca.key`.
pub const CA_SECRET: &str = "portalloc-webhook-ca";
/// The MutatingWebhookConfiguration the watcher keeps.
pub const WEBHOOK_CONFIGURATION: &str = "portalloc";
const CA_NAME: &str = "kubectl-portalloc webhook CA";

const SECRETS: Resource = Resource {
    plural: "secrets",
    kind: "Secret",
};
const WEBHOOK_CONFIGURATIONS: Resource = Resource {
    plural: "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    kind: "MutatingWebhookConfiguration",
};

/// A serving certificate and key (PEM), and the CA that signed it.
pub struct ServingCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookTlsError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("webhook certificate: {0}")]
    Certificate(String),
}

fn cert_error(e: rcgen::Error) -> WebhookTlsError {
    WebhookTlsError::Certificate(e.to_string())
}

/// How the API server reaches the webhook.
#[derive(Clone, Debug)]
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

/// A serving certificate for `hosts` (DNS names or IP addresses), signed by the CA of
/// `namespace`'s Secret, which is made first if there is none.
pub async fn serving_cert(
    client: &Client,
    namespace: &str,
    hosts: &[String],
) -> Result<ServingCert, WebhookTlsError> {
    let (ca_pem, ca_key_pem) = load_or_create_ca(client, namespace).await?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(cert_error)?;
    // The issuer is rebuilt from the same name and key: the chain needs the CA's subject and
    // key identifier, both of which these reproduce.
    let issuer = Issuer::new(ca_params(), ca_key);
    let key = KeyPair::generate().map_err(cert_error)?;
    let mut params = CertificateParams::new(hosts.to_vec()).map_err(cert_error)?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts.first().cloned().unwrap_or_default(),
    );
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).map_err(cert_error)?;
    Ok(ServingCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_pem,
    })
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    params
}

/// The CA (certificate and key, PEM) from the Secret; made and stored when there is none. Two
/// watchers starting at once: one create wins, the other reads what it stored.
async fn load_or_create_ca(
    client: &Client,
    namespace: &str,
) -> Result<(String, String), WebhookTlsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let at = |verb| SECRETS.on(verb, CA_SECRET, Some(namespace));
    let read = |secret: Secret| -> Option<(String, String)> {
        let data = secret.data?;
        let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
        Some((text("ca.crt")?, text("ca.key")?))
    };
    if let Some(secret) = secrets
        .get_opt(CA_SECRET)
        .await
        .map_err(|e| KubeError::from_kube(e, at("get")))?
    {
        return read(secret).ok_or_else(|| {
            WebhookTlsError::Certificate(format!(
                "Secret {namespace}/{CA_SECRET} lacks ca.crt or ca.key: delete it and a new CA is made"
            ))
        });
    }
    let key = KeyPair::generate().map_err(cert_error)?;
    let cert = ca_params().self_signed(&key).map_err(cert_error)?;
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
    let mut secret = Secret {
        data: Some(BTreeMap::from([
            (
                "ca.crt".to_string(),
                ByteString(cert_pem.clone().into_bytes()),
            ),
            (
                "ca.key".to_string(),
                ByteString(key_pem.clone().into_bytes()),
            ),
        ])),
        ..Default::default()
    };
    secret.metadata.name = Some(CA_SECRET.into());
    match secrets.create(&crate::k8s::write_params(), &secret).await {
        Ok(_) => Ok((cert_pem, key_pem)),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let stored = secrets
                .get(CA_SECRET)
                .await
                .map_err(|e| KubeError::from_kube(e, at("get")))?;
            read(stored).ok_or_else(|| {
                WebhookTlsError::Certificate(format!(
                    "Secret {namespace}/{CA_SECRET} lacks ca.crt or ca.key"
                ))
            })
        }
        Err(e) => Err(KubeError::from_kube(e, at("create")).into()),
    }
}

/// Create or update the MutatingWebhookConfiguration: labelled pods only (objectSelector), on
/// create, failing closed, within [`WEBHOOK_TIMEOUT`]; `ca_pem` as its caBundle (`None`: leave
/// it to cert-manager's CA injector).
pub async fn register_webhook(
    client: &Client,
    ca_pem: Option<&str>,
    config: &ClientConfig,
) -> Result<(), KubeError> {
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
    let webhook = MutatingWebhook {
        name: "pods.portalloc.dev".into(),
        admission_review_versions: vec!["v1".into()],
        client_config,
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

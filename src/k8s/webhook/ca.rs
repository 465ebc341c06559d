//! TLS for the pod webhook with no extra component. A CA lives in a Secret (made by the first
//! watcher that finds none; replicas share it: one create wins, the others read it), and each
//! watcher process signs its own serving certificate with it: at start, and again when the
//! Secret's CA changes (a replica never trusts its own copy over the Secret). The
//! MutatingWebhookConfiguration's `caBundle` follows the same Secret (`registration`). With
//! cert-manager instead, mount its certificate (`--webhook-cert-dir`) and let its CA injector
//! fill the `caBundle`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::k8s::error::{ApiErrorKind, KubeError};
use crate::k8s::resources::Resource;

/// The Secret (in the watcher's namespace) that holds the CA: `ca.crt`, `ca.key`.
pub const CA_SECRET: &str = "portalloc-webhook-ca";
const CA_NAME: &str = "kubectl-portalloc webhook CA";

const SECRETS: Resource = Resource {
    plural: "secrets",
    kind: "Secret",
};

/// A serving certificate and key (PEM), and the CA that signed it.
pub struct ServingCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

/// The webhook's CA (certificate and key, PEM), as the Secret holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookCa {
    pub cert_pem: String,
    key_pem: String,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookTlsError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// rcgen could not make a key or a certificate.
    #[error("webhook certificate: {0}")]
    Certificate(#[source] rcgen::Error),
    /// The Secret found at start lacks the CA.
    #[error(
        "webhook certificate: Secret {namespace}/{CA_SECRET} lacks ca.crt or ca.key: delete it \
         and a new CA is made"
    )]
    CaIncomplete { namespace: String },
    /// The Secret another watcher stored first lacks the CA.
    #[error("webhook certificate: Secret {namespace}/{CA_SECRET} lacks ca.crt or ca.key")]
    StoredCaIncomplete { namespace: String },
    /// The namespace meant for the CA Secret does not exist (a watcher run out of the cluster
    /// before anything was installed in it).
    #[error(
        "the webhook keeps its CA in Secret {namespace}/{CA_SECRET}, but namespace {namespace:?} \
         does not exist: create it (kubectl create namespace {namespace})"
    )]
    NamespaceMissing { namespace: String },
}

/// A serving certificate for `hosts` (DNS names or IP addresses), signed by the CA of
/// `namespace`'s Secret, which is made first if there is none.
pub async fn serving_cert(
    client: &Client,
    namespace: &str,
    hosts: &[String],
) -> Result<ServingCert, WebhookTlsError> {
    webhook_ca(client, namespace).await?.sign(hosts)
}

impl WebhookCa {
    /// A serving certificate for `hosts` signed by this CA.
    pub fn sign(&self, hosts: &[String]) -> Result<ServingCert, WebhookTlsError> {
        let ca_key = KeyPair::from_pem(&self.key_pem).map_err(WebhookTlsError::Certificate)?;
        // The issuer is rebuilt from the same name and key: the chain needs the CA's subject
        // and key identifier, both of which these reproduce.
        let issuer = Issuer::new(ca_params(), ca_key);
        let key = KeyPair::generate().map_err(WebhookTlsError::Certificate)?;
        let mut params =
            CertificateParams::new(hosts.to_vec()).map_err(WebhookTlsError::Certificate)?;
        params.distinguished_name.push(
            DnType::CommonName,
            hosts.first().cloned().unwrap_or_default(),
        );
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(WebhookTlsError::Certificate)?;
        Ok(ServingCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.cert_pem.clone(),
        })
    }
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

/// The CA from `namespace`'s Secret; made and stored when there is none. Two watchers starting
/// at once: one create wins, the other reads what it stored.
pub async fn webhook_ca(client: &Client, namespace: &str) -> Result<WebhookCa, WebhookTlsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let at = |verb| SECRETS.on(verb, CA_SECRET, Some(namespace));
    let read = |secret: Secret| -> Option<WebhookCa> {
        let data = secret.data?;
        let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
        Some(WebhookCa {
            cert_pem: text("ca.crt")?,
            key_pem: text("ca.key")?,
        })
    };
    if let Some(secret) = secrets
        .get_opt(CA_SECRET)
        .await
        .map_err(|e| KubeError::from_kube(e, at("get")))?
    {
        return read(secret).ok_or_else(|| WebhookTlsError::CaIncomplete {
            namespace: namespace.to_string(),
        });
    }
    let key = KeyPair::generate().map_err(WebhookTlsError::Certificate)?;
    let cert = ca_params()
        .self_signed(&key)
        .map_err(WebhookTlsError::Certificate)?;
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
    match secrets
        .create(&crate::k8s::client::write_params(), &secret)
        .await
    {
        Ok(_) => Ok(WebhookCa { cert_pem, key_pem }),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let stored = secrets
                .get(CA_SECRET)
                .await
                .map_err(|e| KubeError::from_kube(e, at("get")))?;
            read(stored).ok_or_else(|| WebhookTlsError::StoredCaIncomplete {
                namespace: namespace.to_string(),
            })
        }
        Err(e) => match KubeError::from_kube(e, at("create")) {
            // A get of the Secret says only "not found"; its create names the namespace.
            e if e.kind() == ApiErrorKind::NotFound => Err(WebhookTlsError::NamespaceMissing {
                namespace: namespace.to_string(),
            }),
            e => Err(e.into()),
        },
    }
}

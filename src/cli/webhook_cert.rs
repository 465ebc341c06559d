//! The webhook's serving certificate, kept current while it runs: the TLS server asks
//! [`CertSlot`] at each handshake, and [`keep_current`] swaps a new certificate in when its
//! source changes (the CA Secret's CA, or cert-manager's files under `--webhook-cert-dir`),
//! then has the MutatingWebhookConfiguration's `clientConfig` repaired if it no longer reaches
//! this Service with that CA (a deleted configuration is left deleted: that is an uninstall).
//! Every replica converges on the same Secret, so none undoes another's work.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use crate::k8s::{self, ClientConfig};

/// How often a replica checks its certificate's source and the configuration. After a CA
/// change, a replica still serving the old CA's certificate is refused by the API server until
/// its check, so the window should be seconds; two GETs per replica every 10 s cost the API
/// server nothing.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum CertSource {
    /// Signed here by the CA in the Secret of `namespace`, for `hosts`.
    Secret {
        namespace: String,
        hosts: Vec<String>,
    },
    /// `tls.crt` and `tls.key` in a directory (cert-manager's Secret, mounted).
    Dir(PathBuf),
}

/// A certificate, its key and (when signed here) the CA, all PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Pems {
    pub cert: String,
    pub key: String,
    pub ca: Option<String>,
}

impl CertSource {
    /// The current certificate: read from the directory, or signed by the Secret's CA (made
    /// first if there is none).
    pub async fn load(&self, client: &kube::Client) -> anyhow::Result<Pems> {
        match self {
            CertSource::Secret { namespace, hosts } => {
                let cert = k8s::serving_cert(client, namespace, hosts).await?;
                Ok(Pems {
                    cert: cert.cert_pem,
                    key: cert.key_pem,
                    ca: Some(cert.ca_pem),
                })
            }
            CertSource::Dir(dir) => {
                let read = |file: &str| {
                    std::fs::read_to_string(dir.join(file)).map_err(|e| {
                        anyhow::anyhow!("--webhook-cert-dir: {}: {e}", dir.join(file).display())
                    })
                };
                Ok(Pems {
                    cert: read("tls.crt")?,
                    key: read("tls.key")?,
                    ca: None,
                })
            }
        }
    }
}

/// The certificate the TLS server hands out, replaceable while it serves.
#[derive(Debug)]
pub struct CertSlot {
    provider: Arc<CryptoProvider>,
    current: RwLock<(Arc<CertifiedKey>, PemsDigest)>,
}

/// What the slot holds, to tell whether a source changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PemsDigest {
    cert: String,
    ca: Option<String>,
}

impl CertSlot {
    pub fn new(provider: Arc<CryptoProvider>, pems: &Pems) -> anyhow::Result<CertSlot> {
        let key = certified_key(&provider, pems)?;
        Ok(CertSlot {
            provider,
            current: RwLock::new((key, digest(pems))),
        })
    }

    /// The CA the current certificate was signed by here (`None` for a mounted one).
    fn ca(&self) -> Option<String> {
        self.read().1.ca.clone()
    }

    fn holds(&self, pems: &Pems) -> bool {
        self.read().1 == digest(pems)
    }

    fn swap(&self, pems: &Pems) -> anyhow::Result<()> {
        let key = certified_key(&self.provider, pems)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (key, digest(pems));
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, (Arc<CertifiedKey>, PemsDigest)> {
        self.current.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.read().0.clone())
    }
}

fn digest(pems: &Pems) -> PemsDigest {
    PemsDigest {
        cert: pems.cert.clone(),
        ca: pems.ca.clone(),
    }
}

fn certified_key(provider: &CryptoProvider, pems: &Pems) -> anyhow::Result<Arc<CertifiedKey>> {
    let certs = CertificateDer::pem_slice_iter(pems.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("the webhook's certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(pems.key.as_bytes())
        .map_err(|e| anyhow::anyhow!("the webhook's key: {e}"))?;
    let key = CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| anyhow::anyhow!("the webhook's certificate and key: {e}"))?;
    Ok(Arc::new(key))
}

/// Every [`CHECK_EVERY`]: swap in a new certificate if its source changed, then repair the
/// configuration if it no longer reaches `config` with this certificate's CA. Runs until
/// aborted (a draining replica stops it: it must not point the configuration at itself).
pub async fn keep_current(
    client: kube::Client,
    source: CertSource,
    slot: Arc<CertSlot>,
    config: ClientConfig,
) {
    let mut ticker = tokio::time::interval(CHECK_EVERY);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        if let Err(e) = check(&client, &source, &slot, &config).await {
            tracing::warn!(
                "checking the webhook's certificate and configuration (again in {CHECK_EVERY:?}): {e:#}"
            );
        }
    }
}

async fn check(
    client: &kube::Client,
    source: &CertSource,
    slot: &CertSlot,
    config: &ClientConfig,
) -> anyhow::Result<()> {
    let ca = match source {
        CertSource::Secret { namespace, hosts } => {
            // A new serving certificate only when the Secret's CA is not the one in use.
            let ca = k8s::webhook_ca(client, namespace).await?;
            if slot.ca().as_deref() != Some(ca.cert_pem.as_str()) {
                let cert = ca.sign(hosts)?;
                slot.swap(&Pems {
                    cert: cert.cert_pem,
                    key: cert.key_pem,
                    ca: Some(cert.ca_pem),
                })?;
                tracing::info!(
                    "the CA in Secret {namespace}/{} changed: serving a certificate it signed",
                    k8s::webhook::CA_SECRET
                );
            }
            Some(ca.cert_pem)
        }
        CertSource::Dir(_) => {
            let pems = source.load(client).await?;
            if !slot.holds(&pems) {
                slot.swap(&pems)?;
                tracing::info!("--webhook-cert-dir: serving the renewed certificate");
            }
            None
        }
    };
    if k8s::repair_registration(client, ca.as_deref(), config).await? {
        tracing::info!(
            "MutatingWebhookConfiguration {} did not reach this webhook with the CA: patched its clientConfig",
            k8s::webhook::WEBHOOK_CONFIGURATION
        );
    }
    Ok(())
}

//! The webhook's serving certificate: where it comes from ([`CertSource`]: signed here by the CA
//! Secret's CA, or cert-manager's files under `--webhook-cert-dir`), and the slot the TLS server
//! asks at each handshake ([`CertSlot`]), which a new certificate replaces while it serves.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use tokio_rustls::rustls;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use super::ca::{WebhookTlsError, serving_cert};

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

/// Why no serving certificate could be had, or served.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error(transparent)]
    Signed(#[from] WebhookTlsError),
    #[error("--webhook-cert-dir: {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the webhook's certificate: {0}")]
    Cert(#[source] pem::Error),
    #[error("the webhook's key: {0}")]
    Key(#[source] pem::Error),
    #[error("the webhook's certificate and key: {0}")]
    Pair(#[source] rustls::Error),
}

impl CertSource {
    /// The current certificate: read from the directory, or signed by the Secret's CA (made
    /// first if there is none).
    pub async fn load(&self, client: &kube::Client) -> Result<Pems, CertificateError> {
        match self {
            CertSource::Secret { namespace, hosts } => {
                let cert = serving_cert(client, namespace, hosts).await?;
                Ok(Pems {
                    cert: cert.cert_pem,
                    key: cert.key_pem,
                    ca: Some(cert.ca_pem),
                })
            }
            CertSource::Dir(dir) => {
                let read = |file: &str| {
                    let path = dir.join(file);
                    std::fs::read_to_string(&path)
                        .map_err(|source| CertificateError::Read { path, source })
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
    pub fn new(provider: Arc<CryptoProvider>, pems: &Pems) -> Result<CertSlot, CertificateError> {
        let key = certified_key(&provider, pems)?;
        Ok(CertSlot {
            provider,
            current: RwLock::new((key, digest(pems))),
        })
    }

    /// The CA the current certificate was signed by here (`None` for a mounted one).
    pub(super) fn ca(&self) -> Option<String> {
        self.read().1.ca.clone()
    }

    pub(super) fn holds(&self, pems: &Pems) -> bool {
        self.read().1 == digest(pems)
    }

    pub(super) fn swap(&self, pems: &Pems) -> Result<(), CertificateError> {
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

fn certified_key(
    provider: &CryptoProvider,
    pems: &Pems,
) -> Result<Arc<CertifiedKey>, CertificateError> {
    let certs = CertificateDer::pem_slice_iter(pems.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(CertificateError::Cert)?;
    let key = PrivateKeyDer::from_pem_slice(pems.key.as_bytes()).map_err(CertificateError::Key)?;
    let key = CertifiedKey::from_der(certs, key, provider).map_err(CertificateError::Pair)?;
    Ok(Arc::new(key))
}

//! The webhook kept current while it runs: [`keep_current`] swaps a new serving certificate in
//! when its source changes (the CA Secret's CA, or cert-manager's files under
//! `--webhook-cert-dir`), then has the MutatingWebhookConfiguration's `clientConfig` repaired if
//! it no longer reaches this Service with that CA (a deleted configuration is left deleted:
//! that is an uninstall). Every replica converges on the same Secret, so none undoes another's
//! work.

use std::sync::Arc;
use std::time::Duration;

use super::ca::{CA_SECRET, webhook_ca};
use super::certificates::{CertSlot, CertSource, CertificateError, Pems};
use super::registration::{ClientConfig, WEBHOOK_CONFIGURATION, repair_registration};
use crate::k8s::error::{KubeError, error_chain};

/// How often a replica checks its certificate's source and the configuration. After a CA
/// change, a replica still serving the old CA's certificate is refused by the API server until
/// its check, so the window should be seconds; two GETs per replica every 10 s cost the API
/// server nothing.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);

/// Why one check failed (it is tried again at the next).
#[derive(Debug, thiserror::Error)]
enum UpkeepError {
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    #[error(transparent)]
    Registration(#[from] KubeError),
}

/// Every [`CHECK_EVERY`]: swap in a new certificate if its source changed, then repair the
/// configuration if it no longer reaches `config` with this certificate's CA. Runs until
/// aborted (a draining replica stops it: it must not point the configuration at itself).
pub(super) async fn keep_current(
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
                "checking the webhook's certificate and configuration (again in {CHECK_EVERY:?}): {}",
                error_chain(&e)
            );
        }
    }
}

async fn check(
    client: &kube::Client,
    source: &CertSource,
    slot: &CertSlot,
    config: &ClientConfig,
) -> Result<(), UpkeepError> {
    let ca = match source {
        CertSource::Secret { namespace, hosts } => {
            // A new serving certificate only when the Secret's CA is not the one in use.
            let ca = webhook_ca(client, namespace)
                .await
                .map_err(CertificateError::from)?;
            if slot.ca().as_deref() != Some(ca.cert_pem.as_str()) {
                let cert = ca.sign(hosts).map_err(CertificateError::from)?;
                slot.swap(&Pems {
                    cert: cert.cert_pem,
                    key: cert.key_pem,
                    ca: Some(cert.ca_pem),
                })?;
                tracing::info!(
                    "the CA in Secret {namespace}/{CA_SECRET} changed: serving a certificate it signed"
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
    if repair_registration(client, ca.as_deref(), config).await? {
        tracing::info!(
            "MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION} did not reach this webhook with the CA: patched its clientConfig"
        );
    }
    Ok(())
}

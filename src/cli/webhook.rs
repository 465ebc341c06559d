//! The pod webhook's flags (`sync --watch --webhook-address`), parsed into
//! [`WebhookOptions`] for [`WatcherProcess::serve_webhook`], and its start-up errors as exit codes.

use std::net::SocketAddr;
use std::time::Duration;

use crate::k8s::webhook::{WEBHOOK_CONFIGURATION as CONFIGURATION, Withdrawal, Withdrawn};
use crate::k8s::{
    CertificateError, StartError, WatcherProcess, WebhookOptions, WebhookTlsError, WebhookUrl,
};

use super::{CliError, Exit};

/// The default `--webhook-shutdown-delay`. After SIGTERM the endpoints must drop this replica
/// before it stops listening: kubelet marks a deleted pod's endpoint not ready at once, and the
/// EndpointSlice controller and the API server's informer pass that on in about a second on a
/// healthy cluster, a few on a loaded one; a failed readiness probe (SIGTERM without a pod
/// deletion) takes the probe's period (2 s, as docs/webhook.md asks). 5 s covers both, and with
/// the wait for answers in flight ([`WEBHOOK_TIMEOUT`]) stays well inside the default
/// terminationGracePeriodSeconds of 30.
const SHUTDOWN_DELAY: &str = "5s";

/// `sync --watch` flags of the pod webhook.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct WebhookArgs {
    /// With --watch: serve the pod webhook (HTTPS) on this address, e.g. 0.0.0.0:9443. Pods
    /// labelled portalloc.dev/allocation=NAME get their ports as env vars at creation.
    #[arg(long, value_name = "HOST:PORT", requires = "watch")]
    pub webhook_address: Option<SocketAddr>,
    /// Register the webhook at this base URL (https://HOST:PORT) instead of the Service, for a
    /// webhook running outside the cluster. The registration is removed when the watcher stops
    /// on SIGTERM or Ctrl-C; after a kill -9 it stays (labelled pods refused) until `kubectl
    /// delete mutatingwebhookconfiguration portalloc`.
    #[arg(long, value_name = "URL", requires = "webhook_address")]
    pub webhook_url: Option<String>,
    /// The namespace of the webhook's Service and CA Secret (in a pod: its own namespace).
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "POD_NAMESPACE",
        default_value = "portalloc-system"
    )]
    pub webhook_namespace: String,
    /// The Service in front of the webhook (port 443).
    #[arg(long, value_name = "NAME", default_value = "portalloc-webhook")]
    pub webhook_service: String,
    /// Serve the certificate in this directory (tls.crt, tls.key; e.g. cert-manager's Secret
    /// mounted, re-read when renewed) and leave the caBundle to cert-manager's CA injector,
    /// instead of the CA Secret.
    #[arg(long, value_name = "DIR", requires = "webhook_address")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,
    /// After SIGTERM, how long the webhook keeps answering while /readyz fails, so the
    /// Service's endpoints drop this replica before it stops listening. Behind a Service only
    /// (with --webhook-url nothing routes by readiness, and it stops at once).
    #[arg(long, value_name = "DURATION", default_value = SHUTDOWN_DELAY,
          value_parser = super::duration::parse_duration, conflicts_with = "webhook_url")]
    pub webhook_shutdown_delay: Duration,
}

/// Start the webhook beside the watcher if asked.
pub async fn start(watcher: &mut WatcherProcess, args: &WebhookArgs) -> anyhow::Result<()> {
    let Some(options) = args.options()? else {
        return Ok(());
    };
    watcher
        .serve_webhook(&options)
        .await
        .map_err(|e| start_error(e, options.address))?;
    if let Some(url) = &args.webhook_url {
        eprintln!(
            "registered MutatingWebhookConfiguration {CONFIGURATION} to call {}/mutate; it is \
             removed when this watcher stops on SIGTERM or Ctrl-C. If the process is killed \
             instead (kill -9, a crash), it stays and every labelled pod is refused until you run \
             `{REMOVE}`",
            url.trim_end_matches('/')
        );
    }
    Ok(())
}

/// The one command that removes a registration a killed watcher left.
const REMOVE: &str = "kubectl delete mutatingwebhookconfiguration portalloc";

/// Say what became of a URL registration when the webhook stopped.
pub fn report_withdrawal(withdrawn: Withdrawn) {
    match withdrawn {
        Ok(Withdrawal::Removed) => eprintln!(
            "removed MutatingWebhookConfiguration {CONFIGURATION}: pods are no longer sent to \
             this webhook"
        ),
        Ok(Withdrawal::Absent) => {
            eprintln!("MutatingWebhookConfiguration {CONFIGURATION} was already removed")
        }
        Ok(Withdrawal::Elsewhere(calls)) => eprintln!(
            "left MutatingWebhookConfiguration {CONFIGURATION} in place: it now calls {calls}, \
             not this webhook"
        ),
        Err(e) => eprintln!(
            "warning: could not remove MutatingWebhookConfiguration {CONFIGURATION} ({e}); \
             until it is removed every labelled pod is refused: `{REMOVE}`"
        ),
    }
}

impl WebhookArgs {
    /// The webhook's options, `None` without `--webhook-address`.
    fn options(&self) -> Result<Option<WebhookOptions>, CliError> {
        let Some(address) = self.webhook_address else {
            return Ok(None);
        };
        let url = match &self.webhook_url {
            Some(url) => Some(WebhookUrl::parse(url).ok_or_else(|| {
                CliError::new(
                    Exit::Usage,
                    format!("--webhook-url {url}: expected https://HOST[:PORT]"),
                )
            })?),
            None => None,
        };
        Ok(Some(WebhookOptions {
            address,
            namespace: self.webhook_namespace.clone(),
            service: self.webhook_service.clone(),
            url,
            cert_dir: self.webhook_cert_dir.clone(),
            shutdown_delay: self.webhook_shutdown_delay,
        }))
    }
}

/// The exit code and message of a webhook that did not start: a flag's value that does not
/// work is a usage error, a missing namespace names the flag that moves it.
fn start_error(e: StartError, address: SocketAddr) -> anyhow::Error {
    match e {
        StartError::Certificate(CertificateError::Signed(
            e @ WebhookTlsError::NamespaceMissing { .. },
        )) => CliError::new(
            Exit::NotFound,
            format!(
                "{e}, or pass --webhook-namespace NAMESPACE to keep it in a namespace that exists"
            ),
        )
        .into(),
        StartError::Certificate(CertificateError::Signed(e)) => e.into(),
        StartError::Certificate(e) => e.into(),
        StartError::Unusable(e) => {
            CliError::new(Exit::Usage, format!("--webhook-address {address}: {e}")).into()
        }
        StartError::Serve(e) => {
            CliError::new(Exit::Usage, format!("--webhook-address {address}: {e}")).into()
        }
        StartError::Register(e) => e.into(),
    }
}

//! The pod webhook, whole: its decisions (`decision`, with the record check before a pod gets
//! its ports, and why it denies one: `denial`), its HTTPS endpoint (`serve`), its serving
//! certificate (`certificates`, signed by the CA of `ca` or mounted from cert-manager), its
//! MutatingWebhookConfiguration (`registration`), all kept current while it runs (`upkeep`),
//! and started together from one set of options (`start`). The CLI (`sync --watch
//! --webhook-address`) only parses its flags.

mod ca;
mod certificates;
mod decision;
mod denial;
mod record_check;
mod registration;
mod serve;
mod start;
mod upkeep;

use std::time::Duration;

pub use ca::{CA_SECRET, ServingCert, WebhookCa, WebhookTlsError, serving_cert, webhook_ca};
pub use certificates::CertificateError;
pub use decision::PodWebhook;
pub use denial::{Denial, RecordCheckError};
pub use registration::{
    ClientConfig, WEBHOOK_CONFIGURATION, Withdrawal, register_webhook, repair_registration,
    withdraw_registration,
};
pub use serve::{ServeError, WebhookServer, Withdrawn};
pub use start::{StartError, WebhookOptions, WebhookUrl, start_webhook};

/// The API server's timeout for our webhook (`timeoutSeconds`); a sync that would take longer
/// is cut short by it, and the pod is retried by its controller.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

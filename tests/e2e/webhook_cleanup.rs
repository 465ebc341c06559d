//! A watcher registered by URL (`--webhook-url`, a laptop's) removes its MutatingWebhookConfiguration
//! when it stops on SIGTERM, and says so; it leaves one that another watcher registered since;
//! one registered through the Service stays (the other replicas answer through it). On a
//! control plane of its own: the configuration is cluster-wide.

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Client;
use kube::api::Api;

use crate::support;
use crate::support::private_cluster::PrivateCluster;
use crate::support::webhook::{Log, Webhook, WebhookCommand};

/// How long a stop may take after SIGTERM (a guard, not a measurement).
const EXIT_WITHIN: Duration = Duration::from_secs(60);

/// SIGTERM, then its exit code and its log once it has exited.
fn terminate(mut webhook: Webhook) -> (Option<i32>, String) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(webhook.pid() as i32, libc::SIGTERM) };
    let started = Instant::now();
    let status = loop {
        if let Some(status) = webhook.child().try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < EXIT_WITHIN,
            "still running after SIGTERM:\n{}",
            webhook.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), webhook.log_text())
}

/// Until it is ready (its initial list done: a watcher signalled before that waits on a list
/// it no longer reads) and has printed `line`, if any.
fn wait_ready(webhook: &Webhook, line: Option<&str>) {
    let started = Instant::now();
    loop {
        let ready = webhook
            .get("/readyz")
            .is_some_and(|answer| answer.starts_with("HTTP/1.1 200"));
        if ready && line.is_none_or(|line| webhook.log_text().contains(line)) {
            return;
        }
        assert!(
            started.elapsed() < EXIT_WITHIN,
            "never ready:\n{}",
            webhook.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The start-up line of a webhook registered by URL.
const REGISTERED: &str = "registered MutatingWebhookConfiguration portalloc";

async fn configuration(client: &Client) -> Option<MutatingWebhookConfiguration> {
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt("portalloc")
        .await
        .unwrap()
}

fn url_of(configuration: &MutatingWebhookConfiguration) -> Option<String> {
    configuration
        .webhooks
        .as_ref()?
        .first()?
        .client_config
        .url
        .clone()
}

#[tokio::test]
async fn a_laptop_webhook_removes_its_registration_on_sigterm_and_a_service_one_keeps_it() {
    let Some(cluster) = PrivateCluster::start("webhook-cleanup", true) else {
        return;
    };
    let client = cluster.client().await;
    for ns in ["quiet", "portalloc-system"] {
        support::create_namespace(&client, ns).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let command = || {
        WebhookCommand::new(&cluster.kubeconfig)
            .probes()
            .args(&["-v", "2"])
            .log(Log::InDir(dir.path().into()))
    };

    // Alone: its start-up line says what a kill -9 leaves and the command that removes it;
    // SIGTERM removes the registration and says so.
    let laptop = command().start(&client).await.unwrap();
    wait_ready(&laptop, Some(REGISTERED));
    let started = laptop.log_text();
    assert!(
        started.contains(&format!(
            "registered MutatingWebhookConfiguration portalloc to call {}",
            laptop.url()
        )) && started.contains("kill -9")
            && started.contains("`kubectl delete mutatingwebhookconfiguration portalloc`"),
        "{started}"
    );
    let (code, log) = terminate(laptop);
    assert_eq!(code, Some(0), "{log}");
    assert!(configuration(&client).await.is_none(), "{log}");
    assert!(
        log.contains("removed MutatingWebhookConfiguration portalloc"),
        "{log}"
    );

    // Two laptops: the first to stop is no longer the one called and leaves the registration
    // to the second, which removes it when it stops.
    let first = command().start(&client).await.unwrap();
    wait_ready(&first, Some(REGISTERED));
    let second = command().start(&client).await.unwrap();
    wait_ready(&second, Some(REGISTERED));
    let second_url = second.url();
    let (code, log) = terminate(first);
    assert_eq!(code, Some(0), "{log}");
    let kept = configuration(&client)
        .await
        .expect("the second one's registration");
    assert_eq!(url_of(&kept).as_deref(), Some(second_url.as_str()), "{log}");
    assert!(
        log.contains(&format!(
            "left MutatingWebhookConfiguration portalloc in place: it now calls {second_url}"
        )),
        "{log}"
    );
    let (code, log) = terminate(second);
    assert_eq!(code, Some(0), "{log}");
    assert!(configuration(&client).await.is_none(), "{log}");

    // Registered through the Service (a replica in the cluster): SIGTERM leaves it.
    let replica = command()
        .service("portalloc-webhook")
        .args(&["--webhook-shutdown-delay", "0s"])
        .start(&client)
        .await
        .unwrap();
    wait_ready(&replica, None);
    let (code, log) = terminate(replica);
    assert_eq!(code, Some(0), "{log}");
    let kept = configuration(&client).await;
    let service = kept
        .as_ref()
        .and_then(|c| c.webhooks.as_ref()?.first()?.client_config.service.clone());
    assert_eq!(
        service.map(|s| s.name).as_deref(),
        Some("portalloc-webhook"),
        "{log}"
    );
    assert!(
        !log.contains("removed MutatingWebhookConfiguration"),
        "{log}"
    );
}

//! The pod webhook as a process: `kubectl-portalloc sync --watch` of a namespace nobody uses (so
//! only admissions sync), serving `--webhook-address` on a free port. [`WebhookCommand`] starts
//! it as a test needs it: registered by URL (the default) or through a Service, with probes,
//! extra flags, environment and where its log goes; the [`Webhook`] it returns kills the process
//! when dropped, so a failed test leaves none running. [`start_webhook`] is the plain one (an
//! empty namespace of its own, registered by URL, silent). One per cluster at a time when
//! registered by URL: the configuration (`portalloc`) is the cluster's only one.

use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};

use super::ports::{free_port, free_port_on};
use super::probe_http;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-portalloc");
/// The configuration the webhook registers itself in.
const CONFIGURATION: &str = "portalloc";
/// How long the webhook may take to register itself, unless the test says otherwise.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the webhook's stderr goes.
pub enum Log {
    Null,
    /// A pipe the test may read once the process has exited ([`Webhook::child`]).
    Piped,
    /// A file, quoted when the webhook fails to register.
    File(PathBuf),
    /// The file `webhook-<port>.log` in this directory, as [`Log::File`].
    InDir(PathBuf),
}

/// How to start one webhook process.
pub struct WebhookCommand {
    kubeconfig: PathBuf,
    watch_namespace: String,
    webhook_namespace: String,
    ip: Ipv4Addr,
    service: Option<String>,
    probes: bool,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: Log,
    register_timeout: Duration,
}

impl WebhookCommand {
    /// The webhook on the cluster of `kubeconfig`: watching `quiet`, its CA Secret in
    /// `portalloc-system`, on a loopback port registered by URL, no probes, no log.
    pub fn new(kubeconfig: &Path) -> WebhookCommand {
        WebhookCommand {
            kubeconfig: kubeconfig.to_path_buf(),
            watch_namespace: "quiet".to_string(),
            webhook_namespace: "portalloc-system".to_string(),
            ip: Ipv4Addr::LOCALHOST,
            service: None,
            probes: false,
            args: Vec::new(),
            env: Vec::new(),
            log: Log::Null,
            register_timeout: REGISTER_TIMEOUT,
        }
    }

    /// The namespace `sync --watch` watches (`-n`).
    pub fn watch_namespace(mut self, namespace: &str) -> Self {
        self.watch_namespace = namespace.to_string();
        self
    }

    /// `--webhook-namespace`: where its CA Secret (and Service) are.
    pub fn webhook_namespace(mut self, namespace: &str) -> Self {
        self.webhook_namespace = namespace.to_string();
        self
    }

    /// Serve on a free port of `ip` instead of loopback.
    pub fn address(mut self, ip: Ipv4Addr) -> Self {
        self.ip = ip;
        self
    }

    /// Register through the Service `name` (`--webhook-service`) instead of by URL.
    pub fn service(mut self, name: &str) -> Self {
        self.service = Some(name.to_string());
        self
    }

    /// `--probe-address` on a free loopback port ([`Webhook::probes`]).
    pub fn probes(mut self) -> Self {
        self.probes = true;
        self
    }

    /// Extra arguments after the webhook's own.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// An environment variable of the process (beside `KUBECONFIG`).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    pub fn log(mut self, log: Log) -> Self {
        self.log = log;
        self
    }

    /// How long [`Webhook::wait_registered`] waits.
    pub fn register_timeout(mut self, timeout: Duration) -> Self {
        self.register_timeout = timeout;
        self
    }

    /// Start the process; it is not registered yet.
    pub fn spawn(self) -> anyhow::Result<Webhook> {
        let port = free_port_on(self.ip);
        let probes = self.probes.then(free_port);
        let mut command = Command::new(BIN);
        command
            .args(["sync", "--watch", "-n", &self.watch_namespace])
            .args(["--webhook-address", &format!("{}:{port}", self.ip)])
            .args(["--webhook-namespace", &self.webhook_namespace]);
        match &self.service {
            Some(service) => command.args(["--webhook-service", service]),
            None => command.args(["--webhook-url", &format!("https://{}:{port}", self.ip)]),
        };
        if let Some(probes) = probes {
            command.args(["--probe-address", &format!("127.0.0.1:{probes}")]);
        }
        command
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let log = match &self.log {
            Log::Null | Log::Piped => None,
            Log::File(path) => Some(path.clone()),
            Log::InDir(dir) => Some(dir.join(format!("webhook-{port}.log"))),
        };
        match &log {
            Some(path) => {
                let file = std::fs::File::create(path)
                    .with_context(|| format!("create {}", path.display()))?;
                command.stderr(file)
            }
            None if matches!(self.log, Log::Piped) => command.stderr(Stdio::piped()),
            None => command.stderr(Stdio::null()),
        };
        let child = command
            .spawn()
            .context("start the pod webhook (kubectl-portalloc sync --watch --webhook-address)")?;
        Ok(Webhook {
            child: Some(child),
            ip: self.ip,
            port,
            probes,
            service: self.service,
            webhook_namespace: self.webhook_namespace,
            log,
            register_timeout: self.register_timeout,
        })
    }

    /// Start the process and wait until the configuration points at it.
    pub async fn start(self, client: &Client) -> anyhow::Result<Webhook> {
        let mut webhook = self.spawn()?;
        webhook.wait_registered(client).await?;
        Ok(webhook)
    }
}

/// A running webhook process, killed (and reaped) when dropped.
pub struct Webhook {
    /// Always `Some` until [`Webhook::into_child`] takes it.
    child: Option<Child>,
    ip: Ipv4Addr,
    port: u16,
    probes: Option<u16>,
    service: Option<String>,
    webhook_namespace: String,
    log: Option<PathBuf>,
    register_timeout: Duration,
}

impl Webhook {
    /// The port it serves the webhook on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its probe port (started with [`WebhookCommand::probes`]).
    pub fn probes(&self) -> u16 {
        self.probes
            .expect("the webhook was started without --probe-address")
    }

    /// The URL it registers when registered by URL.
    pub fn url(&self) -> String {
        format!("https://{}:{}/mutate", self.ip, self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the webhook process").id()
    }

    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the webhook process")
    }

    /// The process, no longer killed on drop: the caller kills and waits for it.
    pub fn into_child(mut self) -> Child {
        self.child.take().expect("the webhook process")
    }

    /// Kill it now (SIGKILL) and reap it.
    pub fn kill(self) {
        drop(self);
    }

    /// What it logged so far (started with [`Log::File`] or [`Log::InDir`]; empty otherwise).
    pub fn log_text(&self) -> String {
        self.log
            .as_ref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .unwrap_or_default()
    }

    /// The whole HTTP answer to `GET path` on its probe port, if it answers.
    pub fn get(&self, path: &str) -> Option<String> {
        probe_http::get(self.probes(), path)
    }

    /// Whether the configuration's webhook points at this process.
    fn points_here(&self, configuration: Option<MutatingWebhookConfiguration>) -> bool {
        let Some(config) =
            configuration.and_then(|c| Some(c.webhooks?.into_iter().next()?.client_config))
        else {
            return false;
        };
        match &self.service {
            Some(name) => config
                .service
                .is_some_and(|s| &s.name == name && s.namespace == self.webhook_namespace),
            None => config.url.is_some_and(|url| url == self.url()),
        }
    }

    /// Until the configuration points at this process and it accepts connections; an error if
    /// it exits first or takes longer than its register timeout (with its log, if in a file).
    pub async fn wait_registered(&mut self, client: &Client) -> anyhow::Result<()> {
        let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let what = match &self.service {
            Some(service) => format!("Service {}/{service}", self.webhook_namespace),
            None => self.url(),
        };
        let started = Instant::now();
        loop {
            let configuration = api.get_opt(CONFIGURATION).await.with_context(|| {
                format!("read the MutatingWebhookConfiguration {CONFIGURATION}")
            })?;
            if self.points_here(configuration) && TcpStream::connect((self.ip, self.port)).is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child().try_wait() {
                bail!(
                    "the pod webhook exited before it registered ({status}){}",
                    self.log_suffix()
                );
            }
            if started.elapsed() > self.register_timeout {
                bail!(
                    "the pod webhook never registered {what} within {}s{}",
                    self.register_timeout.as_secs(),
                    self.log_suffix()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_suffix(&self) -> String {
        match &self.log {
            Some(_) => format!(": {}", self.log_text()),
            None => String::new(),
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Start the webhook on the cluster of `kubeconfig` (`client` is a client of it), keeping its
/// CA Secret in `namespace` (which must exist; `<namespace>-quiet` is created for its watch),
/// and wait until it is registered. The caller kills and waits for the child; on an error it
/// is killed here.
pub async fn start_webhook(
    kubeconfig: &Path,
    client: &Client,
    namespace: &str,
) -> anyhow::Result<Child> {
    let quiet = format!("{namespace}-quiet");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let object: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": quiet}}))?;
    if namespaces.get_opt(&quiet).await?.is_none() {
        namespaces
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("create namespace {quiet}"))?;
    }
    let webhook = WebhookCommand::new(kubeconfig)
        .watch_namespace(&quiet)
        .webhook_namespace(namespace)
        .start(client)
        .await?;
    Ok(webhook.into_child())
}

//! `kubectl portalloc sync`: allocate or release so every status matches its spec. This is the
//! GitOps path: Argo CD or Flux applies the CRs, and sync gives them their ports.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use kube::ResourceExt;

use super::dry_run::DryRunArg;
use super::output::{OutputFormat, print_names, print_objects};
use super::report::{print_report_to, take_configmap_error};
use super::{CliError, Exit, GlobalArgs, Session, exit_for, render_error};
use crate::k8s::{
    self, WatcherProcess, WatcherSettings, WatcherStartError, get_allocation, list_allocations,
};
use crate::ledger::leader_lease::lease_name;

/// Allocate or release ports so each PortAllocation's status matches its spec.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  # One PortAllocation
  kubectl portalloc sync sglang-pd -n llm

  # Every PortAllocation in every namespace, e.g. after `kubectl apply` or an Argo CD sync
  kubectl portalloc sync --all -A

  # What a sync would take and free, with nothing written
  kubectl portalloc sync --all -n llm --dry-run=client

  # Keep syncing as PortAllocations are created, changed and deleted (in a pod: see deploy/)
  kubectl portalloc sync --watch -A --probe-address 0.0.0.0:8080

  # Also inject ports into labelled pods as env vars (the pod webhook; see deploy/webhook.yaml)
  kubectl portalloc sync --watch -A --probe-address 0.0.0.0:8080 --webhook-address 0.0.0.0:9443

  # One of several replicas: work only while holding Lease portalloc-system/portalloc-watcher
  kubectl portalloc sync --watch -A --leader-elect --webhook-address 0.0.0.0:9443")]
#[command(group = clap::ArgGroup::new("mode").args(["all", "watch"]))]
pub struct SyncArgs {
    /// The PortAllocation to sync.
    #[arg(conflicts_with = "mode")]
    pub name: Option<String>,
    /// Sync every PortAllocation in the namespace (or in all of them with -A).
    #[arg(long)]
    pub all: bool,
    /// With --all or --watch: in every namespace.
    #[arg(short = 'A', long, requires = "mode")]
    pub all_namespaces: bool,
    /// Keep running: sync on every create and spec change, free the ports of deleted
    /// PortAllocations, and (with -A) repair leaked entries. Stops cleanly on SIGTERM.
    #[arg(long)]
    pub watch: bool,
    /// With --watch: how often every PortAllocation is synced again (and leaks repaired).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = super::duration::parse_duration, requires = "watch")]
    pub resync: Duration,
    /// With --watch: how many PortAllocations are synced at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..), requires = "watch")]
    pub concurrency: u16,
    /// With --watch: serve /healthz, /readyz and Prometheus /metrics on this address (e.g.
    /// 0.0.0.0:8080).
    #[arg(long, value_name = "HOST:PORT", requires = "watch")]
    pub probe_address: Option<SocketAddr>,
    /// With --watch: sync, repair and count pools only while this replica holds the watcher's
    /// Lease, so that of several replicas one works and the others stand by (each serves the
    /// webhook either way). The chart's replicas run with it.
    #[arg(long, requires = "watch")]
    pub leader_elect: bool,
    /// With --leader-elect: the namespace of the Lease (portalloc-watcher, or
    /// portalloc-watcher-NAMESPACE with -n) [default: --webhook-namespace, the pod's own].
    #[arg(long, value_name = "NAMESPACE", requires = "leader_elect")]
    pub leader_election_namespace: Option<String>,
    /// With --watch: this replica's name, as the Lease's holder and on its Events [default:
    /// HOSTNAME_PID].
    #[arg(long, value_name = "NAME", env = "POD_NAME", requires = "watch")]
    pub replica_name: Option<String>,
    #[arg(short = 'o', long, value_enum, conflicts_with = "watch")]
    pub output: Option<OutputFormat>,
    #[command(flatten)]
    pub dry_run: DryRunArg,
    #[command(flatten)]
    pub webhook: super::webhook::WebhookArgs,
}

pub async fn run(global: &GlobalArgs, args: SyncArgs) -> anyhow::Result<()> {
    if args.name.is_none() && !args.all && !args.watch {
        return Err(CliError::new(
            Exit::Usage,
            "name a PortAllocation, or pass --all or --watch (with -A for every namespace)",
        )
        .into());
    }
    let session = Session::connect(global).await?;
    if args.watch {
        if args.dry_run.mode().is_some() {
            return Err(CliError::new(
                Exit::Usage,
                "--dry-run previews one run; it cannot be combined with --watch",
            )
            .into());
        }
        return watch(session, args).await;
    }
    let targets = match &args.name {
        Some(name) => vec![get_allocation(&session.client, &session.namespace, name).await?],
        None => {
            let namespace = (!args.all_namespaces).then_some(session.namespace.as_str());
            list_allocations(&session.client, namespace).await?
        }
    };
    if let Some(mode) = args.dry_run.mode() {
        let items = targets
            .into_iter()
            .map(|pa| (pa, k8s::Intent::Sync))
            .collect();
        return super::dry_run::run(&session, items, mode, args.output, &[]).await;
    }
    let total = targets.len();
    let mut failures = Vec::new();
    let mut synced = Vec::new();
    // Several objects: one write per changed shard of each pool for all of them (group commit).
    let results = if args.name.is_some() {
        let mut one = Vec::new();
        for pa in targets {
            one.push(session.allocator.sync_or_record(pa).await);
        }
        one
    } else {
        session.allocator.sync_all(targets).await
    };
    for result in results {
        match result {
            Ok(mut report) => {
                let configmap_error = take_configmap_error(&mut report);
                // With -o, stdout is for the objects or names alone.
                print_report_to(&report, session.verbosity, args.output.is_some());
                synced.push(report.allocation);
                // Its ports are synced either way; the ConfigMap failure still fails the run.
                if let Some(e) = configmap_error {
                    let e = anyhow::Error::from(e);
                    if total > 1 {
                        eprintln!("error: {}", render_error(&e));
                    }
                    failures.push(e);
                }
            }
            Err(e) => {
                let e = anyhow::Error::from(e);
                if total > 1 {
                    eprintln!("error: {}", render_error(&e));
                }
                failures.push(e);
            }
        }
    }
    match args.output {
        Some(format @ (OutputFormat::Json | OutputFormat::Yaml)) => {
            print_objects(&synced, format, args.name.is_some())?
        }
        Some(OutputFormat::Name) => print_names(
            "portallocation.portalloc.dev",
            synced.iter().map(|pa| pa.name_any()),
        )?,
        _ => {}
    }
    if total == 0 {
        eprintln!("No PortAllocations found.");
    }
    match failures.len() {
        0 => Ok(()),
        1 if total == 1 => Err(failures.remove(0)),
        n => {
            let exit = exit_for(&failures[0]);
            Err(CliError::new(
                exit,
                format!("{n} of {total} PortAllocations could not be synced (see above)"),
            )
            .into())
        }
    }
}

/// `sync --watch`: run the watcher until SIGTERM or Ctrl-C. The first signal stops it
/// gracefully (syncs in flight finish; the webhook drains); a second one stops it at once.
async fn watch(session: Session, args: SyncArgs) -> anyhow::Result<()> {
    let namespace = (!args.all_namespaces).then(|| session.namespace.clone());
    let lease = args.leader_elect.then(|| k8s::LeaseRef {
        namespace: (args.leader_election_namespace.clone())
            .unwrap_or_else(|| args.webhook.webhook_namespace.clone()),
        name: lease_name(namespace.as_deref()),
    });
    let settings = WatcherSettings {
        namespace,
        resync: args.resync,
        concurrency: args.concurrency,
        probe_address: args.probe_address,
        lease,
        identity: args.replica_name.clone(),
    };
    // A long-lived process keeps its copies in memory; none on disk (a pod's root file system is
    // read-only, and no later command would read them).
    let allocator =
        k8s::Allocator::new(session.client.clone()).with_policy(session.allocator.policy);
    let mut watcher = WatcherProcess::prepare(session.client, allocator, settings)
        .await
        .map_err(start_error)?;
    super::webhook::start(&mut watcher, &args.webhook).await?;
    let options = watcher.options();
    let scope = match options.namespace.as_deref() {
        None => "every namespace".to_string(),
        Some(ns) => format!("namespace {ns}"),
    };
    let replica = watcher.replica();
    let election = match &replica.lease {
        Some(lease) => format!(" while {} holds Lease {lease}", replica.identity),
        None => String::new(),
    };
    eprintln!(
        "watching PortAllocations in {scope} (resync every {:?}){election}; stop with SIGTERM \
         or Ctrl-C",
        options.resync
    );
    watcher.run(super::webhook::report_withdrawal).await;
    Ok(())
}

/// A watcher that did not start: a probe address that cannot be served is a usage error.
fn start_error(e: WatcherStartError) -> anyhow::Error {
    match e {
        WatcherStartError::Signals(e) => e.into(),
        WatcherStartError::Access(e) => e.into(),
        WatcherStartError::Probes { address, error } => {
            CliError::new(Exit::Usage, format!("--probe-address {address}: {error}")).into()
        }
    }
}

//! `kubectl portalloc node-agent`: on one node, keep every pool's ports out of the kernel's
//! ephemeral choice, and keep the bind guard's maps equal to which pod on the node holds which
//! port. It watches the PortPools and the pods bound to its node, looks at kubelet's cgroup
//! tree, and writes only to the kernel (and Events): the record stays the webhook's and the
//! allocator's.
//!
//! Every round (a few times a second) is idempotent: it computes what the kernel should hold
//! and writes what differs, so a restart, a missed watch event or a pod deleted while the agent
//! was down all come right on the next round.

mod attachment;
mod bind_events;
mod conditions;
mod holdings;
mod lease;
mod removal;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher;

use crate::api::{GuardMode, PortPool};
use crate::k8s::process::Metrics;
use crate::k8s::process::Readiness;
use crate::k8s::record::ShardStore;
use crate::ledger::node_guard::{HeldTwice, NodePlan, PodHolding, node_plan, owners};
use crate::ledger::node_report::NodeReport;
use crate::node::bind_guard::BindGuard;
use crate::node::bind_program::{
    MODE_AUDIT, MODE_ENFORCE, POD_SEEN, QOS_DIR, VERDICT_AUDITED, VERDICT_CLAIMED, VERDICT_REFUSED,
};
use crate::node::cgroups::{self, CgroupDriver, PodCgroups};
use crate::node::reserved_ports::ReservedPorts;
use bind_events::BindEvents;
pub use bind_events::{BindEvent, BindVerdict};
use conditions::{Conditions, Transition};
pub use lease::{node_reports, publish};
pub use removal::{NodeFootprint, remove_from_node};

/// How a node agent runs.
#[derive(Clone, Debug)]
pub struct NodeAgentOptions {
    pub node_name: String,
    pub cgroup_root: PathBuf,
    /// `None`: whichever kubelet's tree shows (`kubepods.slice` means systemd).
    pub cgroup_driver: Option<CgroupDriver>,
    pub state_dir: PathBuf,
    /// The bpffs directory the guard pins its links and maps in (a subdirectory per node
    /// cgroup root).
    pub bpf_dir: PathBuf,
    pub reserved_ports_file: PathBuf,
    /// How often the kernel's state is brought up to date.
    pub round: Duration,
    /// How long after the agent's last round other pods' holder entries still refuse a pod
    /// new to the guard (its heartbeat's lease); past that, such a pod may claim the port.
    pub guard_lease: Duration,
    /// Where the agent's Lease (heartbeat and report) lives; `None`: no Lease.
    pub lease_namespace: Option<String>,
    /// How often the Lease is renewed; it counts as stale after three times that.
    pub report_every: Duration,
    /// The agent's own pod (in `lease_namespace`), whose DaemonSet tells an uninstall from a
    /// restart on SIGTERM; `None`: the guard always stays.
    pub pod_name: Option<String>,
}

/// How long a pod cgroup whose pod the API does not show may go unexplained before the agent
/// says so. It stays unseen all the same (it may claim a port no pod here holds): judged as a
/// pod that holds nothing, it would be refused its own ports.
const UNKNOWN_POD_GRACE: Duration = Duration::from_secs(10);

/// How long after a failed write of the Lease the agent tries again (at most: no longer than
/// its report interval): a missing namespace is not asked about five times a second.
const LEASE_RETRY: Duration = Duration::from_secs(5);

/// Reads of pods' PortAllocations and shards in flight at once.
const READS_AT_ONCE: usize = 16;

/// A mirror pod names its static pod's cgroup UID here.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Why the node agent stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum NodeAgentError {
    /// The watch of the PortPools or of the node's pods ended before its first list.
    #[error(transparent)]
    Watch(#[from] kube::runtime::reflector::store::WriterDropped),
    /// Its DaemonSet gone, the agent could not take what it put on the node off it.
    #[error("{reason}; run `kubectl portalloc node-agent --detach` on node {node}")]
    Removal { node: String, reason: String },
}

/// Run until `stop` resolves.
pub async fn run_node_agent(
    client: kube::Client,
    options: NodeAgentOptions,
    (readiness, metrics): (Readiness, Metrics),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), NodeAgentError> {
    let node = options.node_name.clone();
    let pools = watch_store(
        Api::<PortPool>::all(client.clone()),
        watcher::Config::default(),
    );
    let pods = watch_store(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={node}")),
    );
    let mut agent = Agent {
        client: client.clone(),
        shards: ShardStore::new(client.clone()),
        bind_events: BindEvents::new(client, &node),
        reserved_ports: ReservedPorts::at(&options.reserved_ports_file, &options.state_dir),
        options,
        guard: None,
        guard_failure: None,
        plan: None,
        holdings: HashMap::new(),
        first_seen: HashMap::new(),
        written_pods: None,
        written_owners: None,
        held_twice: Vec::new(),
        written_modes: None,
        reserved: None,
        metrics,
        published: None,
        lease_retry_at: None,
        conditions: Conditions::default(),
    };
    pools.wait_until_ready().await?;
    pods.wait_until_ready().await?;
    let own = removal::own_daemonset_of(&agent.client, &agent.options).await;
    readiness.mark_ready();
    tracing::info!(node = %node, "node agent started");
    tokio::pin!(stop);
    let mut ticker = tokio::time::interval(agent.options.round);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = ticker.tick() => {}
        }
        let round = agent.round(&pools.state(), &pods.state()).await;
        agent.note(
            "round",
            "the guard's round works again",
            round.map_err(|e| format!("node agent round: {e}")),
        );
    }
    removal::on_stop(&agent.client, own.as_ref(), &agent.options).await
}

fn watch_store<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    K: serde::de::DeserializeOwned,
{
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher::watcher(api, config)
            .default_backoff()
            .modify(|o| o.meta_mut().managed_fields = None),
    );
    tokio::spawn(stream.for_each(|_| async {}));
    reader
}

struct Agent {
    client: kube::Client,
    shards: ShardStore,
    bind_events: BindEvents,
    reserved_ports: ReservedPorts,
    options: NodeAgentOptions,
    guard: Option<BindGuard>,
    /// Why the guard is not attached, said once.
    guard_failure: Option<String>,
    plan: Option<NodePlan>,
    /// Pod UID → what it holds (`None`: nothing), once the record was read for it.
    holdings: HashMap<String, Option<PodHolding>>,
    /// When a pod cgroup was first seen, for pods the API does not show (yet).
    first_seen: HashMap<String, Instant>,
    written_pods: Option<BTreeMap<u64, u32>>,
    written_owners: Option<BTreeMap<u32, u64>>,
    /// Ports two pods on the node hold (two pools over one port), as report lines.
    held_twice: Vec<String>,
    written_modes: Option<BTreeMap<u32, u32>>,
    /// The ports last reserved.
    reserved: Option<BTreeSet<u16>>,
    metrics: Metrics,
    /// The report last written to the Lease, and when.
    published: Option<(NodeReport, Instant)>,
    /// After a failed write of the Lease: not before then.
    lease_retry_at: Option<Instant>,
    /// What fails round after round, said when it starts and ends.
    conditions: Conditions,
}

impl Agent {
    /// Say a lasting condition (`key`) when it starts or changes, as a warning, and when it
    /// ends, as `ended` with what it last said; not every round.
    fn note(&mut self, key: &str, ended: &str, outcome: Result<(), String>) {
        let node = &self.options.node_name;
        match self.conditions.observe(key, outcome) {
            Some(Transition::Started(message) | Transition::Changed(message)) => {
                tracing::warn!(node = %node, "{message}")
            }
            Some(Transition::Ended(message)) => {
                tracing::info!(node = %node, "{ended} (it was: {message})")
            }
            None => {}
        }
    }

    async fn round(
        &mut self,
        pools: &[std::sync::Arc<PortPool>],
        pods: &[std::sync::Arc<Pod>],
    ) -> std::io::Result<()> {
        let pools: BTreeMap<String, PortPool> = pools
            .iter()
            .map(|p| (p.name_any(), (**p).clone()))
            .collect();
        let ephemeral = self.reserved_ports.ephemeral_range();
        let outcome = ephemeral
            .as_ref()
            .map(|_| ())
            .map_err(|e| format!("reading the ephemeral port range: {e}; reserving every pool"));
        self.note(
            "ephemeral-range",
            "the ephemeral port range reads again",
            outcome,
        );
        let ephemeral = ephemeral.ok();
        let plan = node_plan(&pools.values().cloned().collect::<Vec<_>>(), ephemeral);
        let plan_changed = self.plan.as_ref() != Some(&plan);
        self.plan = Some(plan.clone());
        if self.guard.is_some() {
            self.check_attachment();
        }
        if self.guard.is_none() {
            self.attach_guard();
        }
        // The guard's modes before the reservation: a deleted pool is unguarded before its
        // ports go back to the kernel's choice. Each is retried next round if it failed, and a
        // setting that cannot be written never keeps the guard from following the pools.
        let guarded = self.set_modes(&plan);
        if plan_changed {
            self.warn_unreserved(&plan);
        }
        // Every round, not only when the pools change: a value another writer put there
        // without the agent's entries gets them back.
        let reserved = self.reserved_ports.apply(&plan.reserved);
        let outcome = reserved.as_ref().map(|_| ()).map_err(ToString::to_string);
        self.note("reserve", "the pools' ports are reserved again", outcome);
        if let Ok(reservation) = reserved {
            if reservation.written || self.reserved.as_ref() != Some(&plan.reserved) {
                tracing::info!(
                    node = %self.options.node_name,
                    pool_ports = plan.reserved.len(),
                    reserved = reservation.reserved.len(),
                    guarded = ?plan.guarded,
                    "reserved every pool's ports"
                );
            }
            self.reserved = Some(plan.reserved.clone());
        }
        let guarded = match guarded {
            Ok(true) => self.guard_round(pods, &pools).await,
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        // Bounded, as the reads and the Events are: a round that hangs on the API server would
        // let the guard's holder entries lapse. Not written in time, it is tried next round.
        let budget = self.api_budget();
        let publish = self.publish_report(&pools, plan_changed);
        if tokio::time::timeout(budget, publish).await.is_err() {
            tracing::debug!(node = %self.options.node_name, "the Lease write is slow; trying again next round");
        }
        guarded
    }

    /// The guard's modes for `plan`, where they changed; `false` when no guard is attached.
    /// A guard attached afresh (after a reboot) gets none before its pods and owners are
    /// written: judged by empty maps, the first pod to bind a port would claim it, its holder's
    /// bind after that refused. And never before the QoS directories are marked, or a
    /// Burstable or BestEffort pod's bind would claim the port for its whole class.
    fn set_modes(&mut self, plan: &NodePlan) -> std::io::Result<bool> {
        let Some(guard) = &self.guard else {
            return Ok(false);
        };
        if !guard.took_over && self.written_owners.is_none() {
            return Ok(true);
        }
        let modes = guard_modes(plan);
        if self.written_modes.as_ref() != Some(&modes) {
            let qos_dirs = cgroups::qos_dirs(&self.kubepods(), self.driver())?;
            guard.set_qos_dirs(&qos_dirs.iter().map(|&(_, id)| id).collect::<Vec<_>>())?;
            guard.set_modes(&modes)?;
            self.written_modes = Some(modes);
        }
        Ok(true)
    }

    /// The guard's pods and owners brought up to date, then what it saw, as Events.
    async fn guard_round(
        &mut self,
        pods: &[std::sync::Arc<Pod>],
        pools: &BTreeMap<String, PortPool>,
    ) -> std::io::Result<()> {
        let kubepods = self.kubepods();
        let found = cgroups::scan(&kubepods, self.driver())?;
        let by_uid = pods_by_cgroup_uid(pods);
        self.learn_holdings(&found, &by_uid, pools).await;
        self.sync_maps(&found, &by_uid)?;
        if let Some(plan) = self.plan.clone() {
            self.set_modes(&plan)?;
        }
        self.finish_upgrade();
        self.publish_bind_events(&found, &by_uid).await
    }

    /// How long each of a round's three waits on the API server (the pods' records, the
    /// Events, the Lease) may take: a quarter of the guard's lease each, so a round ends, and
    /// beats, within the lease.
    fn api_budget(&self) -> Duration {
        self.options.guard_lease / 4
    }

    fn warn_unreserved(&self, plan: &NodePlan) {
        for (pool, why) in &plan.unusable {
            tracing::warn!(pool = %pool, "PortPool {pool:?} names no usable ports ({why}); nothing of it is reserved or guarded");
        }
        for line in &plan.unreserved {
            tracing::warn!(node = %self.options.node_name, "{line}");
        }
    }

    /// Read the record for pods whose cgroups are here and whose holdings are not known yet.
    async fn learn_holdings(
        &mut self,
        found: &PodCgroups,
        by_uid: &BTreeMap<String, std::sync::Arc<Pod>>,
        pools: &BTreeMap<String, PortPool>,
    ) {
        let missing: Vec<&std::sync::Arc<Pod>> = found
            .pods
            .keys()
            .filter(|uid| !self.holdings.contains_key(*uid))
            .filter_map(|uid| by_uid.get(uid))
            .collect();
        // A bounded number at once: a fresh agent on a node of 1,000 pods opened a connection
        // per pod's read (64 MiB); pods of one PortAllocation share its reads.
        let reads = holdings::RoundReads::default();
        let lookups = missing.iter().map(|pod| {
            let (client, shards, reads) = (&self.client, &self.shards, &reads);
            async move { holdings::holding_of(client, shards, reads, pools, pod).await }
        });
        // Within a quarter of the guard's lease: a slow API server must not keep the round
        // from its heartbeat. Pods not read by then stay unseen and are read next round.
        let budget = tokio::time::sleep(self.api_budget());
        let results: Vec<_> = futures::stream::iter(lookups)
            .buffered(READS_AT_ONCE)
            .take_until(budget)
            .collect()
            .await;
        for (pod, result) in missing.into_iter().zip(results) {
            let uid = cgroup_uid(pod);
            let key = format!("pod-ports/{uid}");
            let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            let outcome = match result {
                Ok(holding) => {
                    self.holdings.insert(uid, holding);
                    Ok(())
                }
                Err(e) => Err(format!(
                    "reading the ports of pod {name}: {e}; until they are read, the guard \
                     lets the pod claim pool ports no pod on this node holds rather than \
                     refuse it"
                )),
            };
            self.note(&key, &format!("the ports of pod {name} are read"), outcome);
        }
        self.conditions.forget_unless(|key| {
            key.strip_prefix("pod-ports/")
                .or_else(|| key.strip_prefix("pod-unknown/"))
                .is_none_or(|uid| found.pods.contains_key(uid))
        });
        self.holdings.retain(|uid, _| found.pods.contains_key(uid));
        self.first_seen
            .retain(|uid, _| found.pods.contains_key(uid));
        for uid in found.pods.keys() {
            self.first_seen
                .entry(uid.clone())
                .or_insert_with(Instant::now);
        }
        let unknown: Vec<String> = found
            .pods
            .keys()
            .filter(|uid| !by_uid.contains_key(*uid) && !self.holdings.contains_key(*uid))
            .filter(|uid| {
                self.first_seen
                    .get(*uid)
                    .is_some_and(|at| at.elapsed() >= UNKNOWN_POD_GRACE)
            })
            .cloned()
            .collect();
        let ended = self.conditions.holding_with("pod-unknown/");
        let ended = ended
            .iter()
            .filter_map(|key| key.strip_prefix("pod-unknown/"));
        let said: Vec<String> = ended.map(str::to_string).collect();
        for uid in unknown.iter().chain(&said) {
            let outcome = match unknown.contains(uid) {
                true => Err(format!(
                    "the pod cgroup of UID {uid} has no Pod in the API (a static pod without its \
                     mirror pod, or the agent's watch of pods is behind): its ports cannot be \
                     read, so the guard lets it claim pool ports no pod on this node holds \
                     rather than refuse it"
                )),
                false => Ok(()),
            };
            self.note(
                &format!("pod-unknown/{uid}"),
                &format!("the pod cgroup of UID {uid} is known"),
                outcome,
            );
        }
    }

    /// Whether the guard may judge the pod of `uid` as seen: only once its ports were read from
    /// the record. A pod whose ports could not be read (a failed read, or no Pod in the API)
    /// stays unseen however long: judged as seen, it would be refused its own ports.
    fn is_seen(&self, uid: &str) -> bool {
        self.holdings.contains_key(uid)
    }

    fn sync_maps(
        &mut self,
        found: &PodCgroups,
        by_uid: &BTreeMap<String, std::sync::Arc<Pod>>,
    ) -> std::io::Result<()> {
        let guard = self.guard.as_ref().expect("attached");
        let mut pods: BTreeMap<u64, u32> = found.qos_dirs.iter().map(|&id| (id, QOS_DIR)).collect();
        let mut holders = Vec::new();
        for (uid, &cgroup) in &found.pods {
            if self.is_seen(uid) {
                pods.insert(cgroup, POD_SEEN);
            }
            // A pod deleted from the API no longer holds: its StatefulSet's replacement may
            // be here before kubelet removes the old cgroup.
            if let Some(Some(holding)) = self.holdings.get(uid)
                && by_uid.contains_key(uid)
            {
                holders.push((cgroup, holding));
            }
        }
        let previous = self.written_owners.clone().unwrap_or_default();
        let (owners, twice) = owners(&holders, &previous);
        // Reported with the listener conflicts (logged once, in the Lease, in pool describe).
        self.held_twice = twice.iter().map(HeldTwice::line).collect();
        // Owners before pods: a pod marked seen must never be judged without its ports.
        if self.written_owners.as_ref() != Some(&owners) {
            guard.set_owners(&owners)?;
            self.written_owners = Some(owners);
        }
        if self.written_pods.as_ref() != Some(&pods) {
            guard.set_pods(&pods)?;
            self.written_pods = Some(pods);
        }
        // The maps are current: other pods' holder entries count for another lease.
        guard.heartbeat(self.options.guard_lease)?;
        Ok(())
    }

    /// Claims settled and verdicts counted since the last round, as Events on the pods.
    async fn publish_bind_events(
        &mut self,
        found: &PodCgroups,
        by_uid: &BTreeMap<String, std::sync::Arc<Pod>>,
    ) -> std::io::Result<()> {
        let guard = self.guard.as_ref().expect("attached");
        let uid_of: BTreeMap<u64, &String> =
            found.pods.iter().map(|(uid, &id)| (id, uid)).collect();
        let owners = self.written_owners.clone().unwrap_or_default();
        let mut settled = BTreeSet::new();
        let mut binds = Vec::new();
        for (slot, claimant) in guard.claims()? {
            match uid_of.get(&claimant) {
                None => {
                    settled.insert(slot);
                }
                Some(uid) if self.is_seen(uid) => {
                    settled.insert(slot);
                    if owners.get(&slot) != Some(&claimant) {
                        binds.push((claimant, slot, BindVerdict::TakenBeforeSeen, 1));
                    }
                }
                Some(_) => {}
            }
        }
        guard.drop_claims(&settled)?;
        for (key, count) in guard.take_verdicts()? {
            let verdict = match key.verdict {
                VERDICT_REFUSED => BindVerdict::Refused,
                VERDICT_AUDITED => BindVerdict::Audited,
                VERDICT_CLAIMED => continue,
                _ => continue,
            };
            binds.push((key.cgroup, key.slot, verdict, count));
        }
        let plan = self.plan.clone().unwrap_or_default();
        let events_until = Instant::now() + self.api_budget();
        let holder_of_slot = |slot: u32| {
            let cgroup = owners.get(&slot)?;
            let uid = uid_of.get(cgroup)?;
            let holding = self.holdings.get(*uid)?.as_ref()?;
            Some((holding.pod.clone(), holding.owner.clone()))
        };
        for (cgroup, slot, verdict, count) in binds {
            let pool = plan.pool_of_slot.get(&slot).cloned().unwrap_or_default();
            let mode = plan
                .modes
                .get(&slot)
                .copied()
                .unwrap_or(GuardMode::Disabled);
            let bind = BindEvent {
                verdict,
                slot,
                count,
                pool: &pool,
                mode,
                node: &self.options.node_name,
                holder: holder_of_slot(slot),
            };
            self.metrics
                .record_guard_bind(&pool, verdict.label(), count);
            let pod = uid_of.get(&cgroup).and_then(|uid| by_uid.get(*uid));
            tracing::warn!(
                node = %self.options.node_name,
                pod = pod.map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())),
                cgroup,
                verdict = verdict.label(),
                "{}",
                bind.message()
            );
            let left = events_until.saturating_duration_since(Instant::now());
            if let Some(pod) = pod
                && tokio::time::timeout(left, self.bind_events.publish(pod, &bind))
                    .await
                    .is_err()
            {
                tracing::warn!(
                    node = %self.options.node_name,
                    "the API server is too slow to take the guard's Events; this one is only logged"
                );
            }
        }
        Ok(())
    }
}

/// The guard's map values for the plan's guarded ports.
fn guard_modes(plan: &NodePlan) -> BTreeMap<u32, u32> {
    let value = |mode| match mode {
        GuardMode::Enforce => MODE_ENFORCE,
        _ => MODE_AUDIT,
    };
    plan.modes
        .iter()
        .map(|(&slot, &mode)| (slot, value(mode)))
        .collect()
}

/// The UID kubelet names a pod's cgroup after: a static pod's own, which its mirror pod in the
/// API carries in an annotation; every other pod's UID.
fn cgroup_uid(pod: &Pod) -> String {
    pod.annotations()
        .get(MIRROR_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| pod.uid().unwrap_or_default())
}

fn pods_by_cgroup_uid(pods: &[std::sync::Arc<Pod>]) -> BTreeMap<String, std::sync::Arc<Pod>> {
    pods.iter().map(|p| (cgroup_uid(p), p.clone())).collect()
}

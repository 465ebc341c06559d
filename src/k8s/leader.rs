//! Leader election's reads and writes (`sync --watch --leader-elect`): the watcher's Lease read
//! with a GET, then created, or written with the resourceVersion read — a compare-and-swap, as
//! every write of this code base. Every decision (expired, released, ours, what to write) is
//! [`crate::ledger::leader_lease`]'s. The rights: get, create and update on leases in one
//! namespace (the chart's Role `portalloc-watcher-leader`).
//!
//! While it leads, a replica renews by writing over the version it wrote last, without reading
//! first (client-go's fast path): one request per renewal. A candidate reads once per try.

use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta};

use crate::k8s::error::KubeError;
use crate::k8s::resources::LEASES;
use crate::ledger::leader_lease::{Candidate, LeaseTiming, Step};

/// The Lease the replicas compete for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRef {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for LeaseRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// This process's name among the replicas when none is given (`POD_NAME` unset): the host's
/// name and the process ID, as client-go suggests (`hostname_pid`).
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}_{}", std::process::id())
}

/// Why a leader stopped leading.
#[derive(Debug)]
pub enum Lost {
    /// Another replica holds the Lease now.
    Taken { holder: String },
    /// No renewal went through within the renew deadline.
    Lapsed { last: String },
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lost::Taken { holder } => write!(f, "{holder} holds it now"),
            Lost::Lapsed { last } => write!(f, "no renewal went through in time (last: {last})"),
        }
    }
}

/// What one try came to.
enum Attempt {
    Leading,
    Waiting {
        holder: String,
        valid_for: Duration,
    },
    /// Someone wrote the Lease between our read and our write (or created it first).
    Raced,
}

/// One replica's part in the election.
pub struct LeaderElection {
    api: Api<Lease>,
    lease: LeaseRef,
    candidate: Candidate,
    /// The Lease as we last wrote it, while we hold it.
    ours: Option<Lease>,
}

impl LeaderElection {
    pub fn new(client: Client, lease: LeaseRef, identity: &str, timing: LeaseTiming) -> Self {
        LeaderElection {
            api: Api::namespaced(client, &lease.namespace),
            lease,
            candidate: Candidate::new(identity, timing),
            ours: None,
        }
    }

    pub fn lease(&self) -> &LeaseRef {
        &self.lease
    }

    /// Try until this replica holds the Lease, every retry period. Says once who holds it, and
    /// each new failure once.
    pub async fn acquire(&mut self) {
        let timing = self.candidate.timing();
        let mut said = String::new();
        loop {
            let line = match tokio::time::timeout(timing.renew_deadline, self.try_once()).await {
                Ok(Ok(Attempt::Leading)) => return,
                Ok(Ok(Attempt::Raced)) => String::new(),
                Ok(Ok(Attempt::Waiting { holder, valid_for })) => {
                    if said != holder {
                        tracing::info!(
                            lease = %self.lease,
                            "{holder} leads (the Lease stays valid {}s unless renewed): \
                             serving the webhook only, ready to take over",
                            valid_for.as_secs()
                        );
                    }
                    holder
                }
                Ok(Err(e)) => {
                    let line = e.to_string();
                    if said != line {
                        tracing::warn!("leader election: {line} (trying again every {timing:?})");
                    }
                    line
                }
                Err(_) => {
                    let line = format!("no answer within {:?}", timing.renew_deadline);
                    if said != line {
                        tracing::warn!(lease = %self.lease, "leader election: {line}");
                    }
                    line
                }
            };
            if !line.is_empty() {
                said = line;
            }
            tokio::time::sleep(timing.retry_period).await;
        }
    }

    /// Renew every retry period while leading; returns when this replica no longer leads.
    pub async fn hold(&mut self) -> Lost {
        let timing = self.candidate.timing();
        let mut last_renewed = Instant::now();
        let mut last = String::from("none failed");
        loop {
            tokio::time::sleep(timing.retry_period).await;
            let sent = Instant::now();
            let left = timing
                .renew_deadline
                .saturating_sub(sent.saturating_duration_since(last_renewed));
            match tokio::time::timeout(left, self.try_once()).await {
                Ok(Ok(Attempt::Leading)) => last_renewed = sent,
                Ok(Ok(Attempt::Waiting { holder, .. })) => {
                    self.ours = None;
                    return Lost::Taken { holder };
                }
                Ok(Ok(Attempt::Raced)) => last = "the Lease changed under the renewal".into(),
                Ok(Err(e)) => {
                    last = e.to_string();
                    tracing::warn!(lease = %self.lease, "renewing the Lease: {last}");
                }
                Err(_) => last = format!("no answer within {left:?}"),
            }
            if self.candidate.lapsed(last_renewed, Instant::now()) {
                self.ours = None;
                return Lost::Lapsed { last };
            }
        }
    }

    /// Give the Lease up, so that another replica takes it at its next try (within a retry
    /// period) rather than after it expires. Best effort: a failure only makes the others
    /// wait out the lease duration.
    pub async fn release(&mut self) {
        let Some(ours) = self.ours.take() else {
            return;
        };
        let attempt = async {
            let mut current = ours;
            for _ in 0..2 {
                let spec = current.spec.clone().unwrap_or_default();
                let Some(released) = self.candidate.released(&spec, Timestamp::now()) else {
                    return Ok(false);
                };
                let mut lease = current.clone();
                lease.spec = Some(released);
                match self.write(&lease).await {
                    Ok(_) => return Ok(true),
                    Err(e) if is_conflict(&e) => match self.api.get_opt(&self.lease.name).await {
                        Ok(Some(read)) => current = read,
                        Ok(None) => return Ok(false),
                        Err(e) => return Err(self.failed(e, "get")),
                    },
                    Err(e) => return Err(self.failed(e, "update")),
                }
            }
            Ok(false)
        };
        match tokio::time::timeout(self.candidate.timing().renew_deadline, attempt).await {
            Ok(Ok(true)) => tracing::info!(
                lease = %self.lease,
                "released the Lease: another replica takes over at its next try"
            ),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!(
                "could not release the Lease (another replica takes over once it expires): {e}"
            ),
            Err(_) => tracing::warn!(
                lease = %self.lease,
                "could not release the Lease in time (another replica takes over once it expires)"
            ),
        }
    }

    /// One round: renew over our last write while we hold the Lease; else (or on a conflict)
    /// read it and do what the candidate decides.
    async fn try_once(&mut self) -> Result<Attempt, KubeError> {
        if let Some(ours) = self.ours.take() {
            let spec = ours.spec.clone().unwrap_or_default();
            if let Step::Write { spec, .. } =
                self.candidate
                    .step(Some(&spec), Instant::now(), Timestamp::now())
            {
                let mut lease = ours;
                lease.spec = Some(spec);
                match self.write(&lease).await {
                    Ok(written) => {
                        self.ours = Some(written);
                        return Ok(Attempt::Leading);
                    }
                    Err(e) if is_conflict(&e) => {}
                    Err(e) => return Err(self.failed(e, "update")),
                }
            }
        }
        let current = self
            .api
            .get_opt(&self.lease.name)
            .await
            .map_err(|e| self.failed(e, "get"))?;
        let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        match self
            .candidate
            .step(spec.as_ref(), Instant::now(), Timestamp::now())
        {
            Step::Wait { holder, valid_for } => Ok(Attempt::Waiting { holder, valid_for }),
            Step::Create(spec) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.lease.name.clone()),
                        namespace: Some(self.lease.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                match self
                    .api
                    .create(&crate::k8s::client::write_params(), &lease)
                    .await
                {
                    Ok(created) => {
                        self.ours = Some(created);
                        Ok(Attempt::Leading)
                    }
                    Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Attempt::Raced),
                    Err(e) => Err(self.failed(e, "create")),
                }
            }
            Step::Write { spec, .. } => {
                let mut lease = current.expect("a write follows a read of the Lease");
                lease.spec = Some(spec);
                match self.write(&lease).await {
                    Ok(written) => {
                        self.ours = Some(written);
                        Ok(Attempt::Leading)
                    }
                    Err(e) if is_conflict(&e) => Ok(Attempt::Raced),
                    Err(e) => Err(self.failed(e, "update")),
                }
            }
        }
    }

    /// A compare-and-swap: the write carries the resourceVersion `lease` was read or written at.
    async fn write(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.api
            .replace(&self.lease.name, &crate::k8s::client::write_params(), lease)
            .await
    }

    fn failed(&self, e: kube::Error, verb: &'static str) -> KubeError {
        let (name, namespace) = (&self.lease.name, Some(self.lease.namespace.as_str()));
        KubeError::from_kube(e, LEASES.on(verb, name, namespace))
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict())
}

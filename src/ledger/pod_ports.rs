//! Whether the ports the pod webhook would give a pod are its PortAllocation's in the pool's
//! record. The pod's ports come from the PortAllocation's status, which its tenant may write (it
//! must, to allocate client-side); the shards' entries are what the tenancy policy guards. So
//! before a pod gets a port, the entry of its owner's UID in the shard of the port's window (in
//! the copy its status names) must hold that port. Pure: the webhook reads the shards
//! (`k8s/webhook/record_check.rs`) and decides with this.
//!
//! Only the pod's own ports are checked (what it binds). The ports its references name are
//! addresses it dials, which a pod can set in its own env anyway.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::api::{PodInjection, PortAllocation, PortPoolShard, PortScope};
use crate::core::Holdings;

use super::record::windows::{ShardKey, shard_name, window, window_of};

/// One port a pod would be given, with the record shard that says who holds it (the port as
/// injected into the pod is [`crate::api::PodPort`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPortInShard {
    /// `role.port` in the PortAllocation's spec.
    pub name: String,
    pub port: u16,
    /// The shard whose entries say who holds it: the port's window in the copy the
    /// PortAllocation's status names.
    pub shard: ShardKey,
}

/// A port of a PortAllocation's status for a pod that is no port (a block that runs past port
/// 65535, or no port at all): a denial, with what to run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the ports of PortAllocation {namespace}/{name} for this pod ({port}={first} and {more} more) \
     are not ports: run kubectl portalloc sync {name} -n {namespace}, which rewrites its status \
     from the pool's record"
)]
pub struct PodPortsError {
    pub namespace: String,
    pub name: String,
    /// The port's name in the role.
    pub port: String,
    pub first: u16,
    /// How many ports of the block after `first`.
    pub more: u16,
}

/// Every port `injection` gives the pod (each port of a block): what the pod is told it binds.
pub fn pod_ports(
    pa: &PortAllocation,
    injection: &PodInjection,
) -> Result<Vec<PodPortInShard>, PodPortsError> {
    let mut ports = Vec::new();
    for given in &injection.ports {
        let copy = copy_of_pod_port(pa, injection, &given.name);
        let last = u32::from(given.first) + u32::from(given.count.max(1)) - 1;
        let last = match u16::try_from(last) {
            Ok(last) if given.first > 0 && given.count > 0 => last,
            _ => {
                return Err(PodPortsError {
                    namespace: namespace(pa).to_string(),
                    name: name(pa).to_string(),
                    port: given.name.clone(),
                    first: given.first,
                    more: given.count.saturating_sub(1),
                });
            }
        };
        ports.extend((given.first..=last).map(|port| PodPortInShard {
            name: format!("{}.{}", injection.role, given.name),
            port,
            shard: ShardKey::new(copy, window_of(port)),
        }));
    }
    Ok(ports)
}

/// The copy holding the pod's port `port`: its value's (the pod's own for PodScoped, its
/// group's for RoleScoped), which differs between pods of a workload spread over copies.
fn copy_of_pod_port(pa: &PortAllocation, injection: &PodInjection, port: &str) -> u16 {
    let Some(status) = pa.status.as_ref() else {
        return 0;
    };
    let role = pa.spec.role(&injection.role);
    let scope = role.and_then(|r| r.ports.iter().find(|p| p.name == port).map(|p| p.scope));
    let value = match (scope, role) {
        (Some(PortScope::RoleScoped), Some(role)) => injection.index / role.per_group().max(1),
        _ => injection.index,
    };
    status.copy_of(&injection.role, port, value as usize)
}

/// The shards to read for `ports`, each once.
pub fn pod_port_shards(ports: &[PodPortInShard]) -> BTreeSet<ShardKey> {
    ports.iter().map(|p| p.shard).collect()
}

/// Who the record gives a port to, when that is not the pod's owner alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortHolder {
    /// Another PortAllocation (`namespace/name`), and not the owner.
    Other(String),
    /// Nobody: the status is ahead of the record.
    Nobody,
    /// The owner and another PortAllocation too: a port held twice, which the allocator never
    /// writes (a tenant may write its own entries, so it can add another's port to them).
    Twice(String),
}

/// A port the record does not give to the pod's owner alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub port: PodPortInShard,
    pub holder: PortHolder,
}

/// The ports of `ports` that `pa`'s UID does not hold alone in their shard. `shards`: each shard
/// of [`pod_port_shards`] as read (`None`: it does not exist, so nobody holds its ports); a shard
/// of another pool (a name shared through a hash collision) holds nothing for this one.
pub fn unheld_ports(
    pa: &PortAllocation,
    ports: &[PodPortInShard],
    shards: &BTreeMap<ShardKey, Option<PortPoolShard>>,
) -> Vec<Mismatch> {
    let views: BTreeMap<ShardKey, ShardView> = shards
        .iter()
        .map(|(&key, shard)| (key, ShardView::of(shard.as_ref(), key, pa)))
        .collect();
    let mut mismatches = Vec::new();
    for p in ports {
        let view = views.get(&p.shard);
        let owns = view.is_some_and(|v| v.own.iter().any(|(_, block)| block.contains(p.port)));
        let other = view.and_then(|v| v.others.get(&p.port)).cloned();
        let holder = match (owns, other) {
            (true, None) => continue,
            (true, Some(other)) => PortHolder::Twice(other),
            (false, Some(other)) => PortHolder::Other(other),
            (false, None) => PortHolder::Nobody,
        };
        mismatches.push(Mismatch {
            port: p.clone(),
            holder,
        });
    }
    mismatches
}

/// One shard's entries as the check needs them, each decoded once.
struct ShardView {
    /// The owner's entry; one that does not decode holds nothing we can vouch for (`repair`
    /// reports it).
    own: Holdings,
    /// The ports of the shard's window other entries hold (at most 256, whatever an entry
    /// written by hand says), with their owner (`namespace/name`).
    others: BTreeMap<u16, String>,
}

impl ShardView {
    /// `shard` (if it is a shard of `pa`'s pool) seen from `pa`.
    fn of(shard: Option<&PortPoolShard>, key: ShardKey, pa: &PortAllocation) -> ShardView {
        let uid = pa.metadata.uid.as_deref().unwrap_or_default();
        let edges = window(key.window);
        let mut view = ShardView {
            own: Holdings::new(),
            others: BTreeMap::new(),
        };
        let entries = shard
            .filter(|s| s.spec.pool == pa.spec.pool)
            .and_then(|s| s.status.as_ref())
            .into_iter()
            .flat_map(|status| &status.holders);
        for entry in entries {
            let Ok(held) = Holdings::decode(&entry.ports) else {
                continue;
            };
            if entry.uid == uid {
                view.own = held;
            } else {
                // An entry under the owner's own name is an earlier object of that name.
                let owner = if entry.owner == super::owner_of(pa) {
                    format!("{} (UID {}, an earlier object)", entry.owner, entry.uid)
                } else {
                    entry.owner.clone()
                };
                for (_, block) in held.iter() {
                    let (first, last) =
                        (block.first.max(edges.first), block.last().min(edges.last));
                    for port in first..=last {
                        view.others.entry(port).or_insert_with(|| owner.clone());
                    }
                }
            }
        }
        view
    }
}

/// The denial of a pod whose ports the record does not give its owner: the first port in full
/// (both owners, the shard), how many more, and what to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordDenial {
    pub namespace: String,
    pub name: String,
    pub pool: String,
    /// The pod, as `role[index]`.
    pub pod: String,
    pub mismatches: Vec<Mismatch>,
}

impl RecordDenial {
    pub fn new(pa: &PortAllocation, injection: &PodInjection, mismatches: Vec<Mismatch>) -> Self {
        RecordDenial {
            namespace: namespace(pa).to_string(),
            name: name(pa).to_string(),
            pool: pa.spec.pool.clone(),
            pod: format!("{}[{}]", injection.role, injection.index),
            mismatches,
        }
    }
}

impl std::error::Error for RecordDenial {}

impl fmt::Display for RecordDenial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(first) = self.mismatches.first() else {
            return Ok(());
        };
        let (ns, name, pool) = (&self.namespace, &self.name, &self.pool);
        let shard = shard_name(pool, first.port.shard);
        write!(
            f,
            "the status of PortAllocation {ns}/{name} gives pod {} port {} ({}), but pool {pool}'s \
             record (PortPoolShard {shard}) gives that port to ",
            self.pod, first.port.port, first.port.name
        )?;
        match &first.holder {
            PortHolder::Other(holder) => write!(f, "PortAllocation {holder}")?,
            PortHolder::Nobody => f.write_str("no PortAllocation")?,
            PortHolder::Twice(holder) => write!(f, "PortAllocation {holder} as well")?,
        }
        let more = &self.mismatches[1..];
        if !more.is_empty() {
            let listed: Vec<String> = more
                .iter()
                .take(3)
                .map(|m| match &m.holder {
                    PortHolder::Other(holder) => format!("{} to {holder}", m.port.port),
                    PortHolder::Nobody => format!("{} to nobody", m.port.port),
                    PortHolder::Twice(holder) => format!("{} to {holder} as well", m.port.port),
                })
                .collect();
            write!(f, " (and {}", listed.join(", "))?;
            if more.len() > listed.len() {
                write!(f, " and {} more", more.len() - listed.len())?;
            }
            f.write_str(")")?;
        }
        match &first.holder {
            PortHolder::Twice(holder) => write!(
                f,
                ": a port held twice, which no allocation writes (an entry written by hand). One \
                 of {ns}/{name} and {holder} must give it up (kubectl portalloc release, then \
                 sync; kubectl portalloc repair --pool {pool} lists such ports); the workload \
                 controller retries the pod"
            ),
            _ => write!(
                f,
                ": the status does not match the record (written by hand, or stale). Run kubectl \
                 portalloc sync {name} -n {ns}, which rewrites the status from the record \
                 (kubectl portalloc repair --pool {pool} if the record is what is wrong); the \
                 workload controller retries the pod"
            ),
        }
    }
}

fn namespace(pa: &PortAllocation) -> &str {
    pa.metadata.namespace.as_deref().unwrap_or_default()
}

fn name(pa: &PortAllocation) -> &str {
    pa.metadata.name.as_deref().unwrap_or_default()
}

#[cfg(test)]
#[path = "pod_ports_tests.rs"]
mod tests;

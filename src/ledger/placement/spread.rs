//! A workload bigger than one copy of its pool: its pods spread over the copies. Pure.
//!
//! A PortAllocation normally holds all its ports in one copy (`pool_record`). When no copy can
//! take it whole (a StatefulSet of 24 pods x 4 ports from a 40-port pool with `nodeReuse: 4`),
//! its pods go to copies one by one instead: each pod's ports in one copy, the first copy that
//! takes the pod whole, so copies still fill in order. Two pods of one workload that hold the
//! same port (in two copies) are kept apart by the scheduler through their declared hostPorts,
//! exactly as two holders of different workloads are.
//!
//! A pod is a role's index within a group: its PodScoped ports. Pod 0 of a role also carries
//! the role's RoleScoped ports (one per group, index 0), which every pod of the role binds and
//! one copy records. Once spread, a pod stays in the copy that holds (most of) its ports, so a
//! re-run moves nothing (a pod keeps its port); new pods of a scaled-up role go first-fit.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;

use crate::core::{Holdings, SlotKey, Want};

use super::window_choice::elsewhere;
use crate::ledger::decision::{Decision, Operation};
use crate::ledger::record::copy_record::CopyRecord;
use crate::ledger::record::node_bound::{CopyBound, CopyRefusal};
use crate::ledger::record::pool_record::PoolRecord;
use crate::ledger::refusal::Refusal;

/// The slots one copy is asked to hold for the owner.
type Part = BTreeMap<SlotKey, Want>;

/// One pod of a workload: `(role with its group prefix, index)`.
type PodKey = (String, u32);

/// What spreading decided: the owner's holdings in each copy it is in afterwards, or leaves.
#[derive(Clone, Debug)]
pub(super) struct Spread {
    /// Per copy, what the owner holds there once written (empty: it leaves that copy).
    pub parts: BTreeMap<u16, Holdings>,
    /// The copies as they are once the parts are set (only those that changed).
    pub copies: BTreeMap<u16, CopyRecord>,
    pub allocated: usize,
    pub released: usize,
}

impl Spread {
    /// Everything the owner holds afterwards, in all copies.
    pub fn holdings(&self) -> Holdings {
        let mut all = Holdings::new();
        for part in self.parts.values() {
            for (slot, block) in part.iter() {
                all.insert_block(slot.clone(), block);
            }
        }
        all
    }
}

/// Whether `uid`'s entries are a spread workload: in several copies, no slot in two of them
/// (two clients racing on one new object leave the same slots in two copies instead).
pub(super) fn is_spread(work: &PoolRecord, uid: &str) -> bool {
    let parts = work.parts_of(uid);
    if parts.len() < 2 {
        return false;
    }
    let mut seen: BTreeSet<&SlotKey> = BTreeSet::new();
    parts
        .iter()
        .all(|(_, part)| part.iter().all(|(slot, _)| seen.insert(slot)))
}

/// The pods of `desired`, each with its slots.
fn pods_of(desired: &Part) -> BTreeMap<PodKey, Part> {
    let mut pods: BTreeMap<PodKey, Part> = BTreeMap::new();
    for (slot, want) in desired {
        pods.entry((slot.role.clone(), slot.index))
            .or_default()
            .insert(slot.clone(), *want);
    }
    pods
}

/// A pod no copy takes: the lowest copy's refusal of it, and how far the others got.
#[derive(Clone, Debug)]
pub(super) struct Unplaced {
    pub refusal: Box<Refusal>,
    /// `role[index]`.
    pub pod: String,
    pub placed: usize,
    pub pods: usize,
    /// The pool's rule that kept the pod out of a copy with room (`nodeReuse`, or the nodes it
    /// follows), if one did: the reason more copies would not help without more nodes.
    pub rule: Option<CopyRefusal>,
}

impl Unplaced {
    /// `whole`, the refusal of the workload in one copy, with how spreading it went.
    pub fn explain(self, whole: Refusal, bound: &CopyBound) -> Refusal {
        whole.spread_too(self.placed, self.pods, &self.pod, bound, self.rule.as_ref())
    }

    /// The lowest copy's refusal of the pod, with how spreading went (a workload spread
    /// already, which has no refusal of its own as a whole).
    pub fn into_refusal(self, bound: &CopyBound) -> Refusal {
        let refusal = (*self.refusal).clone();
        self.explain(refusal, bound)
    }
}

/// What a spread decides for: the owner, the slots it asks for, and its largest pod (which
/// copies it may use, see `node_bound`).
pub(super) struct Asked<'a> {
    pub uid: &'a str,
    pub owner: &'a str,
    pub desired: &'a Part,
    pub ports_per_pod: u32,
}

/// Decide what `asked` asks for with its pods spread over the copies it may use: each pod
/// where its ports are, new pods in the first copy that takes them whole.
pub(super) fn spread(
    work: &PoolRecord,
    asked: &Asked,
    rng: &mut impl Rng,
) -> Result<Spread, Unplaced> {
    let (uid, owner, desired) = (asked.uid, asked.owner, asked.desired);
    let held_in = work.slot_copies(uid);
    let mut assigned: BTreeMap<u16, Part> = BTreeMap::new();
    let mut new_pods: Vec<Part> = Vec::new();
    let pods = pods_of(desired);
    let total = pods.len();
    for (_, pod) in pods {
        match copy_holding_most(&pod, &held_in) {
            Some(copy) => assigned.entry(copy).or_default().extend(pod),
            None => new_pods.push(pod),
        }
    }
    let mut state = State {
        work,
        uid,
        owner,
        ports_per_pod: asked.ports_per_pod,
        copies: BTreeMap::new(),
        asked: BTreeMap::new(),
        parts: BTreeMap::new(),
        allocated: 0,
        released: 0,
        rule: None,
    };
    let mut copies: BTreeSet<u16> = work.copies_of(uid);
    copies.extend(assigned.keys());
    for copy in copies {
        let part = assigned.remove(&copy).unwrap_or_default();
        if let Err(refusal) = state.decide(copy, &part, rng) {
            // Its held pods stay; the pods that would need new ports there look elsewhere.
            let (kept, moved) = split_held(&part, &work.copy_or_empty(copy).holdings_of(uid));
            if state.decide(copy, &kept, rng).is_err() {
                let pod = pod_name(&moved);
                return Err(Unplaced {
                    refusal: Box::new(refusal),
                    pod,
                    placed: 0,
                    pods: total,
                    rule: state.rule.take(),
                });
            }
            new_pods.extend(pods_of(&moved).into_values());
        }
    }
    let unplaced = new_pods.len();
    for (i, pod) in new_pods.iter().enumerate() {
        if let Err(refusal) = state.place_new(pod, rng) {
            let placed = total - unplaced + i;
            return Err(Unplaced {
                refusal: Box::new(refusal),
                pod: pod_name(pod),
                placed,
                pods: total,
                rule: state.rule.take(),
            });
        }
    }
    Ok(Spread {
        parts: state.parts,
        copies: state.copies,
        allocated: state.allocated,
        released: state.released,
    })
}

/// The copy holding most of `pod`'s slots (the lowest among equals); `None` for a new pod.
fn copy_holding_most(pod: &Part, held_in: &BTreeMap<SlotKey, u16>) -> Option<u16> {
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    for slot in pod.keys() {
        if let Some(&copy) = held_in.get(slot) {
            *counts.entry(copy).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(copy, n)| (n, std::cmp::Reverse(copy)))
        .map(|(copy, _)| copy)
}

/// `part` split into the pods `held` holds exactly as asked, and the others.
fn split_held(part: &Part, held: &Holdings) -> (Part, Part) {
    let (mut kept, mut moved) = (Part::new(), Part::new());
    for (_, pod) in pods_of(part) {
        let whole = pod
            .iter()
            .all(|(slot, want)| held.block(slot).is_some_and(|b| want.is_met_by(b)));
        if whole { &mut kept } else { &mut moved }.extend(pod);
    }
    (kept, moved)
}

/// The decisions so far, on copies of the copies they change.
struct State<'a> {
    work: &'a PoolRecord,
    uid: &'a str,
    owner: &'a str,
    /// The owner's largest pod: which copies may take new ports of it.
    ports_per_pod: u32,
    copies: BTreeMap<u16, CopyRecord>,
    /// Per copy decided: the slots asked of it.
    asked: BTreeMap<u16, Part>,
    /// Per copy decided: what the owner holds there.
    parts: BTreeMap<u16, Holdings>,
    allocated: usize,
    released: usize,
    /// The last refusal of a copy by the pool's rule rather than for room.
    rule: Option<CopyRefusal>,
}

impl State<'_> {
    /// The owner holds exactly `part` in `copy`, if that copy can take it: room, and new
    /// ports only where the pool allows its pods (`nodeReuse`, or the nodes it follows).
    fn decide(&mut self, copy: u16, part: &Part, rng: &mut impl Rng) -> Result<(), Refusal> {
        let (uid, owner) = (self.uid, self.owner);
        let allowed = self.work.copy_allowed(copy, self.ports_per_pod);
        let record = self
            .copies
            .entry(copy)
            .or_insert_with(|| self.work.copy_or_empty(copy));
        let windows: BTreeSet<u16> = record.shards_of(uid).into_iter().collect();
        let operation = Operation::Slots(part.clone());
        let holdings = match elsewhere(record, &windows, uid, owner, &operation, rng)? {
            Decision::Unchanged(holdings) => holdings,
            Decision::Write { allocated, .. } if allocated > 0 && allowed.is_err() => {
                let refused = allowed.expect_err("matched as refused");
                self.rule = Some(refused.clone());
                return Err(Refusal::of_copy(owner, self.work.name(), refused));
            }
            Decision::Write {
                holdings,
                allocated,
                released,
            } => {
                record.set(uid, owner, &holdings);
                self.allocated += allocated;
                self.released += released;
                holdings
            }
        };
        self.parts.insert(copy, holdings);
        self.asked.insert(copy, part.clone());
        Ok(())
    }

    /// A new pod in the first usable copy that takes it whole, beside the owner's other pods
    /// there. A copy with fewer free ports than the pod asks for is skipped untried; when
    /// every copy is, copy 0's refusal is worked out to be shown.
    fn place_new(&mut self, pod: &Part, rng: &mut impl Rng) -> Result<(), Refusal> {
        let needed: u32 = pod.values().map(|want| want.count.max(1)).sum();
        let mut first_refusal = None;
        let mut candidates = self.work.copy_candidates(self.ports_per_pod);
        if candidates.is_empty() {
            // Copy 0 alone, to be refused with the reason.
            candidates = 0..1;
        }
        for copy in candidates {
            let free = match self.copies.get(&copy) {
                Some(record) => record.free_ports(),
                None => self
                    .work
                    .copy(copy)
                    .map_or(u32::MAX, CopyRecord::free_ports),
            };
            if free < needed && copy > 0 {
                continue;
            }
            match self.decide(copy, &self.with_pod(copy, pod), rng) {
                Ok(()) => return Ok(()),
                Err(refusal) => {
                    first_refusal.get_or_insert(refusal);
                }
            }
        }
        Err(first_refusal.expect("copy 0 is always tried"))
    }

    /// The slots asked of `copy` so far, and `pod`'s.
    fn with_pod(&self, copy: u16, pod: &Part) -> Part {
        let mut part = self.asked.get(&copy).cloned().unwrap_or_default();
        part.extend(pod.iter().map(|(slot, want)| (slot.clone(), *want)));
        part
    }
}

/// The name of a pod of [`pods_of`] for people: `role[index]`, with its group prefix.
fn pod_name(pod: &Part) -> String {
    pod.keys()
        .next()
        .map(|slot| format!("{}[{}]", slot.role, slot.index))
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "spread_tests.rs"]
mod tests;

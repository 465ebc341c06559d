//! Turns one PortAllocation's desired ports and what it holds now into a
//! plan (keep / release / allocate), and carries a plan out against a pool
//! all-or-nothing.

use std::collections::BTreeMap;

use rand::Rng;

use super::alloc_error::AllocError;
use super::block::PortBlock;
use super::holding::{Holdings, SlotKey};
use super::pool_state::PoolState;

/// Whether a port is shared by a role or held once per replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// One port for the whole role (slot index 0), while it has replicas.
    RoleScoped,
    /// One port per replica (slot indices 0..replicas).
    PodScoped,
}

/// One named port of one role, as the PortAllocation spec asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortDemand {
    pub role: String,
    pub port: String,
    pub scope: Scope,
    pub replicas: u32,
    /// A specific port to hold (a block's first port); `None` lets the pool choose.
    pub requested: Option<u16>,
    /// Ports per slot: 1 for a single port, N for a block of N contiguous ports.
    pub count: u32,
}

impl PortDemand {
    /// How many slots this demand occupies.
    pub fn slot_count(&self) -> u32 {
        match self.scope {
            Scope::RoleScoped => u32::from(self.replicas > 0),
            Scope::PodScoped => self.replicas,
        }
    }
}

/// What one slot asks for: a requested first port or any, and how many ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Want {
    pub requested: Option<u16>,
    /// At least 1.
    pub count: u32,
}

impl Want {
    /// A single port, requested or automatic.
    pub fn single(requested: Option<u16>) -> Want {
        Want {
            requested,
            count: 1,
        }
    }

    /// Whether `block` satisfies this want as it is.
    pub fn is_met_by(&self, block: PortBlock) -> bool {
        u32::from(block.count) == self.count && self.requested.is_none_or(|p| p == block.first)
    }
}

/// Every slot the demands need, with what each one asks for.
///
/// Demands are expected to name distinct (role, port) pairs (the API layer
/// validates that); if two repeat one, the later demand's value wins for the
/// indices they share.
pub fn desired_slots(demands: &[PortDemand]) -> BTreeMap<SlotKey, Want> {
    let mut slots = BTreeMap::new();
    for demand in demands {
        let want = Want {
            requested: demand.requested,
            count: demand.count.max(1),
        };
        for index in 0..demand.slot_count() {
            let slot = SlotKey::new(demand.role.clone(), demand.port.clone(), index);
            slots.insert(slot, want);
        }
    }
    slots
}

/// What one PortAllocation must change. Lists are ordered by slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Current slots that stay exactly as they are.
    pub keep: Holdings,
    /// Slots to fill, with what each asks for.
    pub allocate: Vec<(SlotKey, Want)>,
    /// Current slots to give up, with the block (or port) each holds.
    pub release: Vec<(SlotKey, PortBlock)>,
}

impl Plan {
    /// True when the spec already matches the holdings.
    pub fn is_noop(&self) -> bool {
        self.allocate.is_empty() && self.release.is_empty()
    }

    /// How many ports the pool must choose (every port of every automatic block).
    pub fn automatic_count(&self) -> u32 {
        self.allocate
            .iter()
            .filter(|(_, want)| want.requested.is_none())
            .map(|(_, want)| want.count)
            .fold(0u32, u32::saturating_add)
    }

    /// Whether any slot to fill is a block of more than one port.
    pub fn has_blocks(&self) -> bool {
        self.allocate.iter().any(|(_, want)| want.count > 1)
    }

    /// Each requested port with the slots whose request covers it, by port
    /// (a requested block covers all its ports).
    pub fn requests(&self) -> BTreeMap<u16, Vec<SlotKey>> {
        let mut requests: BTreeMap<u16, Vec<SlotKey>> = BTreeMap::new();
        for (slot, want) in &self.allocate {
            if let Some(first) = want.requested {
                let last = (u32::from(first) + want.count - 1).min(u32::from(u16::MAX)) as u16;
                for port in first..=last {
                    requests.entry(port).or_default().push(slot.clone());
                }
            }
        }
        requests
    }
}

/// Compares the demands with the current holdings.
///
/// A held slot is kept if it is still desired, holds a block of the size
/// asked for, and, when it requests a port, starts exactly there (a slot
/// that stops requesting keeps whatever it has, so removing `requested`
/// never moves a workload). Every other held slot is released; every
/// desired slot not kept is allocated. Scaling down therefore releases
/// exactly the removed indices, and changing a count moves only that
/// port's slots.
pub fn plan(demands: &[PortDemand], current: &Holdings) -> Plan {
    plan_slots(desired_slots(demands), current)
}

/// [`plan`] for slots already listed: part of a demand (the pods of a workload that one copy
/// of a pool holds, see `ledger::spread`).
pub fn plan_slots(desired: BTreeMap<SlotKey, Want>, current: &Holdings) -> Plan {
    let mut keep = Holdings::new();
    let mut release = Vec::new();
    for (slot, block) in current.iter() {
        match desired.get(slot) {
            Some(want) if want.is_met_by(block) => {
                keep.insert_block(slot.clone(), block);
            }
            _ => release.push((slot.clone(), block)),
        }
    }
    let allocate = desired
        .into_iter()
        .filter(|(slot, _)| !keep.contains(slot))
        .collect();
    Plan {
        keep,
        allocate,
        release,
    }
}

/// Carries out a plan on `state`, all or nothing, and returns the owner's
/// complete new holdings (kept slots plus new ones).
///
/// Order: releases first (so a port can move between two slots of one
/// owner), then every requested port or block (so an automatic choice never
/// takes a port another slot of the plan asked for), then automatic blocks,
/// largest first (long runs are the scarce resource; single ports fit in
/// any gap), then automatic single ports, all leaning toward one end of
/// their runs so the allocation's ports lie together. On any error `state`
/// is exactly as it was before the call.
pub fn execute(
    plan: &Plan,
    state: &mut PoolState,
    rng: &mut impl Rng,
) -> Result<Holdings, AllocError> {
    if let Some((port, slots)) = plan.requests().into_iter().find(|(_, s)| s.len() > 1) {
        return Err(AllocError::DuplicateRequest { port, slots });
    }
    // A clone is at most ~8 KiB of bitmap, cheaper to reason about than an
    // undo log.
    let before = state.clone();
    let result = apply(plan, state, rng);
    if result.is_err() {
        *state = before;
    }
    result
}

fn apply(plan: &Plan, state: &mut PoolState, rng: &mut impl Rng) -> Result<Holdings, AllocError> {
    for (_, block) in &plan.release {
        state.release_block(*block);
    }
    let mut holdings = plan.keep.clone();
    for (slot, want) in &plan.allocate {
        if let Some(first) = want.requested {
            let block = PortBlock::new(first, want.count).ok_or(AllocError::BlockPastEnd {
                first,
                count: want.count,
            })?;
            state.take_requested_block(block)?;
            holdings.insert_block(slot.clone(), block);
        }
    }
    // Checked up front so the error counts every port the plan lacks, not
    // just the first one that didn't fit.
    let needed = plan.automatic_count();
    if needed > state.free_count() {
        let mut error = state.full_error(needed);
        if plan.has_blocks()
            && let AllocError::PoolFull { runs, .. } = &mut error
        {
            *runs = Some(state.fragmentation().summary());
        }
        return Err(error);
    }
    let mut automatic: Vec<&(SlotKey, Want)> = plan
        .allocate
        .iter()
        .filter(|(_, want)| want.requested.is_none())
        .collect();
    // Stable: equal sizes keep slot order.
    automatic.sort_by_key(|(_, want)| std::cmp::Reverse(want.count));
    // One aim for the whole allocation: its ports lean the same way and lie
    // together (see `Placement`); only the first, largest block has a choice.
    let mut aim = state.first_aim(rng);
    let mut placed = 0u32;
    for (slot, want) in automatic {
        let block = state.take_aimed(want.count, aim, rng).ok_or_else(|| {
            if want.count > 1 {
                AllocError::NoRun {
                    slot: slot.clone(),
                    count: want.count,
                    runs: state.fragmentation().summary(),
                    placed,
                    longest_range: state.longest_range(),
                }
            } else {
                state.full_error(needed)
            }
        })?;
        placed += want.count;
        aim = aim.then();
        holdings.insert_block(slot.clone(), block);
    }
    Ok(holdings)
}

#[cfg(test)]
#[path = "planner_block_tests.rs"]
mod block_tests;

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;

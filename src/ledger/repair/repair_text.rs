//! How repair's changes and findings read: one line each, naming the pool entry and the command
//! that fixes what repair leaves to a person.

use std::fmt;

use super::repair_outcome::{Change, Finding, FreeReason, UnmarkReason};

fn count_ports(n: usize) -> String {
    if n == 1 {
        "1 port".into()
    } else {
        format!("{n} ports")
    }
}

/// `namespace/name` split for commands the messages suggest.
fn name_and_namespace(owner: &str) -> (&str, &str) {
    owner.split_once('/').map_or(("", owner), |(ns, n)| (n, ns))
}

fn role_of(slot: &str) -> &str {
    slot.split('.').next().unwrap_or(slot)
}

impl Change {
    /// The first word of the change's line: `free`, `restore`, `respec`, `recount`, `remove`
    /// or `unmark`.
    pub fn verb(&self) -> &'static str {
        match self {
            Change::Free { .. } => "free",
            Change::Restore { .. } => "restore",
            Change::Respec { .. } => "respec",
            Change::Recount { .. } => "recount",
            Change::RemoveShard { .. } => "remove",
            Change::Unmark { .. } => "unmark",
        }
    }
}

impl Finding {
    /// The first word of the finding's line: `warning`, `stale`, `conflict` or `skip`.
    pub fn verb(&self) -> &'static str {
        match self {
            Finding::Duplicate { .. }
            | Finding::OutsidePool { .. }
            | Finding::Undecodable { .. }
            | Finding::WrongShard { .. }
            | Finding::HeldInTwoShards { .. }
            | Finding::SlotApart { .. }
            | Finding::NotLoaded { .. }
            | Finding::SharesPorts { .. } => "warning",
            Finding::StaleStatus { .. } => "stale",
            Finding::RestoreConflict { .. } => "conflict",
            Finding::RestoreSkipped { .. } => "skip",
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Free {
                uid,
                owner,
                ports,
                count,
                reason,
            } => {
                let why = match reason {
                    FreeReason::OwnerGone => "its PortAllocation no longer exists".to_string(),
                    FreeReason::OtherPool { pool } => {
                        format!("its PortAllocation allocates from pool {pool:?}")
                    }
                };
                if *count == 0 {
                    write!(f, "{owner} (uid {uid})  unreadable entry {ports:?}: {why}")
                } else {
                    write!(
                        f,
                        "{owner} (uid {uid})  {}: {ports}  ({why})",
                        count_ports(*count)
                    )
                }
            }
            Change::Restore {
                uid,
                owner,
                ports,
                count,
            } => write!(
                f,
                "{owner} (uid {uid})  {}: {ports}  (recorded in its status; the pool lost them)",
                count_ports(*count)
            ),
            Change::Unmark { uid, owner, reason } => {
                let why = match reason {
                    UnmarkReason::OwnerGone => "its PortAllocation no longer exists",
                    UnmarkReason::StatusNamesShards => "its status names the shards it is in",
                };
                write!(
                    f,
                    "{owner} (uid {uid})  no longer marked as placed in other shards ({why})"
                )
            }
            Change::RemoveShard { shard, pool_uid } => write!(
                f,
                "shard {shard}: it is the record of an earlier pool object (UID {pool_uid}) and \
                 would block this pool's shard for its window; PortAllocation statuses restore \
                 what it held"
            ),
            Change::Respec { shard, generation } => write!(
                f,
                "shard {shard}: write the pool's spec of generation {generation} (it carries an \
                 older one, which allocations in it still follow)"
            ),
            Change::Recount {
                size,
                allocated,
                available,
                holder_count,
            } => write!(
                f,
                "size {size}, allocated {allocated}, available {available}, holders {holder_count}"
            ),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Duplicate {
                port,
                first,
                second,
            } => held_twice(f, *port, first, second),
            Finding::OutsidePool {
                owner, slot, port, ..
            } => outside_pool(f, owner, slot, *port),
            Finding::Undecodable { uid, owner, error } => write!(
                f,
                "{owner} (uid {uid}) has an unreadable entry ({error}); it is kept because the \
                 PortAllocation exists: `kubectl portalloc release` and `sync` rewrite it"
            ),
            Finding::StaleStatus {
                owner,
                recorded,
                why,
            } => {
                let (name, ns) = name_and_namespace(owner);
                write!(
                    f,
                    "{owner}: its status records {recorded} but {why}; not restored. \
                     `kubectl portalloc sync {name} -n {ns}` corrects the status"
                )
            }
            Finding::RestoreConflict {
                owner,
                slot,
                port,
                holder,
            } => {
                let (name, ns) = name_and_namespace(owner);
                write!(
                    f,
                    "{owner}: cannot restore port {port} ({slot}), now held by {holder}; \
                     `kubectl portalloc sync {name} -n {ns}` gives that slot a free port"
                )
            }
            Finding::RestoreSkipped {
                owner,
                slot,
                port,
                why,
            } => write!(
                f,
                "{owner}: port {port} ({slot}) recorded in its status is not restored: {why}"
            ),
            Finding::WrongShard {
                shard,
                owner,
                slot,
                port,
                ..
            } => in_wrong_shard(f, shard, owner, slot, *port),
            Finding::HeldInTwoShards {
                port,
                first,
                first_shard,
                second,
                second_shard,
            } => held_in_two_shards(f, *port, (first, first_shard), (second, second_shard)),
            Finding::SlotApart { uid, slot, shards } => write!(
                f,
                "uid {uid} holds {slot} in pieces that do not join, in shards {}; \
                 `kubectl portalloc release` and `sync` of its PortAllocation rewrite it",
                shards.join(", ")
            ),
            Finding::NotLoaded { shard, reason } => write!(
                f,
                "shard {shard} is not part of this pool's record: {reason}; it is left as it is \
                 (delete it with `kubectl delete portpoolshard {shard}` once nothing needs it)"
            ),
            Finding::SharesPorts {
                other,
                protocol,
                ports,
            } => write!(
                f,
                "shares {protocol} ports {ports} with PortPool {other}: each pool may hand such a \
                 port to a workload of its own; change the ranges of one of them (nothing is \
                 rewritten by repair), or set spec.allowOverlap: true on both if their pods never \
                 run on one node"
            ),
        }
    }
}

// The ports below stay where they are: repair never moves a live workload's port, so each line
// names the commands with which a person moves one.

/// A port two owners hold in one record; the younger holder, `second`, is the one to move.
fn held_twice(f: &mut fmt::Formatter<'_>, port: u16, first: &str, second: &str) -> fmt::Result {
    let (name, ns) = name_and_namespace(second);
    write!(
        f,
        "port {port} is held by both {first} and {second}: repair never moves a live \
         workload's port; to move one, `kubectl portalloc release {name} -n {ns} --role ROLE` \
         then `kubectl portalloc sync {name} -n {ns}`"
    )
}

/// A port two owners hold in two shards (`(owner, shard)` each).
fn held_in_two_shards(
    f: &mut fmt::Formatter<'_>,
    port: u16,
    (first, first_shard): (&str, &str),
    (second, second_shard): (&str, &str),
) -> fmt::Result {
    let (name, ns) = name_and_namespace(second);
    write!(
        f,
        "port {port} is held by {first} in shard {first_shard} and by {second} in shard \
         {second_shard}: repair never moves a live workload's port; to move one, \
         `kubectl portalloc release {name} -n {ns} --role ROLE` then \
         `kubectl portalloc sync {name} -n {ns}`"
    )
}

/// A port the pool's ranges no longer contain (or now exclude).
fn outside_pool(f: &mut fmt::Formatter<'_>, owner: &str, slot: &str, port: u16) -> fmt::Result {
    let (name, ns) = name_and_namespace(owner);
    write!(
        f,
        "{owner} holds port {port} ({slot}), which is outside the pool's ranges or \
         excluded; it stays held until moved: `kubectl portalloc release {name} -n {ns} \
         --role {}` then `kubectl portalloc sync {name} -n {ns}`",
        role_of(slot)
    )
}

/// A port of the pool recorded in a shard whose window does not contain it.
fn in_wrong_shard(
    f: &mut fmt::Formatter<'_>,
    shard: &str,
    owner: &str,
    slot: &str,
    port: u16,
) -> fmt::Result {
    let (name, ns) = name_and_namespace(owner);
    write!(
        f,
        "{owner} holds port {port} ({slot}) in shard {shard}, whose window does not \
         contain it; it stays held there until moved: `kubectl portalloc release {name} \
         -n {ns} --role {}` then `kubectl portalloc sync {name} -n {ns}`",
        role_of(slot)
    )
}

//! What one PortAllocation holds, slot by slot, and the compact text form a
//! PortPool's status keeps per holder:
//!
//! `decode.http=30001,-,30003 prefill.grpc=30100 ray.workers=20000-20007,20008-20015`
//!
//! One space-separated group per (role, port), values in index order, `-` for
//! an index that holds nothing; a slot holding a block of ports is written
//! `first-last`, a single port as itself. Role and port names are DNS labels, so `.`,
//! `=`, `,` and ` ` never occur inside them and the form is unambiguous.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use super::block::PortBlock;

/// The longest name the encoding accepts: a DNS label (63) behind a group prefix (`1023-`).
const MAX_NAME_LEN: usize = 63 + 5;

/// Whether `name` can appear in the encoding: 1 to 63 characters of
/// `[a-z0-9-]`. Kubernetes validates role and port names more strictly
/// (DNS labels, IANA service names); this is what keeps the text unambiguous.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// One held port of a PortAllocation: the `index`-th replica's port `port`
/// of role `role`. Role-scoped ports always use index 0.
///
/// Field order gives the ordering (role, port, index) the encoding relies on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotKey {
    pub role: String,
    pub port: String,
    pub index: u32,
}

impl SlotKey {
    pub fn new(role: impl Into<String>, port: impl Into<String>, index: u32) -> SlotKey {
        SlotKey {
            role: role.into(),
            port: port.into(),
            index,
        }
    }

    /// Pod `index` of `role` in group `group` (a RoleScoped port: index 0). Group 0 is the role
    /// itself, so the records of an allocation without groups never carry a group prefix;
    /// group g > 0 is written `<g>-<role>`, which no role can be called (role names start with
    /// a letter). Keying by
    /// (group, index) rather than a flat pod number keeps every pod's port when a role's
    /// replicas per group change.
    pub fn in_group(role: &str, port: impl Into<String>, group: u32, index: u32) -> SlotKey {
        let role = if group == 0 {
            role.to_string()
        } else {
            format!("{group}-{role}")
        };
        SlotKey::new(role, port, index)
    }

    /// The group this slot belongs to (see [`SlotKey::in_group`]).
    pub fn group(&self) -> u32 {
        self.split_group().0
    }

    /// The role of the spec this slot belongs to, without its group prefix.
    pub fn spec_role(&self) -> &str {
        self.split_group().1
    }

    fn split_group(&self) -> (u32, &str) {
        match self.role.split_once('-') {
            Some((digits, role))
                if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) =>
            {
                (digits.parse().unwrap_or(0), role)
            }
            _ => (0, &self.role),
        }
    }

    /// Checks that both names can be encoded; the error names the bad one.
    pub fn validate(&self) -> Result<(), HoldingsError> {
        for name in [&self.role, &self.port] {
            if !is_valid_name(name) {
                return Err(HoldingsError::BadName {
                    name: name.clone(),
                    group: self.group_name(),
                });
            }
        }
        Ok(())
    }

    /// "role.port", the key of this slot's group.
    pub fn group_name(&self) -> String {
        format!("{}.{}", self.role, self.port)
    }
}

/// "decode.http[2]": how messages name a slot.
impl fmt::Display for SlotKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}[{}]", self.role, self.port, self.index)
    }
}

/// Why a stored holdings string could not be read. The tool writes these
/// strings itself, so an error means the status was edited or corrupted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HoldingsError {
    #[error(
        "holdings group \"{group}\" is malformed: write \"<role>.<port>=<ports>\", e.g. \"decode.http=30001,-,30003\""
    )]
    Malformed { group: String },

    #[error(
        "\"{name}\" in holdings group \"{group}\" is not a valid name: use 1-63 lowercase letters, digits and '-'"
    )]
    BadName { name: String, group: String },

    #[error(
        "\"{value}\" in holdings group \"{group}\" is not a port or block: write a port in 1..65535, a block \"first-last\", or \"-\" for an index that holds none"
    )]
    BadPort { value: String, group: String },

    #[error("\"{key}\" has more than one holdings group: merge them into one")]
    DuplicateGroup { key: String },
}

/// Every port one PortAllocation holds, by slot; each slot holds a single
/// port or a block of contiguous ports.
///
/// Kept as a vector sorted by slot, one entry per slot: a pool's record holds one of these per
/// holder, and most hold one or a few slots, where a `BTreeMap` allocates a whole node (11
/// entries, ~700 bytes) for the first (65,535 one-port holders: 44 MB against 4 MB). Lookups
/// are binary searches; decoding appends in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Holdings(Vec<(SlotKey, PortBlock)>);

impl Holdings {
    pub fn new() -> Holdings {
        Holdings::default()
    }

    /// Adds or replaces a slot with a single port, returning its first port
    /// before. Names must pass `SlotKey::validate` for `encode` to read back.
    pub fn insert(&mut self, slot: SlotKey, port: u16) -> Option<u16> {
        self.insert_block(slot, PortBlock::single(port))
            .map(|b| b.first)
    }

    /// Adds or replaces a slot with a block, returning what it held before.
    pub fn insert_block(&mut self, slot: SlotKey, block: PortBlock) -> Option<PortBlock> {
        // Appending in slot order (decoding, planning) finds the end at once.
        let at = match self.0.last() {
            Some((last, _)) if *last < slot => Err(self.0.len()),
            _ => self.position(&slot),
        };
        match at {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, block)),
            Err(i) => {
                self.0.insert(i, (slot, block));
                None
            }
        }
    }

    pub fn remove(&mut self, slot: &SlotKey) -> Option<PortBlock> {
        let i = self.position(slot).ok()?;
        Some(self.0.remove(i).1)
    }

    /// The slot's port (a block's first port).
    pub fn get(&self, slot: &SlotKey) -> Option<u16> {
        self.block(slot).map(|b| b.first)
    }

    /// The slot's whole block (a single port is a block of one).
    pub fn block(&self, slot: &SlotKey) -> Option<PortBlock> {
        self.position(slot).ok().map(|i| self.0[i].1)
    }

    pub fn contains(&self, slot: &SlotKey) -> bool {
        self.position(slot).is_ok()
    }

    fn position(&self, slot: &SlotKey) -> Result<usize, usize> {
        self.0.binary_search_by(|(held, _)| held.cmp(slot))
    }

    /// From entries in any order; a slot given twice keeps its last block, as a map's
    /// `insert` would.
    fn from_entries(mut entries: Vec<(SlotKey, PortBlock)>) -> Holdings {
        // Stable sort of the reversed list: each slot's last entry comes first among its
        // equals, and `dedup_by` keeps the first of each run.
        entries.reverse();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|next, kept| next.0 == kept.0);
        entries.shrink_to_fit();
        Holdings(entries)
    }

    /// Number of slots (a block counts once; see `port_count`).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of ports held, every port of every block.
    pub fn port_count(&self) -> u32 {
        self.0.iter().map(|(_, b)| u32::from(b.count)).sum()
    }

    /// The most ports one pod holds (a block's every port counts): pod i of a role holds its
    /// slots of index i plus the role's RoleScoped ports, which are at index 0 only. A port
    /// held at index 0 alone is taken for RoleScoped, so a pod whose PodScoped slot is not
    /// filled yet counts it anyway: never fewer than the pod will hold.
    pub fn ports_per_pod(&self) -> u32 {
        let mut largest = 0;
        for role in self.0.chunk_by(|a, b| a.0.role == b.0.role) {
            let mut pods: std::collections::BTreeMap<u32, (u32, Vec<&str>)> = Default::default();
            for (slot, block) in role {
                let pod = pods.entry(slot.index).or_default();
                pod.0 += u32::from(block.count);
                pod.1.push(&slot.port);
            }
            for (index, (ports, names)) in &pods {
                let shared: u32 = role
                    .iter()
                    .filter(|(slot, _)| slot.index == 0 && *index != 0)
                    .filter(|(slot, _)| !names.contains(&slot.port.as_str()))
                    .map(|(_, block)| u32::from(block.count))
                    .sum();
                largest = largest.max(ports + shared);
            }
        }
        largest
    }

    /// Slots and their blocks, ordered by slot.
    pub fn iter(&self) -> impl Iterator<Item = (&SlotKey, PortBlock)> + '_ {
        self.0.iter().map(|(slot, block)| (slot, *block))
    }

    /// Every held port, each block's ports in turn, in slot order (not
    /// sorted by port).
    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().flat_map(|(_, block)| block.ports())
    }

    /// The compact text form; `Holdings::decode` reads it back.
    pub fn encode(&self) -> String {
        // ~6 bytes per port plus the group names; reserve to avoid regrowth.
        let mut text = String::with_capacity(self.0.len() * 7);
        let mut group: Option<(&str, &str)> = None;
        let mut next_index = 0u32;
        for (slot, block) in self.iter() {
            let key = (slot.role.as_str(), slot.port.as_str());
            if group != Some(key) {
                if group.is_some() {
                    text.push(' ');
                }
                text.push_str(key.0);
                text.push('.');
                text.push_str(key.1);
                text.push('=');
                group = Some(key);
                next_index = 0;
            } else {
                text.push(',');
            }
            // Indices this group skipped hold nothing.
            for _ in next_index..slot.index {
                text.push_str("-,");
            }
            text.push_str(&block.to_string());
            next_index = slot.index + 1;
        }
        text
    }

    /// Reads the text `encode` writes. Extra whitespace between groups is
    /// tolerated; anything else out of shape is an error quoting the group.
    pub fn decode(text: &str) -> Result<Holdings, HoldingsError> {
        let mut holdings = Holdings::new();
        let mut seen_keys = std::collections::BTreeSet::new();
        for group in text.split_ascii_whitespace() {
            let malformed = || HoldingsError::Malformed {
                group: group.to_owned(),
            };
            let (key, values) = group.split_once('=').ok_or_else(malformed)?;
            let (role, port_name) = key.split_once('.').ok_or_else(malformed)?;
            for name in [role, port_name] {
                if !is_valid_name(name) {
                    return Err(HoldingsError::BadName {
                        name: name.to_owned(),
                        group: group.to_owned(),
                    });
                }
            }
            if values.is_empty() {
                return Err(malformed());
            }
            if !seen_keys.insert(key) {
                return Err(HoldingsError::DuplicateGroup {
                    key: key.to_owned(),
                });
            }
            for (index, value) in values.split(',').enumerate() {
                if value == "-" {
                    continue;
                }
                let block = PortBlock::parse(value).ok_or_else(|| HoldingsError::BadPort {
                    value: value.to_owned(),
                    group: group.to_owned(),
                })?;
                let index = u32::try_from(index).map_err(|_| malformed())?;
                holdings.insert_block(SlotKey::new(role, port_name, index), block);
            }
        }
        holdings.0.shrink_to_fit();
        Ok(holdings)
    }
}

impl fmt::Display for Holdings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

impl FromStr for Holdings {
    type Err = HoldingsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Holdings::decode(text)
    }
}

impl FromIterator<(SlotKey, u16)> for Holdings {
    fn from_iter<I: IntoIterator<Item = (SlotKey, u16)>>(iter: I) -> Self {
        iter.into_iter()
            .map(|(slot, port)| (slot, PortBlock::single(port)))
            .collect()
    }
}

impl FromIterator<(SlotKey, PortBlock)> for Holdings {
    fn from_iter<I: IntoIterator<Item = (SlotKey, PortBlock)>>(iter: I) -> Self {
        Holdings::from_entries(iter.into_iter().collect())
    }
}

impl Extend<(SlotKey, PortBlock)> for Holdings {
    fn extend<I: IntoIterator<Item = (SlotKey, PortBlock)>>(&mut self, iter: I) {
        let mut entries = std::mem::take(&mut self.0);
        entries.extend(iter);
        *self = Holdings::from_entries(entries);
    }
}

impl IntoIterator for Holdings {
    type Item = (SlotKey, PortBlock);
    type IntoIter = std::vec::IntoIter<(SlotKey, PortBlock)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
#[path = "holding_tests.rs"]
mod tests;

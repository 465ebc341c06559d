//! Port ranges and sets of ports, parsed from the text users write in a pool
//! spec ("30000-32767", "8080") and enumerated densely so the bitmap can index
//! a pool that has gaps.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// The lowest and highest valid port; 0 means "any port" to the kernel and is
/// never something we can hand out.
pub const MIN_PORT: u16 = 1;
pub const MAX_PORT: u16 = u16::MAX;

const RANGE_HINT: &str = r#"write "A" or "A-B", e.g. "30000-32767""#;

/// Why a port range, or a list of them, was rejected. Every message quotes
/// the text the user wrote.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RangeError {
    #[error("{}", empty_message(.text))]
    Empty { text: String },

    #[error("\"{text}\" is not a port or range: {RANGE_HINT}")]
    Syntax { text: String },

    #[error("port {value} in \"{text}\" is outside 1..65535")]
    OutOfBounds { value: String, text: String },

    #[error(
        "invalid port range \"{text}\": the first port must not exceed the last (write \"{last}-{first}\")"
    )]
    Reversed { text: String, first: u16, last: u16 },

    #[error("ranges \"{a}\" and \"{b}\" overlap: list each port once")]
    Overlap { a: String, b: String },
}

fn empty_message(text: &str) -> String {
    if text.trim().is_empty() {
        format!("a port range is empty: {RANGE_HINT}")
    } else {
        format!("\"{text}\" contains an empty port range: {RANGE_HINT}")
    }
}

/// An inclusive range of ports, `first..=last`, never containing port 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// A valid range, or `None` if it would contain port 0 or be empty.
    pub fn new(first: u16, last: u16) -> Option<PortRange> {
        (first >= MIN_PORT && first <= last).then_some(PortRange { first, last })
    }

    /// A range holding one port; `None` for port 0.
    pub fn single(port: u16) -> Option<PortRange> {
        PortRange::new(port, port)
    }

    /// Parses "A-B" or "A" (ASCII digits, whitespace around the whole text
    /// or around the dash is ignored).
    pub fn parse(text: &str) -> Result<PortRange, RangeError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(RangeError::Empty {
                text: text.to_owned(),
            });
        }
        let (first, last) = match trimmed.split_once('-') {
            Some((first, last)) => (
                parse_port(first.trim(), trimmed)?,
                parse_port(last.trim(), trimmed)?,
            ),
            None => {
                let port = parse_port(trimmed, trimmed)?;
                (port, port)
            }
        };
        if first > last {
            return Err(RangeError::Reversed {
                text: trimmed.to_owned(),
                first,
                last,
            });
        }
        Ok(PortRange { first, last })
    }

    /// Number of ports in the range (up to 65535, so it needs more than u16).
    /// A hand-built range with `first > last` has none.
    pub fn len(&self) -> u32 {
        (u32::from(self.last) + 1).saturating_sub(u32::from(self.first))
    }

    /// Always false for a range from `new` or `parse`.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, port: u16) -> bool {
        self.first <= port && port <= self.last
    }

    pub fn overlaps(&self, other: &PortRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// One side of a range. `whole` is the complete range text, quoted in errors.
fn parse_port(digits: &str, whole: &str) -> Result<u16, RangeError> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RangeError::Syntax {
            text: whole.to_owned(),
        });
    }
    // Overlong digit strings overflow u32; they are out of range all the same.
    match digits.parse::<u32>() {
        Ok(value) if (u32::from(MIN_PORT)..=u32::from(MAX_PORT)).contains(&value) => {
            Ok(value as u16)
        }
        _ => Err(RangeError::OutOfBounds {
            value: digits.to_owned(),
            text: whole.to_owned(),
        }),
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

impl FromStr for PortRange {
    type Err = RangeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        PortRange::parse(text)
    }
}

/// A set of ports kept as sorted, disjoint, non-adjacent ranges.
///
/// Ports are also numbered densely in ascending order (index 0 is the lowest
/// port); `nth` and `index_of` convert between the two in O(log ranges) so a
/// pool with gaps maps onto a dense bitmap.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PortSet {
    ranges: Vec<PortRange>,
    /// `offsets[i]` = number of ports in `ranges[..i]`, i.e. the index of
    /// `ranges[i].first`.
    offsets: Vec<u32>,
    len: u32,
}

impl PortSet {
    pub fn empty() -> PortSet {
        PortSet::default()
    }

    /// Builds a set from any ranges, merging overlapping and adjacent ones.
    /// A range with `first > last` is empty and adds nothing; port 0 is not a
    /// port and is dropped.
    pub fn from_ranges(ranges: impl IntoIterator<Item = PortRange>) -> PortSet {
        let mut sorted: Vec<PortRange> = ranges
            .into_iter()
            .filter_map(|r| PortRange::new(r.first.max(MIN_PORT), r.last))
            .collect();
        sorted.sort_unstable();
        let mut merged: Vec<PortRange> = Vec::with_capacity(sorted.len());
        for range in sorted {
            match merged.last_mut() {
                // Adjacent ranges ("1-5" and "6-9") coalesce too.
                Some(prev) if u32::from(range.first) <= u32::from(prev.last) + 1 => {
                    prev.last = prev.last.max(range.last);
                }
                _ => merged.push(range),
            }
        }
        PortSet::from_merged(merged)
    }

    /// Builds a set from individual ports (handy for exclusions and tests).
    pub fn from_ports(ports: impl IntoIterator<Item = u16>) -> PortSet {
        PortSet::from_ranges(ports.into_iter().filter_map(PortRange::single))
    }

    fn from_merged(ranges: Vec<PortRange>) -> PortSet {
        let mut offsets = Vec::with_capacity(ranges.len());
        let mut len = 0u32;
        for range in &ranges {
            offsets.push(len);
            len += range.len();
        }
        PortSet {
            ranges,
            offsets,
            len,
        }
    }

    /// Parses a list of ranges, each item possibly comma-separated
    /// ("30000-30100,30200"), merging any overlaps. Use for lists where
    /// repeating a port is harmless, such as exclusions.
    pub fn parse_list(items: &[impl AsRef<str>]) -> Result<PortSet, RangeError> {
        let pieces = parse_pieces(items)?;
        Ok(PortSet::from_ranges(pieces.into_iter().map(|(r, _)| r)))
    }

    /// Like `parse_list`, but rejects any two ranges that share a port,
    /// naming both. Use for a pool's `spec.ranges`, where an overlap is
    /// almost certainly a typo.
    pub fn parse_disjoint(items: &[impl AsRef<str>]) -> Result<PortSet, RangeError> {
        let mut pieces = parse_pieces(items)?;
        // Stable sort keeps input order among equal starts, so `a` is the
        // earlier of two identical ranges.
        pieces.sort_by_key(|(range, _)| range.first);
        let mut widest: Option<&(PortRange, String)> = None;
        for piece in &pieces {
            if let Some(prev) = widest
                && piece.0.first <= prev.0.last
            {
                return Err(RangeError::Overlap {
                    a: prev.1.clone(),
                    b: piece.1.clone(),
                });
            }
            if widest.is_none_or(|prev| piece.0.last > prev.0.last) {
                widest = Some(piece);
            }
        }
        Ok(PortSet::from_ranges(pieces.into_iter().map(|(r, _)| r)))
    }

    /// Number of ports in the set.
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The merged ranges, ascending.
    pub fn ranges(&self) -> &[PortRange] {
        &self.ranges
    }

    /// Each range's span of dense indices, ascending. Ports with consecutive
    /// indices are consecutive ports only inside one span: a gap between
    /// ranges (or an exclusion) ends a run of contiguous ports.
    pub fn index_spans(&self) -> impl Iterator<Item = std::ops::Range<u32>> + '_ {
        self.ranges
            .iter()
            .zip(&self.offsets)
            .map(|(range, &offset)| offset..offset + range.len())
    }

    /// Position of the range that would contain `port`, if any does.
    fn range_index(&self, port: u16) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.last < port);
        (i < self.ranges.len() && self.ranges[i].first <= port).then_some(i)
    }

    pub fn contains(&self, port: u16) -> bool {
        self.range_index(port).is_some()
    }

    /// The port at position `idx` of the ascending enumeration.
    pub fn nth(&self, idx: u32) -> Option<u16> {
        if idx >= self.len {
            return None;
        }
        let i = self.offsets.partition_point(|&offset| offset <= idx) - 1;
        Some(self.ranges[i].first + (idx - self.offsets[i]) as u16)
    }

    /// The position of `port` in the ascending enumeration.
    pub fn index_of(&self, port: u16) -> Option<u32> {
        let i = self.range_index(port)?;
        Some(self.offsets[i] + u32::from(port - self.ranges[i].first))
    }

    /// All ports, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.ranges.iter().flat_map(|r| r.first..=r.last)
    }

    /// Ports in `self` that are not in `other`.
    pub fn subtract(&self, other: &PortSet) -> PortSet {
        let mut result = Vec::new();
        let mut cut = other.ranges.iter().peekable();
        for range in &self.ranges {
            // `rest` is what is left of `range` after the cuts seen so far.
            let mut rest_first = u32::from(range.first);
            let last = u32::from(range.last);
            // Cuts that end before this range cannot affect it or later ones.
            while cut.next_if(|c| u32::from(c.last) < rest_first).is_some() {}
            while let Some(c) = cut.peek() {
                let (cut_first, cut_last) = (u32::from(c.first), u32::from(c.last));
                if cut_first > last {
                    break;
                }
                if cut_first > rest_first {
                    result.push(PortRange {
                        first: rest_first as u16,
                        last: (cut_first - 1) as u16,
                    });
                }
                rest_first = rest_first.max(cut_last + 1);
                if cut_last > last {
                    // This cut may also trim the next range: keep it.
                    break;
                }
                cut.next();
            }
            if rest_first <= last {
                result.push(PortRange {
                    first: rest_first as u16,
                    last: range.last,
                });
            }
        }
        // Pieces come out sorted, disjoint and non-adjacent already.
        PortSet::from_merged(result)
    }

    /// Whether every port of `self` is in `other`.
    pub fn is_subset_of(&self, other: &PortSet) -> bool {
        // `other` is merged, so each of our ranges must fit inside one of its.
        self.ranges.iter().all(|r| {
            other
                .range_index(r.first)
                .is_some_and(|i| other.ranges[i].last >= r.last)
        })
    }

    /// Whether the two sets share at least one port.
    pub fn overlaps(&self, other: &PortSet) -> bool {
        let (mut a, mut b) = (
            self.ranges.iter().peekable(),
            other.ranges.iter().peekable(),
        );
        while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
            if x.overlaps(y) {
                return true;
            }
            if x.last < y.last {
                a.next();
            } else {
                b.next();
            }
        }
        false
    }
}

/// Parses every comma-separated piece of every item, keeping each piece's
/// trimmed text for error messages.
fn parse_pieces(items: &[impl AsRef<str>]) -> Result<Vec<(PortRange, String)>, RangeError> {
    let mut pieces = Vec::new();
    for item in items {
        let item = item.as_ref();
        for piece in item.split(',') {
            let range = PortRange::parse(piece).map_err(|err| match err {
                // An empty piece only makes sense quoted with its neighbours.
                RangeError::Empty { .. } => RangeError::Empty {
                    text: item.to_owned(),
                },
                other => other,
            })?;
            pieces.push((range, piece.trim().to_owned()));
        }
    }
    Ok(pieces)
}

/// Compact form "A-B,C"; `PortSet::parse_list(&[text])` reads it back.
/// The empty set displays as "" (and is `parse_list` of no items).
impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, range) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{range}")?;
        }
        Ok(())
    }
}

/// Reads the Display form: comma-separated ranges, merging overlaps.
impl FromStr for PortSet {
    type Err = RangeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        PortSet::parse_list(&[text])
    }
}

impl FromIterator<PortRange> for PortSet {
    fn from_iter<I: IntoIterator<Item = PortRange>>(iter: I) -> Self {
        PortSet::from_ranges(iter)
    }
}

#[cfg(test)]
#[path = "range_tests.rs"]
mod tests;

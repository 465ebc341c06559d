//! A block of contiguous ports held by one slot: `first..=first+count-1`. A single port is a
//! block of one, so holdings, the planner and the pool state treat both alike.

use std::fmt;
use std::ops::RangeInclusive;

/// The most ports one block may have (the API's `ports[].count` bound).
pub const MAX_BLOCK: u16 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortBlock {
    pub first: u16,
    /// At least 1.
    pub count: u16,
}

impl PortBlock {
    /// A block of one port.
    pub fn single(port: u16) -> PortBlock {
        PortBlock {
            first: port,
            count: 1,
        }
    }

    /// A block of `count` ports from `first`, or `None` if it would be empty, contain port 0 or
    /// run past 65535.
    pub fn new(first: u16, count: u32) -> Option<PortBlock> {
        let count = u16::try_from(count).ok().filter(|&c| c >= 1)?;
        let fits = first >= 1 && u32::from(first) + u32::from(count) - 1 <= u32::from(u16::MAX);
        fits.then_some(PortBlock { first, count })
    }

    /// The block `first..=last`, or `None` if `last < first` or it contains port 0.
    pub fn spanning(first: u16, last: u16) -> Option<PortBlock> {
        (first >= 1 && last >= first).then(|| PortBlock {
            first,
            count: last - first + 1,
        })
    }

    pub fn last(&self) -> u16 {
        self.first + (self.count - 1)
    }

    pub fn ports(&self) -> RangeInclusive<u16> {
        self.first..=self.last()
    }

    pub fn contains(&self, port: u16) -> bool {
        self.ports().contains(&port)
    }

    pub fn overlaps(&self, other: &PortBlock) -> bool {
        self.first <= other.last() && other.first <= self.last()
    }

    pub fn is_single(&self) -> bool {
        self.count == 1
    }

    /// Reads `20000` or `20000-20007` (ASCII digits only, as `Display` writes).
    pub fn parse(text: &str) -> Option<PortBlock> {
        match text.split_once('-') {
            Some((first, last)) => PortBlock::spanning(parse_port(first)?, parse_port(last)?),
            None => parse_port(text).map(PortBlock::single),
        }
    }
}

fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|&port| port != 0)
}

/// `20000` for a single port, `20000-20007` for a block: the holdings text and messages.
impl fmt::Display for PortBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_single() {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bounds_and_text() {
        assert_eq!(PortBlock::new(65530, 6).map(|b| b.last()), Some(65535));
        assert_eq!(PortBlock::new(65530, 7), None);
        assert_eq!(PortBlock::new(0, 1), None);
        assert_eq!(PortBlock::new(10, 0), None);
        let block = PortBlock::new(20000, 8).unwrap();
        assert_eq!(block.to_string(), "20000-20007");
        assert_eq!(PortBlock::single(80).to_string(), "80");
        assert_eq!(PortBlock::parse("20000-20007"), Some(block));
        assert_eq!(PortBlock::parse("80"), Some(PortBlock::single(80)));
        for bad in [
            "", "-", "5-4", "0-3", "1-", "-3", "1-2-3", "+1", "1 -2", "70000",
        ] {
            assert_eq!(PortBlock::parse(bad), None, "{bad:?}");
        }
        assert!(block.overlaps(&PortBlock::single(20007)));
        assert!(!block.overlaps(&PortBlock::single(20008)));
    }

    proptest! {
        #[test]
        fn text_round_trips(first in 1u16.., count in 1u32..=1024) {
            if let Some(block) = PortBlock::new(first, count) {
                prop_assert_eq!(PortBlock::parse(&block.to_string()), Some(block));
                prop_assert_eq!(block.ports().count() as u32, count);
            } else {
                prop_assert!(u32::from(first) + count - 1 > 65535);
            }
        }
    }
}

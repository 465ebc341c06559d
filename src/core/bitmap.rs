//! A fixed-size bitmap of held ports, indexed by a port's dense index in its
//! pool. Scans work a 64-bit word at a time so a nearly full 65,535-port pool
//! (1,024 words) is searched in about a microsecond.

use std::ops::Range;

const WORD_BITS: u32 = u64::BITS;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortBitmap {
    words: Vec<u64>,
    len: u32,
    /// Kept in step with `set`/`clear` so counts are O(1).
    set_count: u32,
}

impl PortBitmap {
    /// A bitmap of `len` clear bits.
    pub fn new(len: u32) -> PortBitmap {
        PortBitmap {
            words: vec![0; len.div_ceil(WORD_BITS) as usize],
            len,
            set_count: 0,
        }
    }

    /// Number of bits.
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn locate(&self, index: u32) -> (usize, u64) {
        assert!(
            index < self.len,
            "bit {index} is outside a bitmap of {} bits",
            self.len
        );
        ((index / WORD_BITS) as usize, 1u64 << (index % WORD_BITS))
    }

    /// Sets a bit; returns whether it was clear before.
    ///
    /// Panics if `index >= len`: callers map ports to indices through the
    /// pool's `PortSet`, so an out-of-range index is a bug, not bad input.
    pub fn set(&mut self, index: u32) -> bool {
        let (word, mask) = self.locate(index);
        let was_clear = self.words[word] & mask == 0;
        self.words[word] |= mask;
        self.set_count += u32::from(was_clear);
        was_clear
    }

    /// Clears a bit; returns whether it was set before. Panics like `set`.
    pub fn clear(&mut self, index: u32) -> bool {
        let (word, mask) = self.locate(index);
        let was_set = self.words[word] & mask != 0;
        self.words[word] &= !mask;
        self.set_count -= u32::from(was_set);
        was_set
    }

    /// Whether a bit is set; false past the end.
    pub fn is_set(&self, index: u32) -> bool {
        index < self.len && {
            let (word, mask) = self.locate(index);
            self.words[word] & mask != 0
        }
    }

    pub fn count_set(&self) -> u32 {
        self.set_count
    }

    pub fn count_clear(&self) -> u32 {
        self.len - self.set_count
    }

    /// The words overlapping `from..to` as `(index of bit 0, mask of the
    /// bits inside the range, word)`.
    fn words_in(&self, from: u32, to: u32) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        let to = to.min(self.len);
        let words = if from < to {
            from / WORD_BITS..to.div_ceil(WORD_BITS)
        } else {
            0..0
        };
        words.map(move |w| {
            let base = w * WORD_BITS;
            let mut inside = !0u64;
            if from > base {
                inside &= !0u64 << (from - base);
            }
            if to < base + WORD_BITS {
                inside &= !(!0u64 << (to - base));
            }
            (base, inside, self.words[w as usize])
        })
    }

    /// Number of set bits in `range` (popcount over at most ~1,024 words).
    pub fn count_set_in(&self, range: Range<u32>) -> u32 {
        self.words_in(range.start, range.end)
            .map(|(_, inside, word)| (word & inside).count_ones())
            .sum()
    }

    /// The lowest clear bit in `from..to_exclusive`, skipping full words.
    pub fn first_clear_in(&self, from: u32, to_exclusive: u32) -> Option<u32> {
        // Bits outside the range read as set, so the first word that is not
        // all ones holds the answer at its first zero.
        self.words_in(from, to_exclusive)
            .map(|(base, inside, word)| (base, word | !inside))
            .find(|&(_, word)| word != !0)
            .map(|(base, word)| base + word.trailing_ones())
    }

    /// The lowest set bit in `from..to_exclusive`, skipping clear words.
    pub fn first_set_in(&self, from: u32, to_exclusive: u32) -> Option<u32> {
        self.words_in(from, to_exclusive)
            .map(|(base, inside, word)| (base, word & inside))
            .find(|&(_, word)| word != 0)
            .map(|(base, word)| base + word.trailing_zeros())
    }

    /// The lowest `start` in `from..to_exclusive` such that the `len` bits
    /// `start..start + len` are all clear and end by `to_exclusive`. Hops
    /// from one clear run to the next, so the cost follows the number of
    /// runs, not of bits.
    pub fn find_clear_run(&self, from: u32, to_exclusive: u32, len: u32) -> Option<u32> {
        let to = to_exclusive.min(self.len);
        let len = len.max(1);
        let mut at = from;
        loop {
            let start = self.first_clear_in(at, to)?;
            let end = start.checked_add(len).filter(|&end| end <= to)?;
            match self.first_set_in(start, end) {
                None => return Some(start),
                Some(set) => at = set + 1,
            }
        }
    }

    /// The maximal clear runs inside `from..to_exclusive`, as `start..end`,
    /// ascending.
    pub fn clear_runs(
        &self,
        from: u32,
        to_exclusive: u32,
    ) -> impl Iterator<Item = Range<u32>> + '_ {
        let to = to_exclusive.min(self.len);
        let mut at = from;
        std::iter::from_fn(move || {
            let start = self.first_clear_in(at, to)?;
            let end = self.first_set_in(start, to).unwrap_or(to);
            at = end;
            Some(start..end)
        })
    }

    /// The first clear bit scanning `start..hi`, then wrapping to `lo..start`.
    /// A `start` outside `lo..hi` scans from `lo`.
    pub fn first_clear_wrapping(&self, start: u32, lo: u32, hi_exclusive: u32) -> Option<u32> {
        let start = if (lo..hi_exclusive).contains(&start) {
            start
        } else {
            lo
        };
        self.first_clear_in(start, hi_exclusive)
            .or_else(|| self.first_clear_in(lo, start))
    }

    /// Indices of set bits, ascending.
    pub fn iter_set(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let base = w as u32 * WORD_BITS;
            let mut rest = word;
            std::iter::from_fn(move || {
                (rest != 0).then(|| {
                    let bit = rest.trailing_zeros();
                    rest &= rest - 1;
                    base + bit
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn set_clear_and_count() {
        let mut bits = PortBitmap::new(130);
        assert!(bits.set(0));
        assert!(!bits.set(0));
        assert!(bits.set(129));
        assert!(bits.is_set(129));
        assert!(!bits.is_set(130));
        assert_eq!(bits.count_set(), 2);
        assert!(bits.clear(0));
        assert!(!bits.clear(0));
        assert_eq!(bits.count_set(), 1);
        assert_eq!(bits.count_clear(), 129);
        assert_eq!(bits.iter_set().collect::<Vec<_>>(), [129]);
    }

    #[test]
    fn scan_skips_full_words_and_respects_bounds() {
        let mut bits = PortBitmap::new(200);
        for i in 0..200 {
            bits.set(i);
        }
        assert_eq!(bits.first_clear_in(0, 200), None);
        bits.clear(150);
        assert_eq!(bits.first_clear_in(0, 200), Some(150));
        assert_eq!(bits.first_clear_in(150, 151), Some(150));
        assert_eq!(bits.first_clear_in(0, 150), None);
        assert_eq!(bits.first_clear_in(151, 200), None);
        assert_eq!(bits.first_clear_in(151, 1000), None);
        assert_eq!(bits.first_clear_wrapping(160, 100, 200), Some(150));
        assert_eq!(bits.first_clear_wrapping(10, 100, 200), Some(150));
        assert_eq!(bits.count_set_in(100..200), 99);
        assert_eq!(bits.count_set_in(3..5), 2);
        let (high, low) = (5, 3);
        assert_eq!(bits.count_set_in(high..low), 0);
    }

    #[test]
    fn a_bitmap_with_no_bits_has_nothing_to_find() {
        let bits = PortBitmap::new(0);
        assert_eq!(bits.first_clear_in(0, 10), None);
        assert_eq!(bits.first_clear_wrapping(0, 0, 0), None);
        assert_eq!(bits.count_set_in(0..10), 0);
    }

    #[test]
    fn nearly_full_full_size_pool_finds_the_one_gap() {
        let mut bits = PortBitmap::new(65535);
        for i in 0..65535 {
            bits.set(i);
        }
        bits.clear(7);
        assert_eq!(bits.first_clear_wrapping(65000, 0, 65535), Some(7));
    }

    proptest! {
        #[test]
        fn scans_and_counts_match_a_naive_model(
            len in 0u32..300,
            held in prop::collection::btree_set(0u32..300, 0..300),
            from in 0u32..320,
            to in 0u32..320,
        ) {
            let held: BTreeSet<u32> = held.into_iter().filter(|&i| i < len).collect();
            let mut bits = PortBitmap::new(len);
            for &i in &held {
                bits.set(i);
            }
            let end = to.min(len);
            let expected_clear = (from..end).find(|i| !held.contains(i));
            prop_assert_eq!(bits.first_clear_in(from, to), expected_clear);
            let expected_count = (from..end).filter(|i| held.contains(i)).count() as u32;
            prop_assert_eq!(bits.count_set_in(from..to), expected_count);
            prop_assert_eq!(bits.count_set(), held.len() as u32);
            prop_assert_eq!(bits.iter_set().collect::<BTreeSet<_>>(), held.clone());

            let expected_set = (from..end).find(|i| held.contains(i));
            prop_assert_eq!(bits.first_set_in(from, to), expected_set);

            if from < end {
                let start = from;
                let (lo, hi) = (from.min(to) / 2, end);
                let wrapped = (start..hi).chain(lo..start).find(|i| !held.contains(i));
                prop_assert_eq!(bits.first_clear_wrapping(start, lo, hi), wrapped);
            }
        }
    }

    proptest! {
        #[test]
        fn runs_match_a_naive_model(
            len in 0u32..200,
            held in prop::collection::btree_set(0u32..200, 0..120),
            from in 0u32..210,
            to in 0u32..210,
            run in 1u32..20,
        ) {
            let held: BTreeSet<u32> = held.into_iter().filter(|&i| i < len).collect();
            let mut bits = PortBitmap::new(len);
            for &i in &held {
                bits.set(i);
            }
            let end = to.min(len);
            let free = |i: u32| i < end && !held.contains(&i);
            let expected = (from..end).find(|&s| (s..s + run).all(free));
            prop_assert_eq!(bits.find_clear_run(from, to, run), expected);

            let runs: Vec<Range<u32>> = bits.clear_runs(from, to).collect();
            let clear: Vec<u32> = runs.iter().flat_map(|r| r.clone()).collect();
            prop_assert_eq!(clear, (from..end).filter(|&i| free(i)).collect::<Vec<_>>());
            // Maximal: two runs never touch.
            for pair in runs.windows(2) {
                prop_assert!(pair[0].end < pair[1].start);
            }
            prop_assert!(runs.iter().all(|r| !r.is_empty()));
        }
    }
}

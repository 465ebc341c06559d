//! How a pool's free ports lie: in how many runs of contiguous free ports, and how long the
//! longest is. A block of N ports needs one run of at least N, so free ports alone do not say
//! whether a block fits.

use std::fmt;

/// The lengths of a pool's maximal free runs, in port order. Runs end at held ports, at
/// exclusions and at gaps between ranges (the band split does not end a run: a block may
/// straddle it when the dynamic band has no room).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fragmentation {
    lengths: Vec<u32>,
}

/// The three numbers messages quote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RunSummary {
    pub free: u32,
    pub runs: u32,
    pub largest: u32,
}

impl Fragmentation {
    pub fn from_lengths(lengths: impl IntoIterator<Item = u32>) -> Fragmentation {
        Fragmentation {
            lengths: lengths.into_iter().filter(|&len| len > 0).collect(),
        }
    }

    pub fn free(&self) -> u32 {
        self.lengths.iter().sum()
    }

    pub fn runs(&self) -> u32 {
        self.lengths.len() as u32
    }

    pub fn largest(&self) -> u32 {
        self.lengths.iter().copied().max().unwrap_or(0)
    }

    /// How many disjoint blocks of `size` ports still fit (each run holds `len / size`).
    pub fn fits(&self, size: u32) -> u32 {
        let size = size.max(1);
        self.lengths.iter().map(|len| len / size).sum()
    }

    pub fn summary(&self) -> RunSummary {
        RunSummary {
            free: self.free(),
            runs: self.runs(),
            largest: self.largest(),
        }
    }
}

/// "the largest free run is 9 (1200 free in 37 runs)"
impl fmt::Display for RunSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let runs = if self.runs == 1 { "run" } else { "runs" };
        write!(
            f,
            "the largest free run is {} ({} free in {} {runs})",
            self.largest, self.free, self.runs
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_runs_and_fitting_blocks() {
        let frag = Fragmentation::from_lengths([9, 0, 40, 16, 1]);
        assert_eq!((frag.free(), frag.runs(), frag.largest()), (66, 4, 40));
        assert_eq!(frag.fits(8), 1 + 5 + 2);
        assert_eq!(frag.fits(16), 2 + 1);
        assert_eq!(frag.fits(32), 1);
        assert_eq!(frag.fits(64), 0);
        assert_eq!(
            frag.summary().to_string(),
            "the largest free run is 40 (66 free in 4 runs)"
        );
        let empty = Fragmentation::default();
        assert_eq!((empty.free(), empty.largest(), empty.fits(1)), (0, 0, 0));
    }
}

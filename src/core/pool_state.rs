//! One pool in memory: its ports (after exclusions), their static/dynamic
//! split, and which of them are held. Rebuilt from the stored holdings for
//! every change, so it holds no identities, only bits.

use rand::Rng;

use super::alloc_error::AllocError;
use super::band::{Band, Bands, StaticBand};
use super::bitmap::PortBitmap;
use super::block::PortBlock;
use super::fragmentation::Fragmentation;
use super::placement_policy::{Aim, Lean, Placement};
use super::range::PortSet;

/// Held and total ports of one band (what `pool describe` prints).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BandUsage {
    pub used: u32,
    pub size: u32,
}

impl BandUsage {
    pub fn free(&self) -> u32 {
        self.size - self.used
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolState {
    ports: PortSet,
    bands: Bands,
    held: PortBitmap,
    placement: Placement,
    lean: Option<Lean>,
}

impl PoolState {
    /// A pool with nothing held.
    pub fn new(ports: PortSet, static_band: StaticBand) -> PoolState {
        let total = ports.len();
        PoolState {
            bands: Bands::new(total, static_band),
            held: PortBitmap::new(total),
            ports,
            placement: Placement::default(),
            lean: None,
        }
    }

    /// The same pool choosing automatic ports by `placement` (benchmarks compare them).
    pub fn with_placement(mut self, placement: Placement) -> PoolState {
        self.placement = placement;
        self
    }

    /// The same pool with every allocation leaning toward one end of its free run.
    pub fn leaning(mut self, lean: Lean) -> PoolState {
        self.lean = Some(lean);
        self
    }

    /// The aim of an allocation's first block.
    pub(super) fn first_aim(&self, rng: &mut impl Rng) -> Aim {
        match self.lean {
            Some(lean) => Aim::fixed(lean),
            None => Aim::first(rng),
        }
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Records a port that stored holdings say is held. Errors (rather than
    /// panics) when the port is outside the pool or recorded twice, so the
    /// caller can report holdings that a pool edit left stranded.
    pub fn mark_held(&mut self, port: u16) -> Result<(), AllocError> {
        self.take_requested(port)
    }

    /// Takes a specific port: it must be in the pool and free.
    pub fn take_requested(&mut self, port: u16) -> Result<(), AllocError> {
        let index = self.index_of(port)?;
        if self.held.set(index) {
            Ok(())
        } else {
            Err(AllocError::Held { port })
        }
    }

    /// Records a block that stored holdings say is held, port by port; the
    /// first port that is outside the pool or already held is the error, and
    /// the ports before it stay marked (the caller reports, not retries).
    pub fn mark_block_held(&mut self, block: PortBlock) -> Vec<(u16, AllocError)> {
        block
            .ports()
            .filter_map(|port| self.mark_held(port).err().map(|e| (port, e)))
            .collect()
    }

    /// Takes a specific block: every port must be in the pool (no exclusion,
    /// no gap between ranges inside it) and free. Nothing changes on error.
    pub fn take_requested_block(&mut self, block: PortBlock) -> Result<(), AllocError> {
        if block.is_single() {
            return self.take_requested(block.first);
        }
        let mut indices = Vec::with_capacity(usize::from(block.count));
        for port in block.ports() {
            let index = self
                .ports
                .index_of(port)
                .ok_or_else(|| AllocError::BlockNotInPool {
                    block,
                    port,
                    ranges: self.ports.clone(),
                })?;
            indices.push(index);
        }
        if let Some(&index) = indices.iter().find(|&&i| self.held.is_set(i)) {
            let port = self.ports.nth(index).unwrap_or(block.first);
            return Err(AllocError::BlockHeld { block, port });
        }
        for index in indices {
            self.held.set(index);
        }
        Ok(())
    }

    /// Takes a free block of `count` contiguous ports chosen automatically,
    /// or `None` if no free run is that long.
    ///
    /// Like single ports: first a run inside the dynamic band; only when it
    /// has none, a run anywhere in the pool (so one may reach into the static
    /// band). Where in there is the placement's choice (`Placement`).
    pub fn take_block(&mut self, count: u32, rng: &mut impl Rng) -> Option<PortBlock> {
        let aim = self.first_aim(rng);
        self.take_aimed(count, aim, rng)
    }

    /// `take_block` with the aim the planner keeps for one allocation.
    pub(super) fn take_aimed(
        &mut self,
        count: u32,
        aim: Aim,
        rng: &mut impl Rng,
    ) -> Option<PortBlock> {
        let count = count.max(1);
        // Single ports fall back to the static band only; a block may straddle the split.
        let fallback = if count == 1 {
            self.bands.static_indices()
        } else {
            0..self.bands.total
        };
        let (held, ports) = (&self.held, &self.ports);
        let start = self
            .placement
            .place(held, ports, self.bands.dynamic_indices(), count, aim, rng)
            .or_else(|| self.placement.place(held, ports, fallback, count, aim, rng))?;
        for index in start..start + count {
            self.held.set(index);
        }
        PortBlock::new(self.ports.nth(start)?, count)
    }

    /// Frees every port of a block; returns how many were held.
    pub fn release_block(&mut self, block: PortBlock) -> u32 {
        block
            .ports()
            .map(|port| u32::from(self.release(port)))
            .sum()
    }

    /// The length of the pool's longest range of contiguous ports, held or not.
    pub fn longest_range(&self) -> u32 {
        self.ports
            .index_spans()
            .map(|span| span.end - span.start)
            .max()
            .unwrap_or(0)
    }

    /// The pool's free runs of contiguous ports (see `Fragmentation`).
    pub fn fragmentation(&self) -> Fragmentation {
        Fragmentation::from_lengths(self.ports.index_spans().flat_map(|span| {
            self.held
                .clear_runs(span.start, span.end)
                .map(|run| run.end - run.start)
        }))
    }

    /// The share of the pool held (0 to 1) when a block of `count` ports would
    /// first be refused, if only such blocks came from now on: each free run
    /// then holds as many as fit in it, as packed placement tiles a run from
    /// one end (a run the band split cuts may hold one fewer). `pool describe`
    /// quotes it for the largest block the pool's holders use.
    pub fn occupancy_at_refusal(&self, count: u32) -> f64 {
        if self.size() == 0 {
            return 0.0;
        }
        let count = count.max(1);
        let held = self.held_count() + count * self.fragmentation().fits(count);
        f64::from(held) / f64::from(self.size())
    }

    /// Takes a free port chosen automatically, or `None` if the pool is full.
    ///
    /// The dynamic band first; only when it is full, the static band, so
    /// users keep the ports they are likeliest to request. Where in the band
    /// is the placement's choice (`Placement`), random among several ports so
    /// concurrent allocators seldom race for one.
    pub fn take_next(&mut self, rng: &mut impl Rng) -> Option<u16> {
        self.take_block(1, rng).map(|block| block.first)
    }

    /// Frees a port; returns whether it was held. Ports outside the pool were
    /// never held here, so releasing them does nothing.
    pub fn release(&mut self, port: u16) -> bool {
        self.ports
            .index_of(port)
            .is_some_and(|index| self.held.clear(index))
    }

    pub fn is_held(&self, port: u16) -> bool {
        self.ports
            .index_of(port)
            .is_some_and(|index| self.held.is_set(index))
    }

    pub fn contains(&self, port: u16) -> bool {
        self.ports.contains(port)
    }

    /// The pool's ports after exclusions.
    pub fn ports(&self) -> &PortSet {
        &self.ports
    }

    pub fn bands(&self) -> Bands {
        self.bands
    }

    /// The band a port of the pool falls in.
    pub fn band_of(&self, port: u16) -> Option<Band> {
        self.ports
            .index_of(port)
            .and_then(|index| self.bands.band_of(index))
    }

    pub fn size(&self) -> u32 {
        self.ports.len()
    }

    pub fn held_count(&self) -> u32 {
        self.held.count_set()
    }

    pub fn free_count(&self) -> u32 {
        self.held.count_clear()
    }

    pub fn usage(&self, band: Band) -> BandUsage {
        let indices = self.bands.indices(band);
        BandUsage {
            used: self.held.count_set_in(indices.clone()),
            size: indices.end - indices.start,
        }
    }

    /// The longest run of free, contiguous ports inside one band (a run never crosses a gap
    /// between ranges): the largest block that band could still give.
    pub fn largest_free_run(&self, band: Band) -> u32 {
        let band = self.bands.indices(band);
        self.ports
            .index_spans()
            .filter_map(|span| {
                let (start, end) = (span.start.max(band.start), span.end.min(band.end));
                (start < end).then(|| {
                    self.held
                        .clear_runs(start, end)
                        .map(|r| r.end - r.start)
                        .max()
                })
            })
            .flatten()
            .max()
            .unwrap_or(0)
    }

    pub fn static_usage(&self) -> BandUsage {
        self.usage(Band::Static)
    }

    pub fn dynamic_usage(&self) -> BandUsage {
        self.usage(Band::Dynamic)
    }

    /// Held ports, ascending.
    pub fn held_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.held
            .iter_set()
            .filter_map(|index| self.ports.nth(index))
    }

    /// The error for a request of `needed` automatic ports that don't fit.
    pub fn full_error(&self, needed: u32) -> AllocError {
        AllocError::PoolFull {
            size: self.size(),
            used: self.held_count(),
            needed,
            free: self.free_count(),
            runs: None,
        }
    }

    fn index_of(&self, port: u16) -> Result<u32, AllocError> {
        self.ports
            .index_of(port)
            .ok_or_else(|| AllocError::NotInPool {
                port,
                ranges: self.ports.clone(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::super::range::PortRange;
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use std::collections::BTreeSet;

    fn pool(ranges: &str, static_band: StaticBand) -> PoolState {
        PoolState::new(ranges.parse().unwrap(), static_band)
    }

    #[test]
    fn requested_ports_must_be_in_the_pool_and_free() {
        let mut state = pool("30000-32767", StaticBand::Auto);
        assert_eq!(
            state.take_requested(29999).unwrap_err().to_string(),
            "port 29999 is not in the pool's ranges 30000-32767: request a port inside them, or leave it unset to get one automatically"
        );
        assert_eq!(state.take_requested(30080), Ok(()));
        assert_eq!(
            state.take_requested(30080),
            Err(AllocError::Held { port: 30080 })
        );
        assert!(state.is_held(30080));
        assert_eq!(state.held_count(), 1);
        assert!(state.release(30080));
        assert!(!state.release(30080));
        assert!(!state.release(1));
        assert_eq!(state.free_count(), 2768);
    }

    #[test]
    fn largest_free_run_stays_inside_its_band_and_its_range() {
        // Two ranges (a gap at 106-199), ten static ports at the low end.
        let mut state = pool("100-105,200-213", StaticBand::Count(10));
        assert_eq!(state.bands().static_len, 10);
        // Static: 100-105 and 200-203; dynamic: 204-213.
        assert_eq!(state.largest_free_run(Band::Static), 6);
        assert_eq!(state.largest_free_run(Band::Dynamic), 10);
        state.take_requested(102).unwrap();
        state.take_requested(208).unwrap();
        assert_eq!(
            state.largest_free_run(Band::Static),
            4,
            "200-203, not 103-105 + 200"
        );
        assert_eq!(state.largest_free_run(Band::Dynamic), 5, "209-213");
        for port in 204..=213 {
            let _ = state.take_requested(port);
        }
        assert_eq!(state.largest_free_run(Band::Dynamic), 0);
    }

    #[test]
    fn mark_held_reports_stranded_and_duplicate_holdings() {
        let mut state = pool("100-110", StaticBand::None);
        assert_eq!(state.mark_held(105), Ok(()));
        assert_eq!(state.mark_held(105), Err(AllocError::Held { port: 105 }));
        assert!(matches!(
            state.mark_held(99),
            Err(AllocError::NotInPool { port: 99, .. })
        ));
    }

    #[test]
    fn an_empty_pool_says_so() {
        let state = PoolState::new(PortSet::empty(), StaticBand::Auto);
        let mut state = state.clone();
        assert!(
            state
                .take_requested(80)
                .unwrap_err()
                .to_string()
                .contains("ranges (none: every port is excluded)")
        );
        assert_eq!(state.take_next(&mut StdRng::seed_from_u64(1)), None);
    }

    #[test]
    fn usage_per_band_skips_excluded_gaps() {
        // 40 ports with a gap; Count(10) makes the 10 lowest *pool* ports static.
        let mut state = pool("1000-1004,2000-2034", StaticBand::Count(10));
        assert_eq!(state.band_of(1004), Some(Band::Static));
        assert_eq!(state.band_of(2004), Some(Band::Static));
        assert_eq!(state.band_of(2005), Some(Band::Dynamic));
        assert_eq!(state.band_of(1500), None);
        state.take_requested(1000).unwrap();
        state.take_requested(2010).unwrap();
        state.take_requested(2011).unwrap();
        assert_eq!(state.static_usage(), BandUsage { used: 1, size: 10 });
        assert_eq!(state.dynamic_usage(), BandUsage { used: 2, size: 30 });
        assert_eq!(state.dynamic_usage().free(), 28);
        assert_eq!(state.held_ports().collect::<Vec<_>>(), [1000, 2010, 2011]);
    }

    #[test]
    fn full_error_reports_the_numbers() {
        let mut state = pool("30000-32767", StaticBand::Auto);
        for port in 30000..30000 + 2760 {
            state.mark_held(port).unwrap();
        }
        assert_eq!(
            state.full_error(12).to_string(),
            "pool is full: it has 2768 ports, 2760 in use and 8 free, but this allocation needs 12; nothing was allocated. Add ranges to the pool, lower replicas, or delete PortAllocations no longer in use"
        );
    }

    #[test]
    fn a_nearly_full_full_size_pool_still_finds_its_free_ports() {
        let mut state = pool("1-65535", StaticBand::Auto);
        let free: BTreeSet<u16> = (1..=65535).step_by(100).collect();
        for port in 1..=65535 {
            if !free.contains(&port) {
                state.mark_held(port).unwrap();
            }
        }
        let mut rng = StdRng::seed_from_u64(7);
        let mut taken = BTreeSet::new();
        while let Some(port) = state.take_next(&mut rng) {
            assert!(free.contains(&port));
            assert!(taken.insert(port));
        }
        assert_eq!(taken, free);
    }

    fn arb_pool() -> impl Strategy<Value = PoolState> {
        let ranges = prop::collection::vec((1u16..200, 0u16..30), 1..5);
        let band = prop_oneof![
            Just(StaticBand::Auto),
            Just(StaticBand::None),
            (0u32..80).prop_map(StaticBand::Count),
        ];
        (ranges, band).prop_map(|(ranges, band)| {
            let ports = PortSet::from_ranges(ranges.into_iter().map(|(first, extra)| PortRange {
                first,
                last: first + extra,
            }));
            PoolState::new(ports, band)
        })
    }

    proptest! {
        #[test]
        fn automatic_choices_fill_the_dynamic_band_before_the_static_band(
            mut state in arb_pool(),
            pre_held in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
            seed in any::<u64>(),
        ) {
            for index in pre_held {
                let port = state.ports().nth(index.index(state.size() as usize) as u32).unwrap();
                let _ = state.mark_held(port);
            }
            let mut rng = StdRng::seed_from_u64(seed);
            let mut taken = BTreeSet::new();
            loop {
                let dynamic_had_room = state.dynamic_usage().free() > 0;
                let Some(port) = state.take_next(&mut rng) else { break };
                let expected = if dynamic_had_room { Band::Dynamic } else { Band::Static };
                prop_assert_eq!(state.band_of(port), Some(expected));
                prop_assert!(taken.insert(port), "port {} handed out twice", port);
            }
            prop_assert_eq!(state.free_count(), 0);
            prop_assert_eq!(state.held_count(), state.size());
        }

        #[test]
        fn release_frees_exactly_the_released_port(
            mut state in arb_pool(),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 1..20),
        ) {
            let ports: Vec<u16> = picks
                .iter()
                .map(|i| state.ports().nth(i.index(state.size() as usize) as u32).unwrap())
                .collect();
            for &port in &ports {
                let _ = state.mark_held(port);
            }
            let before: BTreeSet<u16> = state.held_ports().collect();
            let victim = ports[0];
            prop_assert!(state.release(victim));
            let after: BTreeSet<u16> = state.held_ports().collect();
            let mut expected = before;
            expected.remove(&victim);
            prop_assert_eq!(after, expected);
        }
    }
}

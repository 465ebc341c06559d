//! The static/dynamic split of a pool (after Kubernetes KEP-3668): the lowest
//! ports form a static band that automatic choices avoid while they can, so a
//! user who asks for a specific low port rarely finds it already taken.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use thiserror::Error;

/// KEP-3668's automatic static band size for a pool of `n` ports: none for
/// tiny pools, otherwise n/32 clamped to 16..=128.
pub fn auto_static_band_size(n: u32) -> u32 {
    if n <= 16 { 0 } else { (n / 32).clamp(16, 128) }
}

/// How a pool chooses its static band size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StaticBand {
    /// `auto_static_band_size` of the pool size.
    #[default]
    Auto,
    /// No static band: automatic choices may use the whole pool at once.
    None,
    /// Exactly this many ports, capped at the pool size.
    Count(u32),
}

impl StaticBand {
    /// The static band size for a pool of `n` ports.
    pub fn size_for(self, n: u32) -> u32 {
        match self {
            StaticBand::Auto => auto_static_band_size(n),
            StaticBand::None => 0,
            StaticBand::Count(count) => count.min(n),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "static band \"{text}\" is not valid: write \"auto\", \"none\" or a number of ports, e.g. \"64\""
)]
pub struct StaticBandError {
    pub text: String,
}

/// Reads "auto", "none" or a port count, the forms `Display` writes.
impl FromStr for StaticBand {
    type Err = StaticBandError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "auto" => Ok(StaticBand::Auto),
            "none" => Ok(StaticBand::None),
            digits if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => digits
                .parse()
                .map(StaticBand::Count)
                .map_err(|_| StaticBandError {
                    text: text.to_owned(),
                }),
            _ => Err(StaticBandError {
                text: text.to_owned(),
            }),
        }
    }
}

impl fmt::Display for StaticBand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StaticBand::Auto => f.write_str("auto"),
            StaticBand::None => f.write_str("none"),
            StaticBand::Count(count) => write!(f, "{count}"),
        }
    }
}

/// Which band a port belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Band {
    Static,
    Dynamic,
}

impl fmt::Display for Band {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Band::Static => "static",
            Band::Dynamic => "dynamic",
        })
    }
}

/// The split of a pool's dense port indices `0..total`: the static band is
/// `0..static_len` (the lowest ports), the dynamic band `static_len..total`.
/// Working on indices means excluded ports never count toward a band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bands {
    pub static_len: u32,
    pub total: u32,
}

impl Bands {
    pub fn new(total: u32, static_band: StaticBand) -> Bands {
        Bands {
            static_len: static_band.size_for(total),
            total,
        }
    }

    pub fn dynamic_len(&self) -> u32 {
        self.total - self.static_len
    }

    pub fn static_indices(&self) -> Range<u32> {
        0..self.static_len
    }

    pub fn dynamic_indices(&self) -> Range<u32> {
        self.static_len..self.total
    }

    pub fn indices(&self, band: Band) -> Range<u32> {
        match band {
            Band::Static => self.static_indices(),
            Band::Dynamic => self.dynamic_indices(),
        }
    }

    /// The band of a dense index, or `None` past the end of the pool.
    pub fn band_of(&self, index: u32) -> Option<Band> {
        if index < self.static_len {
            Some(Band::Static)
        } else if index < self.total {
            Some(Band::Dynamic)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn auto_size_follows_kep_3668() {
        for (n, size) in [
            (0, 0),
            (10, 0),
            (16, 0),
            (17, 16),
            (128, 16),
            (2048, 64),
            (2768, 86),
            (4096, 128),
            (8192, 128),
            (65535, 128),
        ] {
            assert_eq!(auto_static_band_size(n), size, "n = {n}");
        }
    }

    #[test]
    fn explicit_sizes() {
        assert_eq!(StaticBand::None.size_for(4096), 0);
        assert_eq!(StaticBand::Count(10).size_for(4096), 10);
        assert_eq!(StaticBand::Count(500).size_for(100), 100);
        assert_eq!(StaticBand::Auto.size_for(2768), 86);
    }

    #[test]
    fn bands_split_indices() {
        let bands = Bands::new(2768, StaticBand::Auto);
        assert_eq!(bands.static_indices(), 0..86);
        assert_eq!(bands.dynamic_indices(), 86..2768);
        assert_eq!(bands.dynamic_len(), 2682);
        assert_eq!(bands.band_of(85), Some(Band::Static));
        assert_eq!(bands.band_of(86), Some(Band::Dynamic));
        assert_eq!(bands.band_of(2768), None);
    }

    #[test]
    fn static_band_text_round_trips_and_rejects_junk() {
        for band in [StaticBand::Auto, StaticBand::None, StaticBand::Count(64)] {
            assert_eq!(band.to_string().parse(), Ok(band));
        }
        assert_eq!(
            "lots".parse::<StaticBand>().unwrap_err().to_string(),
            r#"static band "lots" is not valid: write "auto", "none" or a number of ports, e.g. "64""#
        );
        assert!("-1".parse::<StaticBand>().is_err());
        assert!("99999999999".parse::<StaticBand>().is_err());
    }

    proptest! {
        #[test]
        fn auto_band_never_exceeds_the_pool(n in 0u32..=65535) {
            let size = auto_static_band_size(n);
            prop_assert!(size <= n);
            prop_assert!(size == 0 || (16..=128).contains(&size));
        }
    }
}

//! Which shard of a pool records which port, what shards are called, and in which
//! order an owner tries them (docs/record-at-scale.md, section 3). Pure arithmetic on ports.
//!
//! **Shards are aligned by port number, not by the pool's ordinal.** Shard `k` is the record
//! of the window `256k ..= 256k+255` (port 0 is no port, so window 0 is 1-255), intersected
//! with the pool's ports. The shard of a port is `port / 256`, whatever the pool's spec says.
//! Why not the n-th 256 ports of the pool: PortPool specs can be edited (ranges, exclusions),
//! and one exclusion added near the start would shift every later ordinal, moving ports (and
//! their holders) between shards — a move no single compare-and-swap covers. With windows:
//! - a new exclusion, or a range cut short, only removes ports from their windows; holdings
//!   on them stay in the shard where they are and are reported as outside the pool;
//! - a range extended or added fills existing windows or adds shards for new windows;
//! - a window left with no pool port keeps its shard (and any stranded entries) until
//!   `repair` has nothing left in it.
//!
//! A holder's entry therefore never has to move. The price is uneven shards: a pool of
//! 30250-30260 has two (6 and 5 ports), and a pool of many small ranges up to one per range.
//! A pool has at most 256 shards (1-65535: 255 + 256 x 255 ports).
//!
//! **Bands.** The pool's static band (KEP-3668) is its lowest ports by ordinal, so inside
//! every shard the static ports are the shard's lowest ones, and a shard can plan with a
//! static band of its own: [`WindowSpan::static_ports`]. A shard whose ports are all static
//! is tried last.

use crate::core::{PortRange, PortSet, StaticBand};

/// Ports per window.
pub const WINDOW_PORTS: u32 = 256;
/// The longest object name Kubernetes accepts (a DNS-1123 subdomain).
pub const MAX_NAME_LEN: usize = 253;

/// The window (shard index) a port falls in.
pub fn window_of(port: u16) -> u16 {
    port / WINDOW_PORTS as u16
}

/// All ports of window `index` (0..=255), whether or not the pool has them.
pub fn window(index: u16) -> PortRange {
    let first = (u32::from(index) * WINDOW_PORTS).max(1);
    let last = (u32::from(index) * WINDOW_PORTS + WINDOW_PORTS - 1).min(u32::from(u16::MAX));
    PortRange::new(first as u16, last as u16).expect("a window is never empty")
}

/// Which shard: a window of the pool's ports in one of its copies (`nodeReuse`). Copy 0 is the
/// pool of a pool without reuse; copy `c` holds a second, third, ... holder of each port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardKey {
    pub copy: u16,
    pub window: u16,
}

impl ShardKey {
    pub const fn new(copy: u16, window: u16) -> ShardKey {
        ShardKey { copy, window }
    }

    /// Window `window` of copy 0, the only copy of a pool without reuse.
    pub const fn first(window: u16) -> ShardKey {
        ShardKey { copy: 0, window }
    }

    /// How `status.shards` of a PortAllocation names it: `copy * 256 + window`, so copy 0's
    /// shards keep the window numbers they always had.
    pub fn to_status(self) -> i32 {
        i32::from(self.copy) * WINDOW_PORTS as i32 + i32::from(self.window)
    }

    /// The key a `status.shards` value names; `None` outside 0-65535.
    pub fn from_status(value: i32) -> Option<ShardKey> {
        let value = u16::try_from(value).ok()?;
        Some(ShardKey {
            copy: value / WINDOW_PORTS as u16,
            window: value % WINDOW_PORTS as u16,
        })
    }
}

impl std::fmt::Display for ShardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.copy {
            0 => write!(f, "window {}", self.window),
            copy => write!(f, "window {} of copy {copy}", self.window),
        }
    }
}

/// The name of shard `key` of pool `pool`: `<pool>-<window>` in copy 0, `<pool>-<window>-c<copy>`
/// in the others. A pool name so long that the suffix would pass 253 characters is cut and
/// followed by 8 hex digits of a hash of the whole name, `<cut pool>-<hash>-<window>[-c<copy>]`,
/// so shards of two long names with one prefix still differ. Short names cannot collide across
/// pools: the pool is what comes before the last `-<number>` (after dropping a `-c<number>`),
/// and no pool's copy-0 shard ends in `-c<number>`. Long ones could only by a hash collision,
/// which a shard's `spec.pool` and `spec.poolUID` reveal.
pub fn shard_name(pool: &str, key: ShardKey) -> String {
    let ShardKey { copy, window } = key;
    let tail = match copy {
        0 => format!("-{window}"),
        copy => format!("-{window}-c{copy}"),
    };
    let plain = format!("{pool}{tail}");
    if plain.len() <= MAX_NAME_LEN {
        return plain;
    }
    let suffix = format!("-{:08x}{tail}", fnv1a(pool.as_bytes()) as u32);
    // Names are ASCII (DNS subdomains), so any byte offset is a character boundary; a cut
    // ending in '-' or '.' would leave an invalid label.
    let cut = pool[..MAX_NAME_LEN - suffix.len()].trim_end_matches(['-', '.']);
    format!("{cut}{suffix}")
}

/// FNV-1a, 64 bits: every client must pick the same home shard for a UID, on every platform
/// and Rust version, which std's hashers do not promise.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One shard of a pool's current layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowSpan {
    pub index: u16,
    /// The pool's ports in this window.
    pub ports: PortSet,
    /// How many of them are in the pool's static band: always the shard's lowest ones.
    pub static_ports: u32,
}

impl WindowSpan {
    /// Whether automatic allocation should come here only when every other shard is full.
    pub fn is_static(&self) -> bool {
        self.static_ports == self.ports.len()
    }

    /// The static band this shard plans with.
    pub fn static_band(&self) -> StaticBand {
        StaticBand::Count(self.static_ports)
    }
}

/// The shards of a pool with the given ports and static band, ascending by index; windows
/// without a pool port have none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowLayout {
    shards: Vec<WindowSpan>,
}

impl WindowLayout {
    pub fn new(ports: &PortSet, static_band: StaticBand) -> WindowLayout {
        let static_len = static_band.size_for(ports.len());
        let mut shards: Vec<WindowSpan> = Vec::new();
        let mut ordinal = 0u32;
        for range in ports.ranges() {
            let (mut first, last) = (range.first, range.last);
            loop {
                let index = window_of(first);
                let piece_last = window(index).last.min(last);
                let piece = PortRange::new(first, piece_last).expect("first <= piece_last");
                // Ports of the static band are ordinals 0..static_len.
                let statics = static_len.saturating_sub(ordinal).min(piece.len());
                ordinal += piece.len();
                match shards.last_mut() {
                    Some(shard) if shard.index == index => {
                        shard.ports = PortSet::from_ranges(
                            shard.ports.ranges().iter().copied().chain([piece]),
                        );
                        shard.static_ports += statics;
                    }
                    _ => shards.push(WindowSpan {
                        index,
                        ports: PortSet::from_ranges([piece]),
                        static_ports: statics,
                    }),
                }
                if piece_last == last {
                    break;
                }
                first = piece_last + 1;
            }
        }
        WindowLayout { shards }
    }

    pub fn shards(&self) -> &[WindowSpan] {
        &self.shards
    }

    pub fn get(&self, index: u16) -> Option<&WindowSpan> {
        self.shards
            .binary_search_by_key(&index, |s| s.index)
            .ok()
            .map(|i| &self.shards[i])
    }

    /// The shard recording `port`, or `None` if the pool does not have that port. A requested
    /// port fixes its shard this way.
    pub fn shard_of(&self, port: u16) -> Option<&WindowSpan> {
        self.get(window_of(port)).filter(|s| s.ports.contains(port))
    }

    /// The order in which the owner `namespace/name` tries shards: from `hash(owner) mod n`
    /// among the shards with dynamic ports, then +1, +2, ... wrapping; then the all-static shards, from
    /// the hash too. Every shard exactly once. The home shard moves when the layout gains or
    /// loses a shard (a pool edit); the owner's status records the shard it used, so that is
    /// only a different first guess for new owners.
    pub fn home_order(&self, owner: &str) -> Vec<u16> {
        let hash = fnv1a(owner.as_bytes());
        let (statics, dynamics): (Vec<&WindowSpan>, Vec<&WindowSpan>) =
            self.shards.iter().partition(|s| s.is_static());
        let indices = |spans: Vec<&WindowSpan>| spans.iter().map(|s| s.index).collect();
        let (statics, dynamics) = (indices(statics), indices(dynamics));
        let mut order = rotated(dynamics, hash);
        order.extend(rotated(statics, hash));
        order
    }
}

fn rotated(mut indices: Vec<u16>, hash: u64) -> Vec<u16> {
    if !indices.is_empty() {
        let start = (hash % indices.len() as u64) as usize;
        indices.rotate_left(start);
    }
    indices
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(items: &[&str]) -> PortSet {
        PortSet::parse_list(items).unwrap()
    }

    #[test]
    fn node_port_range_is_eleven_windows_of_at_most_256() {
        let layout = WindowLayout::new(&set(&["30000-32767"]), StaticBand::Auto);
        let shards = layout.shards();
        assert_eq!(shards.len(), 11);
        assert_eq!(shards[0].index, 117);
        assert_eq!(shards[0].ports.to_string(), "30000-30207");
        assert_eq!(shards[1].ports.to_string(), "30208-30463");
        assert_eq!(shards[10].ports.to_string(), "32512-32767");
        // Auto: 2768 / 32 = 86 static ports, all in the first shard, which keeps dynamic ones.
        assert_eq!(shards[0].static_ports, 86);
        assert!(shards.iter().all(|s| !s.is_static()));
        assert_eq!(layout.shard_of(30207).map(|s| s.index), Some(117));
        assert_eq!(layout.shard_of(30208).map(|s| s.index), Some(118));
        assert_eq!(layout.shard_of(29999), None);
    }

    #[test]
    fn whole_port_space_is_256_shards() {
        let layout = WindowLayout::new(&set(&["1-65535"]), StaticBand::None);
        assert_eq!(layout.shards().len(), 256);
        assert_eq!(layout.shards()[0].ports.to_string(), "1-255");
        assert_eq!(layout.shards()[255].ports.to_string(), "65280-65535");
    }

    #[test]
    fn an_edit_of_the_pool_leaves_every_port_in_its_shard() {
        let before = WindowLayout::new(&set(&["30000-30999"]), StaticBand::Auto);
        let after = WindowLayout::new(&set(&["30000-30009", "30011-31500"]), StaticBand::Auto);
        for port in 30000..=30999 {
            if let (Some(a), Some(b)) = (before.shard_of(port), after.shard_of(port)) {
                assert_eq!(a.index, b.index, "{port}");
            }
        }
        assert_eq!(after.shard_of(30010), None);
        assert_eq!(after.shards().len(), before.shards().len() + 2);
    }

    #[test]
    fn static_only_shards_come_last() {
        // 64 ports kept static: the whole first window (1-63) and one port of the next.
        let layout = WindowLayout::new(&set(&["1-63", "1000-1511"]), StaticBand::Count(64));
        let spans: Vec<_> = layout
            .shards()
            .iter()
            .map(|s| (s.index, s.ports.len(), s.static_ports))
            .collect();
        assert_eq!(
            spans,
            vec![(0, 63, 63), (3, 24, 1), (4, 256, 0), (5, 232, 0)]
        );
        for uid in ["a", "b", "c", "0f3c-11"] {
            assert_eq!(layout.home_order(uid).last(), Some(&0), "{uid}");
        }
    }

    #[test]
    fn names_stay_within_the_limit_and_distinct() {
        assert_eq!(shard_name("default", ShardKey::first(117)), "default-117");
        assert_eq!(
            shard_name("default", ShardKey::new(3, 117)),
            "default-117-c3"
        );
        let long_a = format!("{}.a", "x".repeat(249));
        let long_b = format!("{}.b", "x".repeat(249));
        let a = shard_name(&long_a, ShardKey::first(255));
        let b = shard_name(&long_b, ShardKey::first(255));
        assert!(a.len() <= MAX_NAME_LEN && b.len() <= MAX_NAME_LEN);
        assert_ne!(a, b);
        assert!(a.ends_with("-255"));
        // The cut never leaves "-" or "." before the hash.
        let dotted = format!("{}.{}", "y".repeat(241), "z".repeat(11));
        let name = shard_name(&dotted, ShardKey::first(3));
        assert!(!name.contains(".-") && !name.contains("--"), "{name}");
        assert!(name.starts_with(&format!("{}-", "y".repeat(241))), "{name}");
        let copied = shard_name(&long_a, ShardKey::new(255, 255));
        assert!(
            copied.len() <= MAX_NAME_LEN && copied.ends_with("-255-c255"),
            "{copied}"
        );
        assert_ne!(copied, a);
    }

    #[test]
    fn status_values_keep_copy_zero_as_it_was() {
        assert_eq!(ShardKey::first(117).to_status(), 117);
        assert_eq!(ShardKey::new(2, 117).to_status(), 2 * 256 + 117);
        for value in [0, 117, 255, 256, 629, 65535] {
            assert_eq!(ShardKey::from_status(value).unwrap().to_status(), value);
        }
        assert_eq!(ShardKey::from_status(-1), None);
        assert_eq!(ShardKey::from_status(65536), None);
    }

    #[test]
    fn hash_is_the_published_fnv1a() {
        // Test vectors of FNV-1a 64: the empty string and "a".
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
    }

    fn arb_pool() -> impl Strategy<Value = (PortSet, StaticBand)> {
        let range = (1u16..=65535, 0u16..2000)
            .prop_map(|(first, len)| PortRange::new(first, first.saturating_add(len)).unwrap());
        let band = prop_oneof![
            Just(StaticBand::Auto),
            Just(StaticBand::None),
            (0u32..3000).prop_map(StaticBand::Count),
        ];
        (prop::collection::vec(range, 1..6), band)
            .prop_map(|(ranges, band)| (PortSet::from_ranges(ranges), band))
    }

    proptest! {
        #[test]
        fn every_pool_port_is_in_exactly_one_shard_of_at_most_256(
            (ports, band) in arb_pool(),
        ) {
            let layout = WindowLayout::new(&ports, band);
            let mut total = 0;
            let mut statics = 0;
            let mut previous: Option<u16> = None;
            for shard in layout.shards() {
                prop_assert!(previous.is_none_or(|p| p < shard.index), "ascending, distinct");
                previous = Some(shard.index);
                prop_assert!(!shard.ports.is_empty() && shard.ports.len() <= WINDOW_PORTS);
                prop_assert!(shard.static_ports <= shard.ports.len());
                for port in shard.ports.iter() {
                    prop_assert!(ports.contains(port));
                    prop_assert_eq!(window_of(port), shard.index);
                    prop_assert!(window(shard.index).contains(port));
                }
                total += shard.ports.len();
                statics += shard.static_ports;
            }
            // Disjoint (one window each) and covering: the sizes add up to the pool's.
            prop_assert_eq!(total, ports.len());
            prop_assert_eq!(statics, band.size_for(ports.len()));
            for port in ports.iter().step_by(37) {
                prop_assert!(layout.shard_of(port).is_some_and(|s| s.ports.contains(port)));
            }
        }

        #[test]
        fn home_order_is_a_permutation_with_dynamic_shards_first(
            (ports, band) in arb_pool(),
            uid in "[0-9a-f-]{1,36}",
        ) {
            let layout = WindowLayout::new(&ports, band);
            let order = layout.home_order(&uid);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            let all: Vec<u16> = layout.shards().iter().map(|s| s.index).collect();
            prop_assert_eq!(sorted, all);
            let first_static = order
                .iter()
                .position(|&i| layout.get(i).is_some_and(WindowSpan::is_static))
                .unwrap_or(order.len());
            prop_assert!(order[first_static..]
                .iter()
                .all(|&i| layout.get(i).is_some_and(WindowSpan::is_static)));
            prop_assert_eq!(order, layout.home_order(&uid));
        }
    }
}

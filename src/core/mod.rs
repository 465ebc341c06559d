//! The pure allocation core: port sets, bands, the held-port bitmap, pool
//! state, holdings and their text form, and the planner. No I/O, no async,
//! no Kubernetes types: everything here is plain data and deterministic
//! given the random number generator passed in.

pub mod alloc_error;
pub mod band;
pub mod bitmap;
pub mod block;
pub mod fragmentation;
pub mod hazards;
pub mod holding;
pub mod placement_policy;
pub mod planner;
pub mod pool_state;
pub mod range;
pub mod reference;

pub use alloc_error::AllocError;
pub use band::{Band, Bands, StaticBand, StaticBandError, auto_static_band_size};
pub use bitmap::PortBitmap;
pub use block::{MAX_BLOCK, PortBlock};
pub use fragmentation::{Fragmentation, RunSummary};
pub use hazards::{DEFAULT_NODE_PORTS, Hazard, LINUX_EPHEMERAL, hazards};
pub use holding::{Holdings, HoldingsError, SlotKey, is_valid_name};
pub use placement_policy::{Lean, Placement};
pub use planner::{Plan, PortDemand, Scope, Want, desired_slots, execute, plan, plan_slots};
pub use pool_state::{BandUsage, PoolState};
pub use range::{MAX_PORT, MIN_PORT, PortRange, PortSet, RangeError};
pub use reference::{
    FormatError, FormatPart, PortForm, Reference, ReferenceSyntaxError, Selector, parse_format,
};

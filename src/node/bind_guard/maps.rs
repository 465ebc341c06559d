//! The guard's six maps, owned: made for this layout, found by their pins, pinned.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use super::{MAP_SPECS, layout};
use crate::node::bind_program::MapFds;
use crate::node::bpf_sys;
use crate::node::guard_pins;

/// The maps, owned.
pub(super) struct Maps {
    pub(super) config: OwnedFd,
    pub(super) modes: OwnedFd,
    pub(super) pods: OwnedFd,
    pub(super) owners: OwnedFd,
    pub(super) claims: OwnedFd,
    pub(super) verdicts: OwnedFd,
}

impl Maps {
    pub(super) fn from_fds(fds: Vec<OwnedFd>) -> Self {
        let [config, modes, pods, owners, claims, verdicts] =
            <[OwnedFd; 6]>::try_from(fds).unwrap_or_else(|_| unreachable!("six maps"));
        Self {
            config,
            modes,
            pods,
            owners,
            claims,
            verdicts,
        }
    }

    pub(super) fn create() -> io::Result<Self> {
        let fds = MAP_SPECS
            .iter()
            .map(|(name, [kind, key, value, max, flags])| {
                bpf_sys::map_create(*kind, *key, *value, *max, *flags, name)
            });
        Ok(Self::from_fds(fds.collect::<io::Result<_>>()?))
    }

    /// The maps pinned in `pins` for this layout, if all are there and have its shapes.
    pub(super) fn pinned(pins: &Path) -> io::Result<Option<Self>> {
        let mut fds = Vec::new();
        for (name, shape) in MAP_SPECS {
            let Some(fd) = guard_pins::open(pins, &guard_pins::map_name(&layout(), name))? else {
                return Ok(None);
            };
            if bpf_sys::map_id_and_shape(fd.as_fd())?.1 != shape {
                return Ok(None);
            }
            fds.push(fd);
        }
        Ok(Some(Self::from_fds(fds)))
    }

    pub(super) fn all(&self) -> [&OwnedFd; 6] {
        [
            &self.config,
            &self.modes,
            &self.pods,
            &self.owners,
            &self.claims,
            &self.verdicts,
        ]
    }

    pub(super) fn pin(&self, pins: &Path) -> io::Result<()> {
        for ((name, _), fd) in MAP_SPECS.iter().zip(self.all()) {
            guard_pins::pin(fd, pins, &guard_pins::map_name(&layout(), name))?;
        }
        Ok(())
    }

    pub(super) fn fds(&self) -> MapFds {
        MapFds {
            config: self.config.as_raw_fd(),
            modes: self.modes.as_raw_fd(),
            pods: self.pods.as_raw_fd(),
            owners: self.owners.as_raw_fd(),
            claims: self.claims.as_raw_fd(),
            verdicts: self.verdicts.as_raw_fd(),
        }
    }
}

//! The guard's links as found pinned in its directory (with the program each runs and the
//! cgroup it is on), the pins' upkeep, and the programs of earlier releases attached without a
//! link.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::{MAP_SPECS, PROGRAMS, layout};
use crate::node::{bpf_sys, guard_pins};

/// One of the guard's links as found pinned: the link, the cgroup it is on, and the version
/// of the program it runs (`None`: a program this agent did not pin).
pub(super) struct FoundLink {
    pub link: OwnedFd,
    pub cgroup_id: u64,
    pub running: Option<(String, OwnedFd)>,
}

/// The guard's links pinned in `pins`, IPv4's and IPv6's, each with the cgroup it is on and the
/// pinned program it runs. Pins of a link under an older name (an upgrade cut short) are the
/// same link.
pub(super) fn find_links(pins: &Path) -> io::Result<[Option<FoundLink>; 2]> {
    let names = guard_pins::names(pins)?;
    let mut found = [None, None];
    for (slot, (_, family, attach_type)) in found.iter_mut().zip(PROGRAMS) {
        let link_prefix = format!("link{family}");
        let prog_prefix = format!("prog{family}");
        let Some(link_name) = names
            .iter()
            .find(|n| guard_pins::version_of(n, &link_prefix).is_some())
        else {
            continue;
        };
        let Some(link) = guard_pins::open(pins, link_name)? else {
            continue;
        };
        let info = bpf_sys::link_info(link.as_fd())?;
        if info.attach_type != attach_type && info.cgroup_id != 0 {
            continue;
        }
        let mut running = None;
        for name in &names {
            let Some(version) = guard_pins::version_of(name, &prog_prefix) else {
                continue;
            };
            if let Some(prog) = guard_pins::open(pins, name)?
                && bpf_sys::prog_info(prog.as_fd())?.id == info.prog_id
            {
                running = Some((version.to_string(), prog));
            }
        }
        *slot = Some(FoundLink {
            link,
            cgroup_id: info.cgroup_id,
            running,
        });
    }
    Ok(found)
}

/// Remove every pin in `pins` (links and programs go with their last holder).
pub(super) fn clear(pins: &Path) -> io::Result<()> {
    for name in guard_pins::names(pins)? {
        guard_pins::unpin(pins, &name)?;
    }
    Ok(())
}

/// Remove the pins that are not this version's or this layout's.
pub(super) fn tidy(pins: &Path, version: &str) -> io::Result<()> {
    let mut keep: BTreeSet<String> = MAP_SPECS
        .iter()
        .map(|(name, _)| guard_pins::map_name(&layout(), name))
        .collect();
    for (_, family, _) in PROGRAMS {
        keep.insert(guard_pins::prog_name(family, version));
        keep.insert(guard_pins::link_name(family, version));
    }
    for name in guard_pins::names(pins)? {
        if !keep.contains(&name) {
            guard_pins::unpin(pins, &name)?;
        }
    }
    Ok(())
}

/// Detach the guard's programs attached to `cgroup` without a link (by an agent of an earlier
/// release), found by name: opening a program by id needs CAP_SYS_ADMIN, so without it this
/// fails with EPERM.
pub(super) fn detach_unlinked(cgroup: BorrowedFd<'_>) -> io::Result<usize> {
    let mut detached = 0;
    for (name, _, attach_type) in PROGRAMS {
        for id in bpf_sys::prog_query(cgroup, attach_type)? {
            let prog = bpf_sys::prog_by_id(id)?;
            if bpf_sys::prog_info(prog.as_fd())?.name != name {
                continue;
            }
            // A program attached through a link is not detached this way (ENOENT).
            match bpf_sys::prog_detach(cgroup, prog.as_fd(), attach_type) {
                Ok(()) => detached += 1,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(detached)
}

//! Where the bind guard's kernel objects are pinned, and under which names. Each node cgroup
//! root has a directory of its own below the agent's bpffs directory (`--bpf-dir`), holding:
//!
//! - `map_<layout>_<name>`: the six maps, `<layout>` a hash of their shapes, so an agent whose
//!   maps differ does not read a layout it does not know;
//! - `prog4_<version>`, `prog6_<version>`: the programs, `<version>` a hash of their
//!   instructions, pinned so an upgrade can name the program it replaces;
//! - `link4_<version>`, `link6_<version>`: the cgroup links, named after the program they run.
//!
//! Pins outlive the agent (until a reboot), so a restarted agent opens them again with file
//! access alone, where taking programs over by id would need CAP_SYS_ADMIN. bpffs refuses dots
//! in names, hence the underscores.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::bpf_insn::Insn;
use super::bpf_sys;

/// bpffs' `f_type` (linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// What bpffs the agent needs, said when the directory is not on one.
pub const MOUNT_HINT: &str = "mount -t bpf bpf /sys/fs/bpf";

/// A 64-bit FNV-1a hash: stable across builds and Rust releases, unlike the standard hasher.
fn fnv(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The program's version: a hash of its instructions as assembled with placeholder map
/// descriptors (the real ones differ at every load).
pub fn program_version(insns: &[Insn]) -> String {
    let bytes = insns.iter().flat_map(|i| {
        let mut b = [0u8; 8];
        b[0] = i.code;
        b[1] = i.regs;
        b[2..4].copy_from_slice(&i.off.to_le_bytes());
        b[4..].copy_from_slice(&i.imm.to_le_bytes());
        b
    });
    format!("{:016x}", fnv(bytes))
}

/// The maps' layout version: a hash of each map's name and shape.
pub fn layout_version<'a>(shapes: impl IntoIterator<Item = (&'a str, [u32; 5])>) -> String {
    let bytes = shapes.into_iter().flat_map(|(name, shape)| {
        let mut b = name.as_bytes().to_vec();
        b.push(0);
        b.extend(shape.iter().flat_map(|v| v.to_le_bytes()));
        b
    });
    format!("{:08x}", fnv(bytes) as u32)
}

/// The pin directory of the node cgroup `kubepods` below `bpf_dir`: one per cgroup root, as
/// several agents (tests, or nodes sharing a host) may share one bpffs.
pub fn pin_dir(bpf_dir: &Path, kubepods: &Path) -> PathBuf {
    let name: String = kubepods
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    bpf_dir.join(if name.is_empty() { "_".into() } else { name })
}

/// Whether `path` lies on a bpffs.
pub fn is_bpffs(path: &Path) -> bool {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `statfs` writes into the zeroed struct we own; the path is NUL-terminated.
    unsafe {
        let mut stat: libc::statfs = std::mem::zeroed();
        libc::statfs(c_path.as_ptr(), &mut stat) == 0 && stat.f_type as i64 == BPF_FS_MAGIC
    }
}

/// Make `pins`, provided its nearest existing ancestor is on a bpffs: the directory is never
/// created elsewhere, where pinning would fail anyway. `Ok(false)`: not on a bpffs.
pub fn prepare(pins: &Path) -> io::Result<bool> {
    let existing = pins
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if !is_bpffs(existing) {
        return Ok(false);
    }
    fs::create_dir_all(pins)?;
    Ok(true)
}

pub fn map_name(layout: &str, name: &str) -> String {
    format!("map_{layout}_{name}")
}

pub fn prog_name(family: &str, version: &str) -> String {
    format!("prog{family}_{version}")
}

pub fn link_name(family: &str, version: &str) -> String {
    format!("link{family}_{version}")
}

/// The names in `pins` (none if it does not exist).
pub fn names(pins: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(pins) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// The version in a pin's name, if it is `<prefix>_<version>`.
pub fn version_of<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    name.strip_prefix(prefix)?.strip_prefix('_')
}

/// Open the object pinned at `pins/name`; `None` if nothing is.
pub fn open(pins: &Path, name: &str) -> io::Result<Option<OwnedFd>> {
    match bpf_sys::obj_get(&pins.join(name)) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Pin `fd` at `pins/name`, in place of whatever was pinned there.
pub fn pin(fd: &OwnedFd, pins: &Path, name: &str) -> io::Result<()> {
    unpin(pins, name)?;
    bpf_sys::obj_pin(fd.as_fd(), &pins.join(name))
}

/// Remove the pin `pins/name` (the object goes when nothing else holds it).
pub fn unpin(pins: &Path, name: &str) -> io::Result<()> {
    match fs::remove_file(pins.join(name)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_directory_is_one_name_without_dots_per_cgroup_root() {
        let dir = pin_dir(
            Path::new("/sys/fs/bpf/kubectl-portalloc"),
            Path::new("/host/cgroup/kubepods.slice"),
        );
        assert_eq!(
            dir,
            Path::new("/sys/fs/bpf/kubectl-portalloc/host_cgroup_kubepods_slice")
        );
        assert_ne!(
            pin_dir(Path::new("/b"), Path::new("/a/kubepods")),
            pin_dir(Path::new("/b"), Path::new("/c/kubepods"))
        );
    }

    #[test]
    fn versions_change_with_the_instructions_and_the_shapes() {
        let insn = |imm| Insn {
            code: 0xb7,
            regs: 0,
            off: 0,
            imm,
        };
        let a = program_version(&[insn(0), insn(1)]);
        assert_eq!(a, program_version(&[insn(0), insn(1)]));
        assert_ne!(a, program_version(&[insn(0), insn(2)]));
        assert_eq!(a.len(), 16);
        let shape = [1, 4, 8, 16, 0];
        let layout = layout_version([("owners", shape)]);
        assert_ne!(layout, layout_version([("owners", [1, 4, 8, 32, 0])]));
        assert_ne!(layout, layout_version([("claims", shape)]));
        assert!(!map_name(&layout, "owners").contains('.'));
        assert_eq!(version_of("link4_abc", "link4"), Some("abc"));
        assert_eq!(version_of("link6_abc", "link4"), None);
    }
}

//! The guard's two programs taken off `kubepods` and put back, in microseconds: the bind cell
//! alternates without and with the guard many times, and attaching it afresh (new maps, the
//! verifier, 196,608 mode slots read) would take longer than a block of binds. The guard's own
//! pinned links are detached once; from then on the benchmark holds a descriptor of each
//! program (keeping it loaded) and links it to the cgroup or drops the link. The maps stay the
//! guard's. Raw `bpf(2)` calls: the library's are private to it, and the benchmark needs only
//! these five.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_CGROUP_INET4_BIND: u32 = 8;
const BPF_CGROUP_INET6_BIND: u32 = 9;

/// `union bpf_attr`, as the words these commands use.
#[repr(C, align(8))]
#[derive(Default)]
struct Attr([u32; 32]);

fn bpf(command: libc::c_long, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: `attr` is a zeroed `union bpf_attr` of the size passed, filled for `command`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The bind programs attached to one cgroup, which can be detached and attached again.
pub struct Programs {
    cgroup: File,
    /// (attach type, program).
    programs: Vec<(u32, OwnedFd)>,
    /// The guard's pinned links, detached at the first `set(false)`.
    pinned: Vec<PathBuf>,
    /// The links this benchmark made: dropping one detaches its program.
    links: Vec<OwnedFd>,
    attached: bool,
}

fn pointer_words(attr: &mut Attr, at: usize, pointer: u64) {
    attr.0[at] = pointer as u32;
    attr.0[at + 1] = (pointer >> 32) as u32;
}

impl Programs {
    /// The programs attached to `cgroup` for bind4 and bind6 (the guard's: nothing else
    /// attaches to the benchmark's own tree), and the guard's links pinned in `pins`.
    pub fn of(cgroup: &Path, pins: &Path) -> io::Result<Programs> {
        let cgroup = File::open(cgroup)?;
        let mut programs = Vec::new();
        for attach_type in [BPF_CGROUP_INET4_BIND, BPF_CGROUP_INET6_BIND] {
            let mut ids = [0u32; 8];
            let mut attr = Attr::default();
            attr.0[0] = cgroup.as_raw_fd() as u32;
            attr.0[1] = attach_type;
            pointer_words(&mut attr, 4, ids.as_mut_ptr() as u64);
            attr.0[6] = ids.len() as u32;
            bpf(BPF_PROG_QUERY, &mut attr)?;
            for &id in &ids[..attr.0[6] as usize] {
                let mut attr = Attr::default();
                attr.0[0] = id;
                let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
                // SAFETY: the kernel just returned this descriptor to us.
                programs.push((attach_type, unsafe { OwnedFd::from_raw_fd(fd as i32) }));
            }
        }
        let mut pinned = Vec::new();
        for entry in std::fs::read_dir(pins)? {
            let path = entry?.path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("link"))
            {
                pinned.push(path);
            }
        }
        Ok(Programs {
            cgroup,
            programs,
            pinned,
            links: Vec::new(),
            attached: true,
        })
    }

    pub fn len(&self) -> usize {
        self.programs.len()
    }

    /// Attach (`on`) or detach every program.
    pub fn set(&mut self, on: bool) -> io::Result<()> {
        if on == self.attached {
            return Ok(());
        }
        if on {
            for (attach_type, program) in &self.programs {
                let mut attr = Attr::default();
                attr.0[0] = program.as_raw_fd() as u32;
                attr.0[1] = self.cgroup.as_raw_fd() as u32;
                attr.0[2] = *attach_type;
                let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
                // SAFETY: the kernel just returned this descriptor to us.
                self.links.push(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            }
        } else {
            for pin in std::mem::take(&mut self.pinned) {
                let path = std::ffi::CString::new(pin.as_os_str().as_encoded_bytes())?;
                let mut attr = Attr::default();
                pointer_words(&mut attr, 0, path.as_ptr() as u64);
                let fd = bpf(BPF_OBJ_GET, &mut attr)?;
                // SAFETY: the kernel just returned this descriptor to us.
                let link = unsafe { OwnedFd::from_raw_fd(fd as i32) };
                let mut attr = Attr::default();
                attr.0[0] = link.as_raw_fd() as u32;
                bpf(BPF_LINK_DETACH, &mut attr)?;
            }
            self.links.clear();
        }
        self.attached = on;
        Ok(())
    }
}

impl Drop for Programs {
    /// Detached for good: with the last descriptor gone, the kernel frees them.
    fn drop(&mut self) {
        let _ = self.set(false);
    }
}

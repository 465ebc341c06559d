//! The guard's two programs taken off `kubepods` and put back, in microseconds: the bind cell
//! alternates without and with the guard many times, and attaching it afresh (new maps, the
//! verifier, 196,608 mode slots read) would take longer than a block of binds. Holding a
//! descriptor of each program keeps it loaded while detached; the maps stay the guard's. Raw
//! `bpf(2)` calls: the library's are private to it, and the benchmark needs only these four.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_CGROUP_INET4_BIND: u32 = 8;
const BPF_CGROUP_INET6_BIND: u32 = 9;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// `union bpf_attr`, as the words the four commands use.
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
    attached: bool,
}

impl Programs {
    /// The programs attached to `cgroup` for bind4 and bind6 (the guard's: nothing else
    /// attaches to the benchmark's own tree).
    pub fn of(cgroup: &Path) -> io::Result<Programs> {
        let cgroup = File::open(cgroup)?;
        let mut programs = Vec::new();
        for attach_type in [BPF_CGROUP_INET4_BIND, BPF_CGROUP_INET6_BIND] {
            let mut ids = [0u32; 8];
            let mut attr = Attr::default();
            attr.0[0] = cgroup.as_raw_fd() as u32;
            attr.0[1] = attach_type;
            let pointer = ids.as_mut_ptr() as u64;
            attr.0[4] = pointer as u32;
            attr.0[5] = (pointer >> 32) as u32;
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
        Ok(Programs {
            cgroup,
            programs,
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
        for (attach_type, program) in &self.programs {
            let mut attr = Attr::default();
            attr.0[0] = self.cgroup.as_raw_fd() as u32;
            attr.0[1] = program.as_raw_fd() as u32;
            attr.0[2] = *attach_type;
            if on {
                attr.0[3] = BPF_F_ALLOW_MULTI;
                bpf(BPF_PROG_ATTACH, &mut attr)?;
            } else {
                bpf(BPF_PROG_DETACH, &mut attr)?;
            }
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

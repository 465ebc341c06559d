//! The `bpf(2)` system call, for the handful of commands the bind guard needs: maps (create,
//! read, write, walk), loading a program, linking it to a cgroup (and replacing a link's
//! program), pinning objects in bpffs and opening them again by path (so a restarted agent
//! takes over its maps instead of opening a gap, with file access alone), and finding the
//! programs an agent of an earlier release attached without a link.
//! Offsets are those of `union bpf_attr` and `struct bpf_prog_info` in linux/bpf.h, which the
//! kernel keeps stable.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::bpf_insn::Insn;

const MAP_CREATE: i64 = 0;
const MAP_LOOKUP_ELEM: i64 = 1;
const MAP_UPDATE_ELEM: i64 = 2;
const MAP_DELETE_ELEM: i64 = 3;
const MAP_GET_NEXT_KEY: i64 = 4;
const PROG_LOAD: i64 = 5;
const OBJ_PIN: i64 = 6;
const OBJ_GET: i64 = 7;
const PROG_DETACH: i64 = 9;
const PROG_GET_FD_BY_ID: i64 = 13;
const OBJ_GET_INFO_BY_FD: i64 = 15;
const PROG_QUERY: i64 = 16;
const MAP_LOOKUP_AND_DELETE_ELEM: i64 = 21;
const LINK_CREATE: i64 = 28;
const LINK_UPDATE: i64 = 29;
const LINK_DETACH: i64 = 34;

pub const MAP_TYPE_HASH: u32 = 1;
pub const MAP_TYPE_ARRAY: u32 = 2;
/// Allocate hash entries when written, not all at creation.
pub const F_NO_PREALLOC: u32 = 1;
/// `LINK_UPDATE`: only if the link still runs `old_prog_fd` (a racing writer fails it).
const F_REPLACE: u32 = 4;
pub const PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
pub const CGROUP_INET4_BIND: u32 = 8;
pub const CGROUP_INET6_BIND: u32 = 9;
/// `map_update`: create the entry or replace it, whichever applies.
pub const ANY: u64 = 0;

/// `union bpf_attr`: 144 bytes on kernels of this decade; a smaller size is accepted by newer
/// kernels, provided the rest would be zero.
#[repr(C, align(8))]
struct Attr([u8; 144]);

impl Attr {
    fn new() -> Self {
        Self([0; 144])
    }

    fn u32(&mut self, off: usize, value: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&value.to_ne_bytes());
        self
    }

    fn u64(&mut self, off: usize, value: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&value.to_ne_bytes());
        self
    }

    fn name(&mut self, off: usize, name: &str) -> &mut Self {
        let bytes = name.as_bytes();
        let len = bytes.len().min(15);
        self.0[off..off + len].copy_from_slice(&bytes[..len]);
        self
    }

    fn read_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().expect("4 bytes"))
    }
}

fn sys_bpf(cmd: i64, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: `attr` is a valid, initialised `union bpf_attr` of the size passed; every pointer
    // placed in it points to memory that outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            std::mem::size_of::<Attr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn owned_fd(ret: i64) -> OwnedFd {
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(ret as i32) }
}

fn raw(fd: BorrowedFd<'_>) -> u32 {
    fd.as_raw_fd() as u32
}

/// `name` is cut to 15 bytes: the kernel keeps 16 with the NUL.
pub fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.u32(0, map_type)
        .u32(4, key_size)
        .u32(8, value_size)
        .u32(12, max_entries)
        .u32(16, flags)
        .name(28, name);
    sys_bpf(MAP_CREATE, &mut attr).map(owned_fd)
}

fn elem(map: BorrowedFd<'_>, key: &[u8], value: *const u8, flags: u64) -> Attr {
    let mut attr = Attr::new();
    attr.u32(0, raw(map))
        .u64(8, key.as_ptr() as u64)
        .u64(16, value as u64)
        .u64(24, flags);
    attr
}

/// `flags` as the kernel takes them: [`ANY`] is the one the guard uses.
pub fn map_update(map: BorrowedFd<'_>, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    sys_bpf(MAP_UPDATE_ELEM, &mut elem(map, key, value.as_ptr(), flags)).map(drop)
}

/// Read `key` into `value`; `false` when the map has no such key.
pub fn map_lookup(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    absent_is_false(sys_bpf(
        MAP_LOOKUP_ELEM,
        &mut elem(map, key, value.as_mut_ptr(), 0),
    ))
}

/// Read `key` into `value` and delete it, at once; `false` when absent.
pub fn map_take(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    absent_is_false(sys_bpf(
        MAP_LOOKUP_AND_DELETE_ELEM,
        &mut elem(map, key, value.as_mut_ptr(), 0),
    ))
}

/// Delete `key`; `false` when it was not there.
pub fn map_delete(map: BorrowedFd<'_>, key: &[u8]) -> io::Result<bool> {
    absent_is_false(sys_bpf(
        MAP_DELETE_ELEM,
        &mut elem(map, key, std::ptr::null(), 0),
    ))
}

/// Every key of a hash map, each `key_size` bytes. A map written meanwhile may be walked
/// partly twice or lose a key, as the kernel documents; callers read it again next round.
pub fn map_keys(map: BorrowedFd<'_>, key_size: usize) -> io::Result<Vec<Vec<u8>>> {
    let mut keys = Vec::new();
    let mut next = vec![0u8; key_size];
    let mut current: Option<Vec<u8>> = None;
    loop {
        let key_ptr = current.as_ref().map_or(std::ptr::null(), |k| k.as_ptr());
        let mut attr = Attr::new();
        attr.u32(0, raw(map))
            .u64(8, key_ptr as u64)
            .u64(16, next.as_mut_ptr() as u64);
        match sys_bpf(MAP_GET_NEXT_KEY, &mut attr) {
            Ok(_) => {
                keys.push(next.clone());
                current = Some(next.clone());
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(keys),
            Err(e) => return Err(e),
        }
    }
}

fn absent_is_false(result: io::Result<i64>) -> io::Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Why the kernel refused a program: the error and the verifier's log.
#[derive(Debug)]
pub struct LoadError {
    pub error: io::Error,
    pub log: String,
}

/// Load a program. The verifier's log (a 64 KiB buffer) is asked for only on a second try,
/// after a refusal, so that the error can say why.
pub fn prog_load(
    prog_type: u32,
    attach_type: u32,
    insns: &[Insn],
    license: &str,
    name: &str,
) -> Result<OwnedFd, LoadError> {
    let license = std::ffi::CString::new(license).expect("license has no NUL");
    let try_load = |log: &mut Vec<u8>, level: u32| {
        let mut attr = Attr::new();
        attr.u32(0, prog_type)
            .u32(4, insns.len() as u32)
            .u64(8, insns.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .u32(24, level)
            .u32(28, log.len() as u32)
            .u64(32, log.as_mut_ptr() as u64)
            .name(48, name)
            .u32(68, attach_type);
        sys_bpf(PROG_LOAD, &mut attr).map(owned_fd)
    };
    let mut no_log = Vec::new();
    try_load(&mut no_log, 0).or_else(|error| {
        let mut log = vec![0u8; 1 << 16];
        match try_load(&mut log, 1) {
            Ok(fd) => Ok(fd),
            Err(_) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                Err(LoadError {
                    error,
                    log: String::from_utf8_lossy(&log[..end]).into_owned(),
                })
            }
        }
    })
}

/// For a program attached without a link: one attached through a link is refused (ENOENT).
pub fn prog_detach(
    cgroup: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.u32(0, raw(cgroup))
        .u32(4, raw(prog))
        .u32(8, attach_type);
    sys_bpf(PROG_DETACH, &mut attr).map(drop)
}

/// The ids of the programs attached to `cgroup` itself at `attach_type`.
pub fn prog_query(cgroup: BorrowedFd<'_>, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    let mut attr = Attr::new();
    attr.u32(0, raw(cgroup))
        .u32(4, attach_type)
        .u64(16, ids.as_mut_ptr() as u64)
        .u32(24, ids.len() as u32);
    sys_bpf(PROG_QUERY, &mut attr)?;
    ids.truncate(attr.read_u32(24) as usize);
    Ok(ids)
}

pub fn prog_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.u32(0, id);
    sys_bpf(PROG_GET_FD_BY_ID, &mut attr).map(owned_fd)
}

/// A loaded program's id and name.
pub struct ProgInfo {
    pub id: u32,
    pub name: String,
}

pub fn prog_info(prog: BorrowedFd<'_>) -> io::Result<ProgInfo> {
    let mut info = [0u8; 232];
    obj_info(prog, &mut info)?;
    Ok(ProgInfo {
        id: u32::from_ne_bytes(info[4..8].try_into().expect("4 bytes")),
        name: c_name(&info[64..80]),
    })
}

/// A map's id and its shape: type, key and value sizes, entries, flags.
pub fn map_id_and_shape(map: BorrowedFd<'_>) -> io::Result<(u32, [u32; 5])> {
    let mut info = [0u8; 88];
    obj_info(map, &mut info)?;
    let at = |off: usize| u32::from_ne_bytes(info[off..off + 4].try_into().expect("4 bytes"));
    Ok((at(4), [at(0), at(8), at(12), at(16), at(20)]))
}

/// Link `prog` to the cgroup `cgroup` at `attach_type`. The link lives while a descriptor or a
/// pin holds it: pinned, it outlives the agent, and the program keeps guarding.
pub fn link_create(
    cgroup: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.u32(0, raw(prog))
        .u32(4, raw(cgroup))
        .u32(8, attach_type);
    sys_bpf(LINK_CREATE, &mut attr).map(owned_fd)
}

/// Make `link` run `new` instead of `old`; refused (EPERM) if it no longer runs `old`.
pub fn link_update(
    link: BorrowedFd<'_>,
    new: BorrowedFd<'_>,
    old: BorrowedFd<'_>,
) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.u32(0, raw(link))
        .u32(4, raw(new))
        .u32(8, F_REPLACE)
        .u32(12, raw(old));
    sys_bpf(LINK_UPDATE, &mut attr).map(drop)
}

/// Detach `link` from its cgroup now, whoever else holds it.
pub fn link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.u32(0, raw(link));
    sys_bpf(LINK_DETACH, &mut attr).map(drop)
}

/// A cgroup link: its program's id, and the cgroup it is attached to (0: none any more,
/// detached or the cgroup removed).
pub struct LinkInfo {
    pub prog_id: u32,
    pub cgroup_id: u64,
    pub attach_type: u32,
}

pub fn link_info(link: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    let mut info = [0u8; 64];
    obj_info(link, &mut info)?;
    Ok(LinkInfo {
        prog_id: u32::from_ne_bytes(info[8..12].try_into().expect("4 bytes")),
        cgroup_id: u64::from_ne_bytes(info[16..24].try_into().expect("8 bytes")),
        attach_type: u32::from_ne_bytes(info[24..28].try_into().expect("4 bytes")),
    })
}

/// Pin `fd` (a map, program or link) at `path` on a bpffs, where it outlives the process.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &std::path::Path) -> io::Result<()> {
    let path = c_path(path)?;
    let mut attr = Attr::new();
    attr.u64(0, path.as_ptr() as u64).u32(8, raw(fd));
    sys_bpf(OBJ_PIN, &mut attr).map(drop)
}

/// A descriptor of the object pinned at `path`: how a restarted agent takes its maps and
/// links over.
pub fn obj_get(path: &std::path::Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let mut attr = Attr::new();
    attr.u64(0, path.as_ptr() as u64);
    sys_bpf(OBJ_GET, &mut attr).map(owned_fd)
}

fn c_path(path: &std::path::Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

fn obj_info(fd: BorrowedFd<'_>, info: &mut [u8]) -> io::Result<()> {
    let mut attr = Attr::new();
    attr.u32(0, raw(fd))
        .u32(4, info.len() as u32)
        .u64(8, info.as_mut_ptr() as u64);
    sys_bpf(OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
}

fn c_name(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

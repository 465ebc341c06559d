//! The node: what the node agent (`kubectl portalloc node-agent`) changes in the kernel of the
//! node it runs on, beside [`crate::k8s`] as the layer that talks to the kernel rather than the
//! API server. Decisions come from [`crate::ledger`]; nothing here reads the API.
//!
//! - [`reserved_ports`]: every pool's ports out of the kernel's ephemeral choice.
//! - [`bind_guard`]: a cgroup BPF program that lets only a port's holder bind it.
//! - [`cgroups`]: pods' cgroups as kubelet lays them out.

pub mod bind_guard;
pub mod bind_program;
mod bpf_insn;
mod bpf_sys;
pub mod cgroups;
pub mod guard_pins;
pub mod listeners;
pub mod reserved_ports;

use std::io;

/// `SO_NETNS_COOKIE` (asm-generic/socket.h; the same on x86 and arm).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The cookie of the network namespace this process runs in, as BPF programs see it
/// (`SO_NETNS_COOKIE`, Linux 5.14+).
pub fn netns_cookie() -> io::Result<u64> {
    // SAFETY: a plain socket, closed below; getsockopt writes at most `len` bytes into `cookie`.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cookie: u64 = 0;
        let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
        let ret = libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        );
        let error = io::Error::last_os_error();
        libc::close(fd);
        if ret < 0 { Err(error) } else { Ok(cookie) }
    }
}

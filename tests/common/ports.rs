//! Free TCP ports for the processes the tests start: the kernel's choice of a port nobody
//! listens on now (the listener is closed before the port is returned, so a process started
//! next can bind it).
//!
//! A port is handed out once per test process: the kernel may choose a just-closed port again,
//! and two ports asked for one command (a webhook's address and its probe address) then
//! collided, and the command failed with "Address already in use".

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Every port [`free_port_on`] returned in this process.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port free now.
pub fn free_port() -> u16 {
    free_port_on(Ipv4Addr::LOCALHOST)
}

/// A port free now at `ip`, an address of this machine, and not returned before.
pub fn free_port_on(ip: Ipv4Addr) -> u16 {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    loop {
        let port = TcpListener::bind((ip, 0))
            .and_then(|listener| listener.local_addr())
            .unwrap_or_else(|e| panic!("no free port at {ip}: {e}"))
            .port();
        if handed_out.insert(port) {
            return port;
        }
    }
}

//! Free TCP ports for the processes the tests start: the kernel's choice of a port nobody
//! listens on now (the listener is closed before the port is returned, so a process started
//! next can bind it).

use std::net::{Ipv4Addr, TcpListener};

/// A loopback port free now.
pub fn free_port() -> u16 {
    free_port_on(Ipv4Addr::LOCALHOST)
}

/// A port free now at `ip`, an address of this machine.
pub fn free_port_on(ip: Ipv4Addr) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|listener| listener.local_addr())
        .unwrap_or_else(|e| panic!("no free port at {ip}: {e}"))
        .port()
}

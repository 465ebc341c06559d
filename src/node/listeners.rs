//! Sockets already listening in the node's network namespace (`/proc/net/tcp`, `tcp6`, `udp`,
//! `udp6`): a pool port one of them holds is a port the pool's holder will fail to bind.

use std::fs;

use crate::api::Protocol;

/// A listening TCP socket or a bound UDP one: its protocol, port and owner's user id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listener {
    pub protocol: Protocol,
    pub port: u16,
    pub uid: u32,
}

/// TCP_LISTEN and, for UDP, TCP_CLOSE: how the kernel prints a listening or merely bound socket.
const TCP_LISTEN: &str = "0A";
const UDP_BOUND: &str = "07";

/// Every listener of this network namespace; tables that cannot be read are skipped (a kernel
/// without IPv6 has no `tcp6`).
pub fn listeners() -> Vec<Listener> {
    let mut found = Vec::new();
    for (table, protocol, state) in [
        ("tcp", Protocol::Tcp, TCP_LISTEN),
        ("tcp6", Protocol::Tcp, TCP_LISTEN),
        ("udp", Protocol::Udp, UDP_BOUND),
        ("udp6", Protocol::Udp, UDP_BOUND),
    ] {
        if let Ok(text) = fs::read_to_string(format!("/proc/net/{table}")) {
            found.extend(parse(&text, protocol, state));
        }
    }
    found
}

/// The sockets of one `/proc/net` table in `state`.
pub fn parse(text: &str, protocol: Protocol, state: &str) -> Vec<Listener> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, st, uid) = (fields.get(1)?, fields.get(3)?, fields.get(7)?);
            if *st != state {
                return None;
            }
            let port = u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()?;
            Some(Listener {
                protocol,
                port,
                uid: uid.parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_are_read_from_the_kernel_s_table() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 20539 1 0000000000000000 100 0 0 10 0
   1: 0100007F:75A2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 0 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse(tcp, Protocol::Tcp, TCP_LISTEN),
            vec![Listener {
                protocol: Protocol::Tcp,
                port: 22,
                uid: 0
            }]
        );
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:2710 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   101        0 1 1";
        assert_eq!(parse(tcp6, Protocol::Tcp, TCP_LISTEN)[0].port, 10000);
    }
}

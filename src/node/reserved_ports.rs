//! `net.ipv4.ip_local_reserved_ports` of the network namespace the agent runs in (the node's, as
//! a hostNetwork pod's): ports the kernel never picks for an outgoing connection or a bind of
//! port 0, for TCP, UDP and SCTP, IPv4 and IPv6 alike. Binding them by number still works.
//!
//! The agent adds every pool's ports and remembers which entries it added in a file of its own
//! (kept on the node's `/run`, which a reboot clears as it clears the setting), so it removes
//! only those: entries someone else put there stay, whether or not a pool covers them.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub const SYSCTL: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";
/// The ephemeral range, beside it (`net.ipv4.ip_local_port_range`: "FIRST\tLAST").
const PORT_RANGE: &str = "ip_local_port_range";

/// The setting's text (`"8080,30000-30099"`) as ports.
pub fn parse(text: &str) -> Result<BTreeSet<u16>, String> {
    let mut ports = BTreeSet::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (first, last) = item.split_once('-').unwrap_or((item, item));
        let port = |s: &str| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| format!("{item:?} in {SYSCTL} is not a port or range"))
        };
        let (first, last) = (port(first)?, port(last)?);
        if first > last {
            return Err(format!("{item:?} in {SYSCTL} runs backwards"));
        }
        ports.extend(first..=last);
    }
    Ok(ports)
}

/// Ports as the setting's text: ascending ranges, as the kernel prints it.
pub fn format(ports: &BTreeSet<u16>) -> String {
    let mut runs: Vec<(u16, u16)> = Vec::new();
    for &port in ports {
        match runs.last_mut() {
            Some((_, last)) if u32::from(*last) + 1 == u32::from(port) => *last = port,
            _ => runs.push((port, port)),
        }
    }
    runs.iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// What to write, given what the setting holds, which of its entries the agent added before,
/// and the ports every pool has now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The setting's new value.
    pub reserved: BTreeSet<u16>,
    /// The entries that are the agent's: pool ports nobody else had reserved.
    pub ours: BTreeSet<u16>,
}

pub fn plan(
    current: &BTreeSet<u16>,
    ours_before: &BTreeSet<u16>,
    pools: &BTreeSet<u16>,
) -> Reservation {
    let others: BTreeSet<u16> = current.difference(ours_before).copied().collect();
    let ours: BTreeSet<u16> = pools.difference(&others).copied().collect();
    Reservation {
        reserved: others.union(&ours).copied().collect(),
        ours,
    }
}

/// The setting and the agent's record of its own entries, on one node.
pub struct ReservedPorts {
    sysctl: PathBuf,
    state: PathBuf,
}

impl ReservedPorts {
    /// The setting of this network namespace, with the agent's record in `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self::at(Path::new(SYSCTL), state_dir)
    }

    /// For tests: another file in place of the setting.
    pub fn at(sysctl: &Path, state_dir: &Path) -> Self {
        Self {
            sysctl: sysctl.to_path_buf(),
            state: state_dir.join("reserved-ports"),
        }
    }

    /// The ephemeral range of the same network namespace, from the file beside the setting.
    pub fn ephemeral_range(&self) -> io::Result<(u16, u16)> {
        let path = self
            .sysctl
            .parent()
            .unwrap_or(Path::new("/proc/sys/net/ipv4"))
            .join(PORT_RANGE);
        let path = if path.exists() {
            path
        } else {
            Path::new("/proc/sys/net/ipv4").join(PORT_RANGE)
        };
        let text = fs::read_to_string(&path)?;
        let mut numbers = text.split_whitespace().map(str::parse::<u16>);
        match (numbers.next(), numbers.next()) {
            (Some(Ok(first)), Some(Ok(last))) if first <= last => Ok((first, last)),
            _ => Err(io::Error::other(format!(
                "{} holds {:?}, not two ports",
                path.display(),
                text.trim()
            ))),
        }
    }

    pub fn current(&self) -> io::Result<BTreeSet<u16>> {
        parse(&fs::read_to_string(&self.sysctl)?).map_err(io::Error::other)
    }

    fn ours(&self) -> io::Result<BTreeSet<u16>> {
        match fs::read_to_string(&self.state) {
            Ok(text) => parse(&text).map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(BTreeSet::new()),
            Err(e) => Err(e),
        }
    }

    fn save_ours(&self, ours: &BTreeSet<u16>) -> io::Result<()> {
        if let Some(dir) = self.state.parent() {
            fs::create_dir_all(dir)?;
        }
        let tmp = self.state.with_extension("tmp");
        fs::write(&tmp, format(ours))?;
        fs::rename(&tmp, &self.state)
    }

    /// Reserve exactly `pools` (plus whatever others reserved). The record first names both
    /// the old and the new entries, so an agent killed between the two writes still knows
    /// every entry it may have added.
    pub fn apply(&self, pools: &BTreeSet<u16>) -> io::Result<Reservation> {
        let current = self.current()?;
        let ours_before = self.ours()?;
        let next = plan(&current, &ours_before, pools);
        if next.reserved != current {
            self.save_ours(&ours_before.union(&next.ours).copied().collect())?;
            // With a newline: an empty write would leave the setting as it was.
            fs::write(&self.sysctl, format!("{}\n", format(&next.reserved)))?;
        }
        if next.ours != ours_before {
            self.save_ours(&next.ours)?;
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> BTreeSet<u16> {
        parse(text).unwrap()
    }

    #[test]
    fn text_round_trips_as_the_kernel_prints_it() {
        assert_eq!(
            format(&set("8080, 30000-30002,30003,9")),
            "9,8080,30000-30003"
        );
        assert_eq!(format(&set("")), "");
        assert_eq!(format(&set("65535")), "65535");
        assert!(parse("10-5").is_err());
        assert!(parse("x").is_err());
        assert!(parse("70000").is_err());
    }

    #[test]
    fn entries_of_others_stay_and_only_ours_go() {
        // Someone reserved 8080 and 30005; a pool covers 30000-30009.
        let first = plan(&set("8080,30005"), &set(""), &set("30000-30009"));
        assert_eq!(format(&first.reserved), "8080,30000-30009");
        assert_eq!(format(&first.ours), "30000-30004,30006-30009");
        // The pool is deleted: 30005 was never ours, so it stays.
        let gone = plan(&first.reserved, &first.ours, &set(""));
        assert_eq!(format(&gone.reserved), "8080,30005");
        assert!(gone.ours.is_empty());
    }

    #[test]
    fn apply_keeps_its_record_across_runs() {
        let dir = tempfile::tempdir().unwrap();
        let sysctl = dir.path().join("sysctl");
        fs::write(&sysctl, "22\n").unwrap();
        let reserved = ReservedPorts::at(&sysctl, &dir.path().join("state"));
        reserved.apply(&set("30000-30002")).unwrap();
        assert_eq!(fs::read_to_string(&sysctl).unwrap(), "22,30000-30002\n");
        // A second agent (a restart) reads the record and removes only its entries.
        let restarted = ReservedPorts::at(&sysctl, &dir.path().join("state"));
        restarted.apply(&set("30001")).unwrap();
        assert_eq!(fs::read_to_string(&sysctl).unwrap(), "22,30001\n");
    }
}

//! `net.ipv4.ip_local_reserved_ports` of the network namespace the agent runs in (the node's, as
//! a hostNetwork pod's): ports the kernel never picks for an outgoing connection or a bind of
//! port 0, for TCP, UDP and SCTP, IPv4 and IPv6 alike. Binding them by number still works.
//!
//! The agent adds every pool's ports and remembers which entries it added in a file of its own
//! (kept on the node's `/run`, which a reboot clears as it clears the setting), so it removes
//! only those: entries someone else put there stay, whether or not a pool covers them.
//!
//! The setting is read in one `read` of a buffer longer than any value the kernel prints: the
//! kernel formats the whole value for a read at offset 0 and answers end-of-file to every read
//! at another offset, so a short first read (`fs::read_to_string` starts with 32 bytes) cuts
//! the value. Writing needs no care: the kernel takes a long value in several `write`s (the
//! first replaces, the rest add).
//!
//! The kernel has no compare-and-swap for a sysctl, so a writer racing the agent is handled by
//! reading again: just before writing (a change since the value was planned from makes it plan
//! again) and after (a value not as written, another writer's, is planned from again, keeping
//! its entries and adding the agent's back). What stays open is a write landing between the
//! agent's last read and its own write, two syscalls apart.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

pub const SYSCTL: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";
/// The ephemeral range, beside it (`net.ipv4.ip_local_port_range`: "FIRST\tLAST").
const PORT_RANGE: &str = "ip_local_port_range";

/// The longest text the kernel prints for the setting, newline included: ranges of two ports
/// with one port between them, where ports have five digits (`10000-10001,10003-10004,…`).
pub const MAX_TEXT: usize = 254_738;
/// The first read's buffer: enough for almost every node, and a read of the whole limit only
/// where it is not.
const FIRST_READ: usize = 4096;
/// How many times a value changed by another writer is planned from again before giving up
/// for this round.
const TRIES: usize = 5;

/// Why the setting could not be brought to the pools' ports.
#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: io::Error },

    #[error(
        "{path} holds {entry:?}, which is not a port or a range of ports ({chars} characters \
         read); the agent leaves the setting as it is"
    )]
    Parse {
        path: String,
        entry: String,
        chars: usize,
    },

    #[error("recording the agent's own entries in {path}: {source}")]
    Record { path: String, source: io::Error },

    #[error("writing {path}: {source}{}", write_hint(.source))]
    Write { path: String, source: io::Error },

    #[error(
        "{path} changed under another writer {tries} times in a row while the agent wrote it; \
         it tries again next round"
    )]
    Contended { path: String, tries: usize },
}

fn write_hint(error: &io::Error) -> &'static str {
    match error.raw_os_error() {
        Some(libc::EPERM | libc::EACCES | libc::EROFS) => {
            " (the agent needs CAP_NET_ADMIN, and the host's file mounted writable: a \
             container's own /proc/sys is read-only; see --reserved-ports-file)"
        }
        _ => "",
    }
}

/// A bad entry of the setting's text (`parse`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadEntry(pub String);

/// The setting's text (`"8080,30000-30099"`, entries of any length and in any order) as ports.
pub fn parse(text: &str) -> Result<BTreeSet<u16>, BadEntry> {
    let mut ports = BTreeSet::new();
    for item in text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|i| !i.is_empty())
    {
        let (first, last) = item.split_once('-').unwrap_or((item, item));
        let port = |s: &str| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| BadEntry(item.to_string()))
        };
        let (first, last) = (port(first)?, port(last)?);
        if first > last {
            return Err(BadEntry(item.to_string()));
        }
        ports.extend(first..=last);
    }
    Ok(ports)
}

/// The whole of a sysctl file: one `read` at offset 0 of a buffer longer than the text (see the
/// module's doc); a buffer filled to the end means the text may go on, so it is read again,
/// from a new open, with a buffer past the kernel's limit.
pub fn read_whole(path: &Path) -> io::Result<String> {
    for size in [FIRST_READ, MAX_TEXT + 1] {
        let mut buf = vec![0u8; size];
        let n = loop {
            match fs::File::open(path)?.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                read => break read?,
            }
        };
        if n < size {
            buf.truncate(n);
            return String::from_utf8(buf)
                .map_err(|_| io::Error::other("the file holds text that is not UTF-8"));
        }
    }
    Err(io::Error::other(format!(
        "longer than {MAX_TEXT} bytes, the longest value the kernel prints for this setting"
    )))
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
    /// Whether the setting was written (it already held `reserved` otherwise).
    pub written: bool,
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
        written: false,
    }
}

/// The setting as the agent reads and writes it; tests put a writer of their own in between.
trait Setting {
    fn read(&self) -> io::Result<String>;
    fn write(&self, text: &str) -> io::Result<()>;
}

struct SysctlFile<'a>(&'a Path);

impl Setting for SysctlFile<'_> {
    fn read(&self) -> io::Result<String> {
        read_whole(self.0)
    }

    fn write(&self, text: &str) -> io::Result<()> {
        fs::write(self.0, text)
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

    /// Another file in place of the setting (the host's, mounted into a container; a test's).
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
        let text = read_whole(&path)?;
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

    /// The ports the setting holds now.
    pub fn current(&self) -> Result<BTreeSet<u16>, ReserveError> {
        let text = self.read(&SysctlFile(&self.sysctl))?;
        self.parse(&text)
    }

    /// The entries the agent's record says it added.
    pub fn ours(&self) -> Result<BTreeSet<u16>, ReserveError> {
        let record = |source| ReserveError::Record {
            path: self.state.display().to_string(),
            source,
        };
        match fs::read_to_string(&self.state) {
            Ok(text) => parse(&text).map_err(|BadEntry(entry)| {
                record(io::Error::other(format!(
                    "it holds {entry:?}, not a port or range"
                )))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(BTreeSet::new()),
            Err(e) => Err(record(e)),
        }
    }

    fn save_ours(&self, ours: &BTreeSet<u16>) -> Result<(), ReserveError> {
        let saved = (|| {
            if let Some(dir) = self.state.parent() {
                fs::create_dir_all(dir)?;
            }
            let tmp = self.state.with_extension("tmp");
            fs::write(&tmp, format(ours))?;
            fs::rename(&tmp, &self.state)
        })();
        saved.map_err(|source| ReserveError::Record {
            path: self.state.display().to_string(),
            source,
        })
    }

    fn path(&self) -> String {
        self.sysctl.display().to_string()
    }

    fn read(&self, setting: &dyn Setting) -> Result<String, ReserveError> {
        setting.read().map_err(|source| ReserveError::Read {
            path: self.path(),
            source,
        })
    }

    fn parse(&self, text: &str) -> Result<BTreeSet<u16>, ReserveError> {
        parse(text).map_err(|BadEntry(entry)| ReserveError::Parse {
            path: self.path(),
            entry,
            chars: text.len(),
        })
    }

    /// Reserve exactly `pools` (plus whatever others reserved). The record first names both
    /// the old and the new entries, so an agent killed between the two writes still knows
    /// every entry it may have added.
    pub fn apply(&self, pools: &BTreeSet<u16>) -> Result<Reservation, ReserveError> {
        self.apply_to(&SysctlFile(&self.sysctl), pools)
    }

    /// Take every entry the agent added out of the setting, leaving every other (for
    /// `node-agent --detach`); the entries taken out.
    pub fn release(&self) -> Result<BTreeSet<u16>, ReserveError> {
        let ours = self.ours()?;
        let before = self.current()?;
        self.apply(&BTreeSet::new())?;
        Ok(ours.intersection(&before).copied().collect())
    }

    fn apply_to(
        &self,
        setting: &dyn Setting,
        pools: &BTreeSet<u16>,
    ) -> Result<Reservation, ReserveError> {
        let mut recorded = self.ours()?;
        let mut text = self.read(setting)?;
        for _ in 0..TRIES {
            let current = self.parse(&text)?;
            let mut next = plan(&current, &recorded, pools);
            if next.reserved == current {
                if next.ours != recorded {
                    self.save_ours(&next.ours)?;
                }
                return Ok(next);
            }
            let may_add: BTreeSet<u16> = recorded.union(&next.ours).copied().collect();
            if may_add != recorded {
                self.save_ours(&may_add)?;
                recorded = may_add;
            }
            // Another writer since the read: plan from its value rather than overwrite it.
            let again = self.read(setting)?;
            if again != text {
                text = again;
                continue;
            }
            // With a newline: an empty write would leave the setting as it was.
            let value = format!("{}\n", format(&next.reserved));
            setting
                .write(&value)
                .map_err(|source| ReserveError::Write {
                    path: self.path(),
                    source,
                })?;
            text = self.read(setting)?;
            if self.parse(&text)? == next.reserved {
                if next.ours != recorded {
                    self.save_ours(&next.ours)?;
                }
                next.written = true;
                return Ok(next);
            }
            // Another writer's value landed after ours: its entries stay, ours go back in.
        }
        Err(ReserveError::Contended {
            path: self.path(),
            tries: TRIES,
        })
    }
}

#[cfg(test)]
#[path = "reserved_ports_tests.rs"]
mod tests;

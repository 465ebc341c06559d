//! The benchmark binary re-executed as a child process, its mode named by [`MODE`]: a process
//! of its own is what a pod's process is to the kernel, and it enters a pod's cgroup before it
//! binds anything (a process cannot take its threads' cgroup along otherwise).
//!
//! - `bind-loop CGROUP`: enter CGROUP, then for each line `PAIRS PORT` on stdin time PAIRS of
//!   socket + `SO_REUSEADDR` + bind(127.0.0.1:PORT) + close on TCP/IPv4 and print the ns per
//!   pair.
//! - `probe`: a process in a simulated node's network namespace that answers lines on stdin:
//!   `enter DIR` (move into that cgroup), `wait PORT TIMEOUT_MS` (bind PORT every millisecond
//!   until the kernel refuses it: `refused FIRST NS`, FIRST being what the first bind got and NS
//!   the CLOCK_MONOTONIC time of the refusal; or `timeout FIRST`), `count PORT...` (bind each
//!   once: how many were refused).

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

/// The environment variable that makes the benchmark binary a child.
pub const MODE: &str = "PORTALLOC_BENCH_NODE_CHILD";

pub fn run(mode: &str) -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match mode {
        "bind-loop" => bind_loop(&args),
        "probe" => probe(),
        other => bail!("{MODE}={other}: no such child mode (bind-loop, probe)"),
    }
}

/// Move this process into the cgroup `dir`.
fn enter(dir: &Path) -> anyhow::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
        .with_context(|| format!("entering the cgroup {}", dir.display()))
}

/// CLOCK_MONOTONIC in ns: the clock `Instant` reads, comparable across processes.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// One socket + `SO_REUSEADDR` + bind(127.0.0.1:`port`) + close on TCP/IPv4: `Ok`, or the errno
/// the bind got.
fn bind_pair(port: u16) -> Result<(), i32> {
    // SAFETY: a socket we own, closed before returning; the address is a local struct.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(*libc::__errno_location());
        }
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        let bound = libc::bind(
            fd,
            (&address as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        let error = *libc::__errno_location();
        libc::close(fd);
        if bound == 0 { Ok(()) } else { Err(error) }
    }
}

fn verdict(result: Result<(), i32>) -> String {
    match result {
        Ok(()) => "ok".into(),
        Err(libc::EPERM) => "EPERM".into(),
        Err(libc::EADDRINUSE) => "EADDRINUSE".into(),
        Err(errno) => format!("errno{errno}"),
    }
}

fn bind_loop(args: &[String]) -> anyhow::Result<()> {
    let [cgroup] = args else {
        bail!("usage: bind-loop CGROUP, then lines PAIRS PORT on stdin");
    };
    enter(Path::new(cgroup))?;
    let mut stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let Some((pairs, port)) = line.split_once(' ') else {
            bail!("bind-loop: cannot read {line:?}");
        };
        let (pairs, port): (u32, u16) = (pairs.parse()?, port.parse()?);
        let first = bind_pair(port);
        ensure!(
            first.is_ok(),
            "binding 127.0.0.1:{port} from {cgroup}: {}",
            verdict(first)
        );
        let start = Instant::now();
        for _ in 0..pairs {
            if let Err(errno) = bind_pair(port) {
                bail!("binding 127.0.0.1:{port}: errno {errno}");
            }
        }
        let ns = start.elapsed().as_nanos() as f64 / f64::from(pairs);
        writeln!(stdout, "{ns:.1}")?;
        stdout.flush()?;
    }
    Ok(())
}

fn probe() -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["enter", dir] => enter(Path::new(dir)).map(|()| "ok".to_string())?,
            ["wait", port, timeout_ms] => {
                let port: u16 = port.parse()?;
                let deadline = Instant::now() + Duration::from_millis(timeout_ms.parse()?);
                let first = verdict(bind_pair(port));
                let mut result = bind_pair(port);
                loop {
                    if result == Err(libc::EPERM) {
                        break format!("refused {first} {}", monotonic_ns());
                    }
                    if Instant::now() > deadline {
                        break format!("timeout {first}");
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    result = bind_pair(port);
                }
            }
            ["count", ports @ ..] => {
                let mut refused = 0;
                for port in ports {
                    if bind_pair(port.parse()?) == Err(libc::EPERM) {
                        refused += 1;
                    }
                }
                refused.to_string()
            }
            _ => bail!("probe: cannot read {line:?}"),
        };
        writeln!(stdout, "{answer}")?;
        stdout.flush()?;
    }
    Ok(())
}

//! Cell 2s's `sync --all -A`: run with its request log (`-v 2`) read line by line, each line
//! stamped as it arrives, and what the log says of where the time went.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};

use crate::cli;

/// One run of the CLI with its stderr read line by line, each line stamped on arrival.
pub struct LoggedRun {
    pub wall: Duration,
    pub success: bool,
    pub lines: Vec<(Duration, String)>,
    pub max_rss_kib: i64,
}

pub fn sync_all(kubeconfig: &std::path::Path) -> anyhow::Result<LoggedRun> {
    let started = Instant::now();
    let mut child = cli::command(kubeconfig, &["sync", "--all", "-A", "-v", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawn sync --all")?;
    let stderr = child.stderr.take().expect("piped");
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines() {
        lines.push((started.elapsed(), line?));
    }
    // wait4 rather than Child::wait: the same reaping, with the child's peak RSS.
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter; the pid is our own unreaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    ensure!(reaped > 0, "wait4: {}", std::io::Error::last_os_error());
    Ok(LoggedRun {
        wall: started.elapsed(),
        success: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        lines,
        max_rss_kib: usage.ru_maxrss,
    })
}

/// The sync's steps, from its request log (`-v 2`: a line per request, at its answer) and its
/// `-v 1` line at the end of each pass's shard writes.
#[derive(Default)]
pub struct Phases {
    /// The last page of the PortAllocations' LIST.
    listed: f64,
    /// The first LIST of the pool's shards (the record read), and how many there were.
    read: f64,
    reads: usize,
    /// The ends of the passes' shard writes.
    passes: Vec<(f64, String)>,
    /// Shard writes (PUT of a shard's status) and creates (POST), with their times.
    pub shard_writes: Vec<f64>,
    shard_creates: Vec<f64>,
    /// PortAllocation status writes: before pass 2's shard writes start they widen statuses,
    /// after that they are the final ones.
    status_writes: Vec<f64>,
    pub conflicts: usize,
    /// How long pass 2's decision took (the `-v 1` line that says so).
    decided: Option<f64>,
    /// How many status widenings it wrote meanwhile (the same line).
    widenings: Option<usize>,
    /// In how many steps, each written while the next was decided (the same line).
    steps: Option<usize>,
}

impl Phases {
    pub fn of(run: &LoggedRun) -> Phases {
        let mut p = Phases::default();
        for (at, line) in &run.lines {
            let at = at.as_secs_f64();
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some(i) = words
                .iter()
                .position(|w| ["GET", "PUT", "POST"].contains(w))
            else {
                if let Some(took) = decision_time(line) {
                    p.decided = Some(took);
                    p.widenings = widenings_written(line);
                    p.steps = steps_of(line);
                } else if line.contains("shard writes") {
                    p.passes
                        .push((at, line.trim_start_matches(" INFO ").trim().to_string()));
                }
                continue;
            };
            let (method, path) = (words[i], words.get(i + 1).copied().unwrap_or_default());
            if words.get(i + 2) == Some(&"409") {
                p.conflicts += 1;
            }
            let resource = path.split('?').next().unwrap_or_default();
            match method {
                "GET" if resource.ends_with("/portallocations") => p.listed = at,
                "GET" if resource.ends_with("/portpoolshards") => {
                    p.reads += 1;
                    if p.reads == 1 {
                        p.read = at;
                    }
                }
                "POST" if resource.ends_with("/portpoolshards") => p.shard_creates.push(at),
                "PUT" if resource.contains("/portpoolshards/") => p.shard_writes.push(at),
                "PUT" if resource.contains("/portallocations/") => p.status_writes.push(at),
                _ => {}
            }
        }
        p
    }

    pub fn status_write_count(&self) -> usize {
        self.status_writes.len()
    }

    pub fn describe(&self, wall: Duration) -> String {
        let span = |times: &[f64]| match (times.first(), times.last()) {
            (Some(a), Some(b)) => format!("{a:.1}–{b:.1} s"),
            _ => "none".into(),
        };
        // Each pass's shard writes end with a line that counts them; what comes after the
        // last such line is the home shards' unnaming (`elsewhere`).
        let pass1_end = self.passes.first().map_or(self.read, |(t, _)| *t);
        let pass2_end = self.passes.get(1).map_or(pass1_end, |(t, _)| *t);
        let between = |times: &[f64], from: f64, to: f64| -> Vec<f64> {
            times
                .iter()
                .copied()
                .filter(|&t| t > from && t <= to)
                .collect()
        };
        let mut pass2_shards = between(&self.shard_writes, pass1_end, pass2_end);
        let pass2_creates = between(&self.shard_creates, pass1_end, pass2_end);
        let pass2_writes = pass2_shards.len();
        pass2_shards.extend(&pass2_creates);
        pass2_shards.sort_by(f64::total_cmp);
        let pass1_writes = self
            .shard_writes
            .iter()
            .filter(|&&t| t <= pass1_end)
            .count();
        let unnaming = between(&self.shard_writes, pass2_end, f64::MAX);
        // The widenings are the first status writes (as many as the decision's line counts,
        // else all before pass 2's shard writes); the final ones may start beside pass 2's
        // shard writes (each once its shards are committed).
        let pass2_start = pass2_shards.first().copied().unwrap_or(pass2_end);
        let widenings = self.widenings.unwrap_or_else(|| {
            self.status_writes
                .iter()
                .filter(|&&t| t < pass2_start)
                .count()
        });
        let (widen, fin) = self
            .status_writes
            .split_at(widenings.min(self.status_writes.len()));
        let decision = match self.decided {
            Some(took) => match self.steps {
                Some(steps) => format!(
                    "pass 2 decided in **{took:.1} s** (one thread, in {steps} steps, each \
                     written while the next was decided)"
                ),
                None => format!("pass 2 decided in **{took:.1} s** (one thread)"),
            },
            None => {
                let start = widen
                    .first()
                    .or(pass2_shards.first())
                    .copied()
                    .unwrap_or(pass1_end);
                format!(
                    "pass 2 decided by {start:.1} s (**{:.1} s** of decision, one thread)",
                    start - pass1_end
                )
            }
        };
        format!(
            "LIST of the PortAllocations done at {:.1} s; pool and shards read at {:.1} s ({} \
             read{} in all); {decision}; pass 1 ({pass1_writes} shard writes, with the names of \
             the owners pass 2 moves, when the CLI writes them) done at {pass1_end:.1} s; {} \
             widening status writes {}; pass 2's shard writes ({} creates, {} writes) {}; **{} \
             final status writes {}**; {} home shards unnamed {}; exit {:.1} s{}",
            self.listed,
            self.read,
            self.reads,
            if self.reads == 1 { "" } else { "s" },
            widen.len(),
            span(widen),
            pass2_creates.len(),
            pass2_writes,
            span(&pass2_shards),
            fin.len(),
            span(fin),
            unnaming.len(),
            span(&unnaming),
            wall.as_secs_f64(),
            if self.passes.is_empty() {
                String::new()
            } else {
                let passes: Vec<&str> = self.passes.iter().map(|(_, l)| l.as_str()).collect();
                format!(" ({})", passes.join("; "))
            }
        )
    }
}

/// The seconds of pass 2's decision, from the line `sync` logs when it ends
/// (`...: pass 2 decided for N in S s, ...`).
fn decision_time(line: &str) -> Option<f64> {
    let (_, after) = line.split_once("pass 2 decided for ")?;
    let (_, after) = after.split_once(" in ")?;
    after.split_once(" s")?.0.parse().ok()
}

/// In how many steps the decision's line says pass 2 went (`..., in N steps each written...`).
fn steps_of(line: &str) -> Option<usize> {
    let (before, _) = line.split_once(" steps each written")?;
    before.rsplit(' ').next()?.parse().ok()
}

/// How many status widenings the decision's line says were written while it ran
/// (`..., W status widenings written meanwhile...`).
fn widenings_written(line: &str) -> Option<usize> {
    let (before, _) = line.split_once(" status widenings written")?;
    before.rsplit(' ').next()?.parse().ok()
}

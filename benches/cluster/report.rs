//! What the benchmark targets that print one Markdown table have in common: quick or full mode,
//! the cells asked for, the header saying what was measured where, and the table's lines.
//! Shared by benches/cluster and benches/node (`#[path]`).

use std::fmt::Write as _;
use std::time::Duration;

use super::machine;

/// Quick mode: `PORTALLOC_BENCH_QUICK=1`, `--quick`, or a run without the `--bench` flag that
/// `cargo bench` passes (so `cargo test --benches` never runs the full size).
pub fn quick_mode() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::env::var("PORTALLOC_BENCH_QUICK").is_ok_and(|v| v == "1")
        || args.iter().any(|a| a == "--quick")
        || !args.iter().any(|a| a == "--bench")
}

/// The cells named by `PORTALLOC_BENCH_CELLS` (comma-separated); `None`: all of them.
pub fn cells_asked() -> Option<Vec<String>> {
    std::env::var("PORTALLOC_BENCH_CELLS").ok().map(|v| {
        v.split(',')
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect()
    })
}

/// Whether cell `id` is to run.
pub fn wants(cells: &Option<Vec<String>>, id: &str) -> bool {
    cells
        .as_ref()
        .is_none_or(|cells| cells.iter().any(|c| c == id))
}

pub fn dash() -> String {
    "—".into()
}

pub fn yes_no(ok: bool) -> String {
    if ok { "yes" } else { "**no**" }.into()
}

/// The lines above a table, each ending in two spaces (a Markdown line break).
pub struct Header<'a> {
    /// The bench target's name: `cluster`, `node`.
    pub bench: &'a str,
    pub quick: bool,
    pub elapsed: Duration,
    /// Said after the machine's cores, memory and CPU.
    pub machine_extra: Option<String>,
    /// Lines between the source and the cells run.
    pub setup: &'a [&'a str],
    pub cells: &'a Option<Vec<String>>,
    /// Load average before and after the run.
    pub load: (&'a str, &'a str),
}

impl Header<'_> {
    pub fn write(&self, out: &mut String) {
        let command = if self.quick {
            format!(
                "PORTALLOC_BENCH_QUICK=1 cargo test --locked --bench {}",
                self.bench
            )
        } else {
            format!("cargo bench --bench {}", self.bench)
        };
        let _ = writeln!(
            out,
            "\n**kubectl-portalloc {} benchmark ({})**: `{command}`, {:.0} s  ",
            self.bench,
            if self.quick {
                "quick mode: tiny counts, the numbers mean nothing"
            } else {
                "full run"
            },
            self.elapsed.as_secs_f64()
        );
        let _ = match &self.machine_extra {
            Some(extra) => writeln!(out, "machine: {}; {extra}  ", machine::machine()),
            None => writeln!(out, "machine: {}  ", machine::machine()),
        };
        let _ = writeln!(out, "source: {}  ", machine::tree_state());
        for line in self.setup {
            let _ = writeln!(out, "{line}  ");
        }
        if let Some(cells) = self.cells {
            let _ = writeln!(
                out,
                "cells run (PORTALLOC_BENCH_CELLS): {}  ",
                cells.join(", ")
            );
        }
        let (before, after) = self.load;
        let _ = writeln!(
            out,
            "load average (1/5/15 min): {before} before, {after} after  "
        );
    }
}

/// A table's head: an unnamed id column, then `titles`, and the separator line.
pub fn write_head(out: &mut String, titles: &[&str]) {
    let _ = writeln!(out, "| | {} |", titles.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(titles.len()));
}

/// One line of a table.
pub fn write_row(out: &mut String, cells: &[&str]) {
    let _ = writeln!(out, "| {} |", cells.join(" | "));
}

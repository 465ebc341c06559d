//! One line per PortAllocation touched, as kubectl prints `created`/`configured`.

use crate::k8s::SyncReport;

pub fn print_report(report: &SyncReport, verbosity: u8) {
    if verbosity >= 1 {
        println!(
            "{report} [attempts={} conflicts={}]",
            report.attempts, report.conflicts
        );
    } else {
        println!("{report}");
    }
}

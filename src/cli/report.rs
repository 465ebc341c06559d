//! One line per PortAllocation touched, as kubectl prints `created`/`configured`, and one for its
//! ConfigMap when it names one (`configmap/NAME updated (7 env files)`).

use crate::k8s::{ConfigMapError, SyncReport};

pub fn print_report(report: &SyncReport, verbosity: u8) {
    print_report_to(report, verbosity, false)
}

/// [`print_report`], on stderr when `to_stderr` (with `-o`, stdout is for the objects or names).
pub fn print_report_to(report: &SyncReport, verbosity: u8, to_stderr: bool) {
    let line = |text: String| match to_stderr {
        true => eprintln!("{text}"),
        false => println!("{text}"),
    };
    if verbosity >= 1 {
        line(format!(
            "{report} [attempts={} conflicts={}]",
            report.attempts, report.conflicts
        ));
    } else {
        line(report.to_string());
    }
    if report.holdings.port_count() > 0
        && let Some(warning) = report.allocation.reused_ports_warning()
    {
        eprintln!("warning: {warning}");
    }
    match &report.configmap {
        Some(Ok(configmap)) => line(configmap.to_string()),
        // Callers that fail on it take it out first; the others (repair) still say it.
        Some(Err(error)) => eprintln!("error: {error}"),
        None => {}
    }
}

/// The ConfigMap failure of a sync, taken out of the report so the caller can print the rest
/// and then fail with it (the ports stay allocated).
pub fn take_configmap_error(report: &mut SyncReport) -> Option<ConfigMapError> {
    match report.configmap.take() {
        Some(Err(error)) => Some(error),
        kept => {
            report.configmap = kept;
            None
        }
    }
}

//! One line per PortAllocation touched, as kubectl prints `created`/`configured`, and one for its
//! ConfigMap when it names one (`configmap/NAME updated (7 env files)`).

use crate::k8s::{ConfigMapError, SyncReport};

pub fn print_report(report: &SyncReport, verbosity: u8) {
    if verbosity >= 1 {
        println!(
            "{report} [attempts={} conflicts={}]",
            report.attempts, report.conflicts
        );
    } else {
        println!("{report}");
    }
    if report.holdings.port_count() > 0
        && let Some(warning) = report.allocation.reused_ports_warning()
    {
        eprintln!("warning: {warning}");
    }
    match &report.configmap {
        Some(Ok(configmap)) => println!("{configmap}"),
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

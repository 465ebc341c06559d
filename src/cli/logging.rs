//! `-v LEVEL`: what is logged on stderr, through `tracing`.
//!
//! - 0: warnings of this program only;
//! - 1: also what each verb decided (INFO);
//! - 2: also DEBUG, which includes one line per API request (see `k8s::client::RequestLog`);
//! - 3 and up: everything, the Kubernetes client's own spans and events included.
//!
//! Below 3 the libraries stay silent: kube reports a failed request as an ERROR event, and this
//! program already reports every failure once, with its exit code.

use std::io::IsTerminal;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Where this program's events come from: the library, and the binary around it.
const OUR_TARGETS: [&str; 2] = ["portalloc", "kubectl_portalloc"];

/// Which events `-v verbosity` shows.
pub fn log_filter(verbosity: u8) -> Targets {
    let ours = match verbosity {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => return Targets::new().with_default(LevelFilter::TRACE),
    };
    Targets::new()
        .with_default(LevelFilter::OFF)
        .with_targets(OUR_TARGETS.map(|target| (target, ours)))
}

/// Colour only for a person: stderr is a terminal and `NO_COLOR` is unset or empty
/// (https://no-color.org), as for the tables on stdout.
fn colour_on_stderr() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// Send `tracing` events to stderr for the rest of the process. Called once, by `main`.
pub fn init_logging(verbosity: u8) {
    let format = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .without_time()
        // Which library spoke only matters once libraries speak (-v 3).
        .with_target(verbosity >= 3);
    // A second call (never made by the binary) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(format.with_filter(log_filter(verbosity)))
        .try_init();
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    use super::*;

    fn shows(verbosity: u8, target: &str, level: Level) -> bool {
        log_filter(verbosity).would_enable(target, &level)
    }

    #[test]
    fn each_level_adds_to_the_one_below() {
        let request_line = ("portalloc::k8s::client", Level::DEBUG);
        let decision = ("portalloc::k8s::allocator", Level::INFO);
        let warning = ("portalloc::cli::pool", Level::WARN);
        let kube = ("kube_client::client::builder", Level::ERROR);
        let kube_debug = ("kube_client::client::builder", Level::DEBUG);
        let ours_trace = ("portalloc::k8s::retry", Level::TRACE);
        let binary = ("kubectl_portalloc", Level::INFO);

        let expected = [
            // request line, decision, warning, kube error, kube debug, our trace, binary
            (0, [false, false, true, false, false, false, false]),
            (1, [false, true, true, false, false, false, true]),
            (2, [true, true, true, false, false, false, true]),
            (3, [true, true, true, true, true, true, true]),
            (9, [true, true, true, true, true, true, true]),
        ];
        for (verbosity, wanted) in expected {
            let got = [
                request_line,
                decision,
                warning,
                kube,
                kube_debug,
                ours_trace,
                binary,
            ]
            .map(|(target, level)| shows(verbosity, target, level));
            assert_eq!(got, wanted, "-v {verbosity}");
        }
    }
}

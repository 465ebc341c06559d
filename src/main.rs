//! `kubectl-portalloc`: kubectl finds this binary on PATH and runs it as `kubectl portalloc`.

use std::process::ExitCode;

use clap::Parser;
// The command line is part of the binary, not of the library's API. It reaches the library
// through these names, as `crate::api`, `crate::k8s` and so on.
use portalloc::{api, core, k8s, ledger, node};

#[cfg(target_os = "linux")]
mod allocator;
mod cli;

use cli::{Cli, exit_for};

fn main() -> ExitCode {
    // Writing to a closed pipe (`kubectl portalloc get | head`) must end quietly, not panic; a
    // connection to the API server that breaks mid-write must be an error that is retried or
    // reported, not a silent death. So SIGPIPE stays ignored and a closed stdout ends the
    // process as SIGPIPE would have.
    end_quietly_on_closed_stdout();
    // Shell completion comes before argument parsing: the words being completed are not ours to
    // validate. kubectl runs `kubectl_complete-portalloc WORDS...`: this binary under that name
    // (a symlink), or the script `completion kubectl-plugin` prints, which runs
    // `kubectl-portalloc __complete WORDS...`.
    let mut args = std::env::args();
    let invoked_as = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    let completing = if invoked_as.rsplit('/').next() == Some(cli::KUBECTL_COMPLETE_NAME) {
        Some(rest)
    } else if rest.first().map(String::as_str) == Some("__complete") {
        Some(rest[1..].to_vec())
    } else {
        None
    };
    if let Some(words) = completing {
        let Some(runtime) = runtime(false) else {
            return cli::Exit::Failure.code();
        };
        runtime.block_on(cli::complete(words));
        return cli::Exit::Ok.code();
    }
    let cli = Cli::parse();
    cli::init_logging(cli.global.verbosity);
    let Some(runtime) = runtime(cli.serves()) else {
        return cli::Exit::Failure.code();
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => cli::Exit::Ok.code(),
        Err(err) => {
            if is_closed_stdout(&err) {
                die_of_sigpipe();
            }
            // An empty message is an exit status alone (`diff` found differences).
            let message = cli::render_error(&err);
            if !message.is_empty() {
                eprintln!("error: {message}");
            }
            exit_for(&err).code()
        }
    }
}

/// The async runtime: one thread for a command that runs and ends (it starts fastest and nothing
/// in it waits on another task); a worker per core for the processes that serve (`sync --watch`,
/// `node-agent`), where the webhook must answer while the watcher decides (`k8s::process::cpu_bound`).
fn runtime(serves: bool) -> Option<tokio::runtime::Runtime> {
    let mut builder = if serves {
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers);
        builder
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    match builder.enable_all().build() {
        Ok(runtime) => Some(runtime),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            None
        }
    }
}

/// A write to stdout failed because the reader left: an `io::Error` of its own, not one inside a
/// Kubernetes client error (a broken connection to the API server).
fn is_closed_stdout(err: &anyhow::Error) -> bool {
    let broken = err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    });
    broken && !err.chain().any(|cause| cause.is::<kube::Error>())
}

/// `println!` panics when stdout is a closed pipe: end the way SIGPIPE ends a process, without
/// a panic message, as `head` and friends expect.
fn end_quietly_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.contains("Broken pipe") {
            die_of_sigpipe();
        }
        default(info);
    }));
}

#[cfg(unix)]
fn die_of_sigpipe() -> ! {
    // SAFETY: restoring the default disposition and raising the signal ends the process at once.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(141)
}

#[cfg(not(unix))]
fn die_of_sigpipe() -> ! {
    std::process::exit(141)
}

//! `kubectl-portalloc`: kubectl finds this binary on PATH and runs it as `kubectl portalloc`.

use std::process::ExitCode;

use clap::Parser;
use portalloc::cli::{self, Cli, exit_for};

fn main() -> ExitCode {
    // Writing to a closed pipe (`kubectl portalloc get | head`) must end quietly, not panic.
    reset_sigpipe();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return cli::Exit::Failure.code();
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => cli::Exit::Ok.code(),
        Err(err) => {
            eprintln!("error: {err:#}");
            exit_for(&err).code()
        }
    }
}

#[cfg(unix)]
fn reset_sigpipe() {
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn reset_sigpipe() {}

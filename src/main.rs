//! `kubectl-portalloc`: kubectl finds this binary on PATH and runs it as `kubectl portalloc`.

use std::process::ExitCode;

use clap::Parser;
use portalloc::cli::{self, Cli, exit_for};

fn main() -> ExitCode {
    // Writing to a closed pipe (`kubectl portalloc get | head`) must end quietly, not panic.
    reset_sigpipe();
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
    // Shell completion comes before argument parsing: the words being completed are not ours to
    // validate. kubectl runs `kubectl_complete-portalloc WORDS...`: this binary under that name
    // (a symlink), or the script `completion kubectl-plugin` prints, which runs
    // `kubectl-portalloc __complete WORDS...`.
    let mut args = std::env::args();
    let invoked_as = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    if invoked_as.rsplit('/').next() == Some(cli::KUBECTL_COMPLETE_NAME) {
        runtime.block_on(cli::complete(rest));
        return cli::Exit::Ok.code();
    }
    if rest.first().map(String::as_str) == Some("__complete") {
        runtime.block_on(cli::complete(rest[1..].to_vec()));
        return cli::Exit::Ok.code();
    }
    let cli = Cli::parse();
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

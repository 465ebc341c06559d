//! Stable, documented exit codes. Scripts may rely on these; never renumber them.

use std::process::ExitCode;

use crate::api::ResolveError;
use crate::k8s::{
    self, AllocateError, ApiErrorKind, ApplyError, ConfigMapError, DeleteError, KubeError,
    PoolError, RepairError,
};
use crate::ledger::Refusal;

/// Exit codes of `kubectl portalloc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Ok = 0,
    /// Anything not covered below.
    Failure = 1,
    /// Bad flags or arguments (clap's own code).
    Usage = 2,
    /// A named object (pool, PortAllocation) does not exist.
    NotFound = 3,
    /// The request was understood but cannot be satisfied: pool full, port held, pool in use.
    Refused = 4,
    /// The API server said Forbidden.
    Forbidden = 5,
    /// The API server was unreachable, timed out, or conflicts outlasted the retry budget:
    /// running the same command again is safe.
    Unavailable = 6,
    /// The input is invalid: a manifest, a reference, a range (client-side or server-side).
    Invalid = 7,
    /// The portalloc.dev CRDs are not installed.
    CrdsMissing = 8,
    /// No usable kubeconfig or context.
    Config = 9,
    /// `repair` without `--apply` found something to change or report (as `kubectl diff`
    /// signals differences, but with a code of its own: 1 already means failure here).
    Differences = 10,
}

impl Exit {
    pub fn code(self) -> ExitCode {
        ExitCode::from(self as u8)
    }
}

/// An error that knows its exit code. Everything else maps to [`Exit::Failure`].
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }
}

/// Pick the exit code for an error from any layer.
pub fn exit_for(err: &anyhow::Error) -> Exit {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<CliError>() {
            return e.exit;
        }
        if let Some(e) = cause.downcast_ref::<AllocateError>() {
            return allocate_exit(e);
        }
        if let Some(e) = cause.downcast_ref::<ApplyError>() {
            return match e {
                ApplyError::PoolChanged { .. } => Exit::Invalid,
                ApplyError::Allocate(e) => allocate_exit(e),
            };
        }
        if let Some(e) = cause.downcast_ref::<DeleteError>() {
            return match e {
                DeleteError::Kube(e) => kube_exit(e),
                DeleteError::EntryLeft { error, .. } => allocate_exit(error),
            };
        }
        if let Some(e) = cause.downcast_ref::<PoolError>() {
            return match e {
                PoolError::Invalid { .. } => Exit::Invalid,
                PoolError::Overlaps { .. }
                | PoolError::AlreadyExists { .. }
                | PoolError::Held { .. }
                | PoolError::Strands { .. }
                | PoolError::ReuseInUse { .. } => Exit::Refused,
                PoolError::Changed { .. } => Exit::Unavailable,
                PoolError::Kube(e) => kube_exit(e),
            };
        }
        if let Some(e) = cause.downcast_ref::<RepairError>() {
            return match e {
                RepairError::Kube(e) => kube_exit(e),
                RepairError::PoolSpec { .. } => Exit::Invalid,
                RepairError::Exhausted { .. } => Exit::Unavailable,
            };
        }
        if let Some(e) = cause.downcast_ref::<ConfigMapError>() {
            // As `resolve` exits: an env not allocated yet is refused, a bad one invalid; a
            // Forbidden is 5 like every other.
            return match e {
                ConfigMapError::Unresolved {
                    source: ResolveError::NotAllocated { .. },
                    ..
                }
                | ConfigMapError::Foreign { .. } => Exit::Refused,
                ConfigMapError::Unresolved { .. } => Exit::Invalid,
                ConfigMapError::Kube { source, .. } => kube_exit(source),
            };
        }
        if let Some(e) = cause.downcast_ref::<KubeError>() {
            return kube_exit(e);
        }
    }
    Exit::Failure
}

fn allocate_exit(e: &AllocateError) -> Exit {
    match e {
        AllocateError::Refused(refusal) => refusal_exit(refusal),
        AllocateError::Exhausted { .. } => Exit::Unavailable,
        // A stale object in the way that only `repair` clears.
        AllocateError::BlockedShard { .. } => Exit::Refused,
        AllocateError::Kube(e) => kube_exit(e),
    }
}

fn refusal_exit(refusal: &Refusal) -> Exit {
    match refusal {
        Refusal::Spec { .. } | Refusal::PoolSpec { .. } => Exit::Invalid,
        Refusal::PoolNotFound { .. } => Exit::NotFound,
        Refusal::PortHeld { .. }
        | Refusal::Core { .. }
        | Refusal::BeyondReuse { .. }
        | Refusal::NodeBound { .. } => Exit::Refused,
    }
}

/// The message of an error from any layer, on one line: the top error and each cause whose text
/// it does not already carry, kube's errors in words ([`k8s::error_chain`]).
pub fn render_error(err: &anyhow::Error) -> String {
    let top: &(dyn std::error::Error + 'static) = err.as_ref();
    k8s::error_chain(top)
}

fn kube_exit(e: &KubeError) -> Exit {
    match e.kind() {
        ApiErrorKind::Config => Exit::Config,
        ApiErrorKind::CrdsMissing => Exit::CrdsMissing,
        ApiErrorKind::Forbidden => Exit::Forbidden,
        ApiErrorKind::NotFound => Exit::NotFound,
        // Someone else wrote first; the write did not happen and a rerun reads the new version.
        ApiErrorKind::Conflict => Exit::Unavailable,
        ApiErrorKind::Invalid => Exit::Invalid,
        ApiErrorKind::Unavailable => Exit::Unavailable,
        ApiErrorKind::Other => Exit::Failure,
    }
}

//! Why the webhook denies a pod. Each text is the one line the API server shows the workload
//! controller (after `portalloc: `): what is wrong and what to run, or that it retries.

use crate::api::{POD_ALLOCATION_LABEL, PodInjectionError};
use crate::k8s::allocate::AllocateError;
use crate::k8s::error::KubeError;
use crate::ledger::{PodPortsError, RecordDenial, Refusal};

/// Why a pod is denied.
#[derive(Debug, thiserror::Error)]
pub enum Denial {
    /// Its PortAllocation could not be read.
    #[error(transparent)]
    Read(KubeError),
    #[error(
        "pod label {POD_ALLOCATION_LABEL}={name} names PortAllocation {namespace}/{name}, which \
         does not exist: create it (kubectl portalloc create -f FILE) or fix the label"
    )]
    NoAllocation { namespace: String, name: String },
    #[error(
        "PortAllocation {owner} is not allocated yet, and a dry run allocates nothing: run \
         kubectl portalloc sync {name} -n {namespace}"
    )]
    DryRun {
        owner: String,
        name: String,
        namespace: String,
    },
    /// Its PortAllocation cannot be allocated: a lasting refusal.
    #[error(transparent)]
    Refused(Refusal),
    /// Syncing its PortAllocation failed for now.
    #[error("{0} (the workload controller retries the pod)")]
    Sync(#[source] AllocateError),
    #[error(transparent)]
    Injection(#[from] PodInjectionError),
    #[error(transparent)]
    RecordCheck(#[from] RecordCheckError),
    #[error(
        "PortPool {pool:?} of PortAllocation {owner} does not exist, so the pod's ports cannot be \
         declared in its protocol: create the pool again and run kubectl portalloc repair \
         --pool {pool} --apply"
    )]
    NoPool { pool: String, owner: String },
    /// The pool, for its protocol, could not be read.
    #[error("{0} (the workload controller retries the pod)")]
    Pool(#[source] KubeError),
    #[error("building the patch: {0}")]
    Patch(#[source] serde_json::Error),
}

/// Why the record check did not let a pod have its ports.
#[derive(Debug, thiserror::Error)]
pub enum RecordCheckError {
    #[error(transparent)]
    Ports(#[from] PodPortsError),
    #[error(
        "checking the ports of PortAllocation {owner} against its pool's record: {source} (the \
         workload controller retries the pod)"
    )]
    Read {
        owner: String,
        #[source]
        source: KubeError,
    },
    /// The record gives a port to someone else, or to nobody.
    #[error(transparent)]
    Unheld(#[from] RecordDenial),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_read_as_one_line_with_what_to_run() {
        let missing = Denial::NoAllocation {
            namespace: "ns".into(),
            name: "web".into(),
        };
        assert_eq!(
            missing.to_string(),
            "pod label portalloc.dev/allocation=web names PortAllocation ns/web, which does not \
             exist: create it (kubectl portalloc create -f FILE) or fix the label"
        );
        let dry_run = Denial::DryRun {
            owner: "ns/web".into(),
            name: "web".into(),
            namespace: "ns".into(),
        };
        assert_eq!(
            dry_run.to_string(),
            "PortAllocation ns/web is not allocated yet, and a dry run allocates nothing: run \
             kubectl portalloc sync web -n ns"
        );
        let no_pool = Denial::NoPool {
            pool: "default".into(),
            owner: "ns/web".into(),
        };
        assert_eq!(
            no_pool.to_string(),
            "PortPool \"default\" of PortAllocation ns/web does not exist, so the pod's ports \
             cannot be declared in its protocol: create the pool again and run kubectl portalloc \
             repair --pool default --apply"
        );
    }
}

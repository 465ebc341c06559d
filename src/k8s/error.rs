//! API failures turned into messages that say what went wrong, on which object, and what to do.

use kube::core::Status;

/// What kind of failure, for exit codes and retry decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiErrorKind {
    Config,
    CrdsMissing,
    Forbidden,
    NotFound,
    Conflict,
    Invalid,
    /// The API server could not be reached or did not answer in time: worth retrying later.
    Unavailable,
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("{message}")]
    Config { message: String },

    #[error(
        "the portalloc.dev CRDs are not installed in this cluster ({resource} is unknown to the API server): \
         run `kubectl portalloc install`, or `kubectl apply --server-side -f crds/portalloc-crds.yaml`"
    )]
    CrdsMissing { resource: String },

    #[error(
        "forbidden: you may not {verb} {resource}{scope}: {message}. Ask a cluster administrator to bind \
         the portalloc ClusterRoles (see rbac/ in the kubectl-portalloc repository)"
    )]
    Forbidden {
        verb: String,
        resource: String,
        scope: String,
        message: String,
    },

    #[error("{kind} {name:?} not found{scope}{hint}")]
    NotFound {
        kind: String,
        name: String,
        scope: String,
        hint: String,
    },

    #[error("{message}")]
    Invalid { message: String },

    #[error(
        "the API server is unavailable while trying to {verb} {resource}: {message} (safe to retry)"
    )]
    Unavailable {
        verb: String,
        resource: String,
        message: String,
    },

    /// Another client wrote the object between our read and our write (409 Conflict). The
    /// write did not happen; running the command again reads the new version.
    #[error(
        "{object} was changed by another client while this command was updating it ({verb} \
         {resource}: {message}): running the command again is safe"
    )]
    Conflict {
        verb: String,
        resource: String,
        /// `PortAllocation "x" in namespace "y"`
        object: String,
        message: String,
    },

    #[error("{verb} {resource}: {message}")]
    Other {
        verb: String,
        resource: String,
        message: String,
    },
}

impl KubeError {
    /// Add what to do next to a "not found"; other errors pass through unchanged.
    pub fn with_hint(self, hint: &str) -> KubeError {
        match self {
            KubeError::NotFound {
                kind, name, scope, ..
            } => KubeError::NotFound {
                kind,
                name,
                scope,
                hint: hint.to_string(),
            },
            other => other,
        }
    }

    pub fn kind(&self) -> ApiErrorKind {
        match self {
            Self::Config { .. } => ApiErrorKind::Config,
            Self::CrdsMissing { .. } => ApiErrorKind::CrdsMissing,
            Self::Forbidden { .. } => ApiErrorKind::Forbidden,
            Self::NotFound { .. } => ApiErrorKind::NotFound,
            Self::Invalid { .. } => ApiErrorKind::Invalid,
            Self::Conflict { .. } => ApiErrorKind::Conflict,
            Self::Unavailable { .. } => ApiErrorKind::Unavailable,
            Self::Other { .. } => ApiErrorKind::Other,
        }
    }
}

/// The operation that failed, so the message can name it.
#[derive(Clone, Debug)]
pub struct Op<'a> {
    /// Kubernetes verb: get, list, create, update, patch, delete.
    pub verb: &'a str,
    /// Plural resource, e.g. `portpools.portalloc.dev` or `portpools.portalloc.dev/status`.
    pub resource: &'a str,
    /// The object's kind for "not found" messages, e.g. `PortPool`.
    pub kind: &'a str,
    pub name: Option<&'a str>,
    pub namespace: Option<&'a str>,
}

impl Op<'_> {
    fn scope(&self) -> String {
        match self.namespace {
            Some(ns) => format!(" in namespace {ns:?}"),
            None => String::new(),
        }
    }
}

/// Turn a kube error into one that says what to do next.
pub fn explain(err: kube::Error, op: &Op<'_>) -> KubeError {
    match err {
        kube::Error::Api(response) => explain_status(&response, op),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => {
            KubeError::Unavailable {
                verb: op.verb.into(),
                resource: op.resource.into(),
                message: transport_message(&err),
            }
        }
        other => KubeError::Other {
            verb: op.verb.into(),
            resource: op.resource.into(),
            message: error_chain(&other),
        },
    }
}

fn explain_status(response: &Status, op: &Op<'_>) -> KubeError {
    let status = &response.message;
    match response.code {
        403 => KubeError::Forbidden {
            verb: op.verb.into(),
            resource: op.resource.into(),
            scope: op.scope(),
            message: status.clone(),
        },
        404 if is_unknown_resource(response) => KubeError::CrdsMissing {
            resource: op.resource.into(),
        },
        404 => KubeError::NotFound {
            kind: op.kind.into(),
            name: op.name.unwrap_or_default().into(),
            scope: op.scope(),
            hint: String::new(),
        },
        409 if response.is_conflict() => KubeError::Conflict {
            verb: op.verb.into(),
            resource: op.resource.into(),
            object: format!(
                "{} {:?}{}",
                op.kind,
                op.name.unwrap_or_default(),
                op.scope()
            ),
            message: status.clone(),
        },
        409 => KubeError::Other {
            verb: op.verb.into(),
            resource: op.resource.into(),
            message: format!("conflict: {status}"),
        },
        400 | 422 => KubeError::Invalid {
            message: status.clone(),
        },
        429 | 500 | 503 | 504 => KubeError::Unavailable {
            verb: op.verb.into(),
            resource: op.resource.into(),
            message: status.clone(),
        },
        _ => KubeError::Other {
            verb: op.verb.into(),
            resource: op.resource.into(),
            message: format!("{status} (HTTP {})", response.code),
        },
    }
}

/// A 404 for the resource type itself (our CRDs are not installed) rather than for one object.
/// A missing object comes back as a Status with reason NotFound and details naming it; an
/// unknown resource path comes back as plain text ("404 page not found") or a Status without
/// details ("the server could not find the requested resource").
pub fn is_unknown_resource(status: &Status) -> bool {
    status.code == 404
        && (status.details.is_none()
            || status.message.contains("page not found")
            || status
                .message
                .contains("could not find the requested resource"))
}

/// What went wrong on the wire. A timeout says so first: the chain alone reads "client error
/// (Connect): deadline has elapsed", which does not tell a user that the server did not answer.
pub fn transport_message(err: &kube::Error) -> String {
    let chain = error_chain(err);
    let timed_out = chain.contains("deadline has elapsed") || chain.contains("timed out") || {
        let mut source = std::error::Error::source(err);
        let mut found = false;
        while let Some(cause) = source {
            found |= cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut);
            source = cause.source();
        }
        found
    };
    if timed_out {
        format!("timed out: no answer within the request timeout (--request-timeout; {chain})")
    } else {
        chain
    }
}

/// `e: cause: cause` on one line; hyper's top-level messages alone are too vague.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..Default::default()
        }))
    }

    const OP: Op<'static> = Op {
        verb: "update",
        resource: "portallocations.portalloc.dev",
        kind: "PortAllocation",
        name: Some("a"),
        namespace: Some("ns"),
    };

    #[test]
    fn a_conflict_names_the_object_and_says_a_rerun_is_safe() {
        let err = explain(status(409, "Conflict", "the object has been modified"), &OP);
        assert_eq!(err.kind(), ApiErrorKind::Conflict);
        let text = err.to_string();
        assert!(
            text.starts_with(
                "PortAllocation \"a\" in namespace \"ns\" was changed by another client"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("running the command again is safe"),
            "{text}"
        );
        // AlreadyExists is a 409 too, but not one a rerun fixes.
        let exists = explain(status(409, "AlreadyExists", "already exists"), &OP);
        assert_eq!(exists.kind(), ApiErrorKind::Other);
    }
}

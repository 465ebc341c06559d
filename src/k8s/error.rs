//! API failures as data: what kind of failure, which request on which object, the server's own
//! words and the `kube::Error` itself. Rendered as one line that says what to do next.

use std::fmt;
use std::time::Duration;

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

/// The request that failed, so the message can name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Kubernetes verb: get, list, create, update, patch, delete, watch.
    pub verb: &'static str,
    /// Plural resource, e.g. `portpools.portalloc.dev` or `portpools.portalloc.dev/status`.
    pub resource: String,
    /// The object's kind for "not found" messages, e.g. `PortPool`.
    pub kind: &'static str,
    pub name: Option<String>,
    pub namespace: Option<String>,
}

impl Target {
    fn scope(&self) -> String {
        match &self.namespace {
            Some(ns) => format!(" in namespace {ns:?}"),
            None => String::new(),
        }
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
}

/// A failed request (or an unusable kubeconfig), with everything needed to explain it. Boxed:
/// it travels inside other errors, and results stay small.
#[derive(Debug)]
pub struct KubeError(Box<Failure>);

#[derive(Debug)]
struct Failure {
    kind: ApiErrorKind,
    /// `None` only for configuration errors, which precede any request.
    target: Option<Target>,
    /// The server's message, the transport's error chain, or the configuration problem.
    detail: String,
    /// What to do next, for "not found".
    hint: String,
    /// The HTTP status code, when the server answered.
    code: Option<u16>,
    source: Option<kube::Error>,
}

impl KubeError {
    /// A kubeconfig or context that cannot be used.
    pub fn config(message: impl Into<String>) -> KubeError {
        KubeError(Box::new(Failure {
            kind: ApiErrorKind::Config,
            target: None,
            detail: message.into(),
            hint: String::new(),
            code: None,
            source: None,
        }))
    }

    /// A failure noticed by this client rather than answered by the server (e.g. a wait that
    /// timed out).
    pub fn new(kind: ApiErrorKind, target: Target, detail: impl Into<String>) -> KubeError {
        KubeError(Box::new(Failure {
            kind,
            target: Some(target),
            detail: detail.into(),
            hint: String::new(),
            code: None,
            source: None,
        }))
    }

    /// Classify a kube error for `target`.
    pub fn from_kube(err: kube::Error, target: Target) -> KubeError {
        let (kind, detail, code) = match &err {
            kube::Error::Api(status) => {
                let (kind, detail) = classify_status(status);
                (kind, detail, Some(status.code))
            }
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => {
                (ApiErrorKind::Unavailable, transport_message(&err), None)
            }
            other => (ApiErrorKind::Other, error_chain(other), None),
        };
        KubeError(Box::new(Failure {
            kind,
            target: Some(target),
            detail,
            hint: String::new(),
            code,
            source: Some(err),
        }))
    }

    /// Add what to do next to a "not found"; other errors pass through unchanged.
    pub fn with_hint(mut self, hint: &str) -> KubeError {
        if self.0.kind == ApiErrorKind::NotFound {
            self.0.hint = hint.to_string();
        }
        self
    }

    pub fn kind(&self) -> ApiErrorKind {
        self.0.kind
    }

    pub fn target(&self) -> Option<&Target> {
        self.0.target.as_ref()
    }

    /// The HTTP status code, when the server answered.
    pub fn code(&self) -> Option<u16> {
        self.0.code
    }

    /// The error as kube returned it.
    pub fn kube_error(&self) -> Option<&kube::Error> {
        self.0.source.as_ref()
    }
}

impl std::error::Error for KubeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0
            .source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let detail = &self.0.detail;
        let Some(target) = &self.0.target else {
            return f.write_str(detail);
        };
        let (verb, resource) = (target.verb, &target.resource);
        match self.0.kind {
            ApiErrorKind::Config | ApiErrorKind::Invalid => f.write_str(detail),
            ApiErrorKind::CrdsMissing => write!(
                f,
                "the portalloc.dev CRDs are not installed in this cluster ({resource} is unknown to the API \
                 server): run `kubectl portalloc install`, or `kubectl apply --server-side -f crds/portalloc-crds.yaml`"
            ),
            ApiErrorKind::Forbidden => write!(
                f,
                "forbidden: you may not {verb} {resource}{}: {detail}. Ask a cluster administrator to bind \
                 the portalloc ClusterRoles (see rbac/ in the kubectl-portalloc repository)",
                target.scope()
            ),
            ApiErrorKind::NotFound => write!(
                f,
                "{} {:?} not found{}{}",
                target.kind,
                target.name(),
                target.scope(),
                self.0.hint
            ),
            ApiErrorKind::Unavailable => write!(
                f,
                "the API server is unavailable while trying to {verb} {resource}: {detail} (safe to retry)"
            ),
            ApiErrorKind::Conflict => write!(
                f,
                "{} {:?}{} was changed by another client while this command was updating it ({verb} \
                 {resource}: {detail}): running the command again is safe",
                target.kind,
                target.name(),
                target.scope()
            ),
            ApiErrorKind::Other => write!(f, "{verb} {resource}: {detail}"),
        }
    }
}

/// The kind of an answer from the server, and the detail its message should carry.
fn classify_status(response: &Status) -> (ApiErrorKind, String) {
    let status = response.message.clone();
    match response.code {
        403 => (ApiErrorKind::Forbidden, status),
        404 if is_unknown_resource(response) => (ApiErrorKind::CrdsMissing, status),
        404 => (ApiErrorKind::NotFound, status),
        409 if response.is_conflict() => (ApiErrorKind::Conflict, status),
        409 => (ApiErrorKind::Other, format!("conflict: {status}")),
        400 | 422 => (ApiErrorKind::Invalid, status),
        429 | 500 | 503 | 504 => (ApiErrorKind::Unavailable, status),
        code => (ApiErrorKind::Other, format!("{status} (HTTP {code})")),
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

/// How long the server asked us to wait (`Retry-After`, carried in the Status details of a
/// 429 or 503), if it did.
pub fn server_retry_after(err: &kube::Error) -> Option<Duration> {
    match err {
        kube::Error::Api(status) => status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(u64::from(s))),
        _ => None,
    }
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

    fn target() -> Target {
        Target {
            verb: "update",
            resource: "portallocations.portalloc.dev".into(),
            kind: "PortAllocation",
            name: Some("a".into()),
            namespace: Some("ns".into()),
        }
    }

    #[test]
    fn a_conflict_names_the_object_and_says_a_rerun_is_safe() {
        let err = KubeError::from_kube(
            status(409, "Conflict", "the object has been modified"),
            target(),
        );
        assert_eq!(err.kind(), ApiErrorKind::Conflict);
        assert_eq!(err.code(), Some(409));
        assert!(matches!(err.kube_error(), Some(kube::Error::Api(_))));
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
        let exists = KubeError::from_kube(status(409, "AlreadyExists", "already exists"), target());
        assert_eq!(exists.kind(), ApiErrorKind::Other);
    }

    #[test]
    fn a_missing_object_differs_from_a_missing_resource_and_takes_a_hint() {
        let mut gone = Status {
            code: 404,
            reason: "NotFound".into(),
            message: "portallocations.portalloc.dev \"a\" not found".into(),
            ..Default::default()
        };
        gone.details = Some(serde_json::from_value(serde_json::json!({"name": "a"})).unwrap());
        let err = KubeError::from_kube(kube::Error::Api(Box::new(gone)), target())
            .with_hint(": list them with `kubectl portalloc get -A`");
        assert_eq!(err.kind(), ApiErrorKind::NotFound);
        assert_eq!(
            err.to_string(),
            "PortAllocation \"a\" not found in namespace \"ns\": list them with `kubectl portalloc get -A`"
        );
        let unknown = KubeError::from_kube(status(404, "", "404 page not found"), target());
        assert_eq!(unknown.kind(), ApiErrorKind::CrdsMissing);
    }

    #[test]
    fn retry_after_comes_from_the_status_details() {
        let mut busy = Status {
            code: 429,
            message: "too many requests".into(),
            ..Default::default()
        };
        busy.details =
            Some(serde_json::from_value(serde_json::json!({"retryAfterSeconds": 2})).unwrap());
        let err = kube::Error::Api(Box::new(busy));
        assert_eq!(server_retry_after(&err), Some(Duration::from_secs(2)));
        assert_eq!(server_retry_after(&status(409, "Conflict", "x")), None);
    }
}

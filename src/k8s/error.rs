//! API failures as data: what kind of failure, which request on which object, the server's own
//! words and the `kube::Error` itself. Rendered as one line that says what to do next.

use std::fmt;
use std::time::Duration;

use kube::core::Status;

use super::granting_roles;

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
            other => (ApiErrorKind::Other, render_kube_error(other), None),
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

/// A leaf of any error chain: its message already says all the `kube::Error` in it says (in
/// words), and a wrapper that is `#[error(transparent)]` would otherwise hand that error on as a
/// cause of its own, to be said twice. [`KubeError::kube_error`] gives it to those who need it.
impl std::error::Error for KubeError {}

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
                "forbidden: you may not {verb} {resource}{}: {}. {}",
                target.scope(),
                forbidden_reason(detail),
                self.granted_by()
            ),
            ApiErrorKind::NotFound => match self.missing_namespace() {
                Some(ns) => write!(
                    f,
                    "namespace {ns:?} does not exist (needed to {verb} {} {:?}): create it with \
                     `kubectl create namespace {ns}`, or choose another with -n",
                    target.kind,
                    target.name()
                ),
                None => write!(
                    f,
                    "{} {:?} not found{}{}",
                    target.kind,
                    target.name(),
                    target.scope(),
                    self.0.hint
                ),
            },
            ApiErrorKind::Unavailable => match self.unreachable_server() {
                Some(server) => write!(
                    f,
                    "the API server at {server} is unavailable (no answer) while trying to {verb} \
                     {resource}: {detail}. Check that the cluster is running and that --context or \
                     --kubeconfig selects it (safe to retry)"
                ),
                None => write!(
                    f,
                    "the API server is unavailable while trying to {verb} {resource}: {detail} (safe to retry)"
                ),
            },
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

impl KubeError {
    /// The namespace a write was refused for because it does not exist: the server answers 404
    /// naming the namespace, not the object.
    fn missing_namespace(&self) -> Option<&str> {
        let target = self.0.target.as_ref()?;
        let Some(kube::Error::Api(status)) = &self.0.source else {
            return None;
        };
        let details = status.details.as_ref()?;
        let ns = target.namespace.as_deref()?;
        (details.kind == "namespaces" && details.name == ns).then_some(ns)
    }

    /// The API server's URL, when the request never got an answer from it.
    fn unreachable_server(&self) -> Option<&str> {
        let mut source = std::error::Error::source(self.0.source.as_ref()?);
        while let Some(cause) = source {
            if let Some(unreachable) = cause.downcast_ref::<Unreachable>() {
                return Some(&unreachable.server);
            }
            source = cause.source();
        }
        None
    }

    /// Which of our roles grants the refused request (the server's own words name it most
    /// exactly, the target otherwise), and what to do.
    fn granted_by(&self) -> String {
        let Some(target) = &self.0.target else {
            return String::new();
        };
        let (verb, group, resource) = match refused_request(&self.0.detail) {
            Some((verb, group, resource)) => (verb, group, resource),
            None => {
                let (group, resource) = granting_roles::split_resource(&target.resource);
                (target.verb.to_string(), group.to_string(), resource)
            }
        };
        let roles = granting_roles::granting(&verb, &group, &resource, target.name.as_deref());
        // A role bound in one namespace does not grant a request across all of them.
        let where_ = match &target.namespace {
            Some(ns) => format!(" in namespace {ns:?} (a RoleBinding)"),
            None => " cluster-wide (a ClusterRoleBinding)".to_string(),
        };
        match roles.as_slice() {
            [] => "No role of kubectl-portalloc grants it (see rbac/ for what each allows): ask a \
                   cluster administrator for this right"
                .to_string(),
            [one] => {
                format!("{one} grants it: ask a cluster administrator to bind it to you{where_}")
            }
            many => format!(
                "{} grant it: ask a cluster administrator to bind one to you{where_}",
                many.join(", ")
            ),
        }
    }
}

/// The server's reason without its lead-in: `portpools.portalloc.dev "x" is forbidden: User
/// "u" cannot ...` -> `User "u" cannot ...` (the line already says what was forbidden).
fn forbidden_reason(message: &str) -> &str {
    message
        .split_once(" is forbidden: ")
        .map_or(message, |(_, reason)| reason)
}

/// (verb, API group, resource[/subresource]) from the server's `cannot VERB resource "R" in
/// API group "G"`.
fn refused_request(message: &str) -> Option<(String, String, String)> {
    let rest = message.split_once(" cannot ")?.1;
    let (verb, rest) = rest.split_once(" resource \"")?;
    let (resource, rest) = rest.split_once('"')?;
    let group = rest
        .split_once("in API group \"")
        .and_then(|(_, g)| g.split_once('"'))
        .map_or("", |(g, _)| g);
    Some((verb.to_string(), group.to_string(), resource.to_string()))
}

/// A request that got no answer from the API server at `server` (refused, reset, timed out,
/// TLS failed): set by the client's outermost layer, so a message can name where it dialled.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach the API server at {server}")]
pub struct Unreachable {
    pub server: String,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
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
    let chain = render_kube_error(err);
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

/// A `kube::Error` in words, on one line: the server's message once (kube's own Display adds
/// the reason and the whole Status in Rust debug form), or the transport's causes without
/// kube's variant names. Every message and log line that carries a kube error goes through it.
pub fn render_kube_error(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => status_text(status),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => {
            let mut parts: Vec<String> = Vec::new();
            let mut source = std::error::Error::source(err);
            while let Some(cause) = source {
                // The server's URL is said by the message around this one.
                if !cause.is::<Unreachable>() {
                    push_new(&mut parts, cause.to_string());
                }
                source = cause.source();
            }
            if parts.is_empty() {
                err.to_string()
            } else {
                parts.join(": ")
            }
        }
        other => {
            let mut parts = vec![other.to_string()];
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                push_new(&mut parts, cause.to_string());
                source = cause.source();
            }
            parts.join(": ")
        }
    }
}

/// The server's message once; a body that was not a Status (a proxy's page, `404 page not
/// found`) by its first line.
fn status_text(status: &Status) -> String {
    let message = status.message.lines().next().unwrap_or_default().trim();
    match (message.is_empty(), status.reason.is_empty()) {
        (false, _) => message.to_string(),
        (true, false) if status.reason != "Failed to parse error data" => {
            format!("{} (HTTP {})", status.reason, status.code)
        }
        _ => format!("HTTP {}", status.code),
    }
}

/// Append `text` unless what is there already says it.
fn push_new(parts: &mut Vec<String>, text: String) {
    if !parts.iter().any(|p| p.contains(&text)) {
        parts.push(text);
    }
}

/// `e: cause: cause` on one line; hyper's top-level messages alone are too vague. A
/// [`KubeError`] in the chain says everything below it itself; a `kube::Error` (or a Status)
/// is put in words by [`render_kube_error`], also where an error above embeds its text.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut level = Some(err);
    while let Some(cause) = level {
        if cause.is::<KubeError>() {
            push_new(&mut parts, cause.to_string());
            break;
        }
        let (raw, words) = if let Some(kube) = cause.downcast_ref::<kube::Error>() {
            (kube.to_string(), render_kube_error(kube))
        } else if let Some(status) = cause.downcast_ref::<Status>() {
            (status.to_string(), status_text(status))
        } else {
            push_new(&mut parts, cause.to_string());
            level = cause.source();
            continue;
        };
        for part in &mut parts {
            *part = part.replace(&raw, &words);
        }
        push_new(&mut parts, words);
        break;
    }
    parts.join(": ")
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;

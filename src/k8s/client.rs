//! Building a client the way kubectl does (`--kubeconfig`, `--context`, `KUBECONFIG`,
//! in-cluster), and the parameters every write of ours carries.

use std::fmt::Display;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::{Layer, Service};

use super::KubeError;
use super::error::Unreachable;

/// The kubectl-style flags that pick a cluster and bound each request.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// Bounds every single request (connect, read, write); `None` keeps kube's defaults.
    pub request_timeout: Option<Duration>,
    /// Where copies of shards and pool specs are kept between commands (kubectl's
    /// `--cache-dir`); `None`: not kept.
    pub cache_dir: Option<PathBuf>,
}

/// A client for the selected cluster.
pub struct Connection {
    pub client: Client,
    /// The namespace the selected context defaults to.
    pub namespace: String,
    /// This cluster's directory under `ClientOptions::cache_dir`.
    pub cache_dir: Option<PathBuf>,
}

/// The field manager name our writes are recorded under.
pub const FIELD_MANAGER: &str = "kubectl-portalloc";

/// Parameters of every create and replace: recorded under [`FIELD_MANAGER`] in `managedFields`
/// (without one the API server files our writes under "unknown").
pub(crate) fn write_params() -> kube::api::PostParams {
    kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// `object` without its `managedFields`: often a third of its size, read by nothing here, and a
/// write that omits them leaves the stored ones as they are. For objects that are kept (written
/// objects handed back, shards held in a record or remembered).
pub(crate) fn lean<K: kube::Resource>(mut object: K) -> K {
    object.meta_mut().managed_fields = None;
    object
}

/// One line: a YAML error from the kubeconfig parser carries a multi-line source excerpt after
/// its first line, which says all that is needed ("line 2 column 11: unclosed bracket").
fn config_error(message: String) -> KubeError {
    let message = message
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end()
        .to_string();
    KubeError::config(message)
}

/// A `--context` the kubeconfig does not have, named with the contexts it has (as `kubectl
/// config get-contexts` lists them). A kubeconfig that cannot be read is left to kube's own
/// error.
fn unknown_context(kubeconfig: &Kubeconfig, context: &str, source: &str) -> Option<KubeError> {
    if kubeconfig.contexts.iter().any(|c| c.name == context) {
        return None;
    }
    let names: Vec<&str> = kubeconfig
        .contexts
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let there = match names.as_slice() {
        [] => "it has no contexts".to_string(),
        names => format!("its contexts: {}", names.join(", ")),
    };
    Some(KubeError::config(format!(
        "context {context:?} is not in the kubeconfig ({source}); {there}. Pick one with \
         --context, or list them with `kubectl config get-contexts`"
    )))
}

/// Where kube reads the kubeconfig from without `--kubeconfig`, for messages.
fn kubeconfig_source() -> String {
    match std::env::var("KUBECONFIG") {
        Ok(paths) if !paths.is_empty() => format!("KUBECONFIG={paths}"),
        _ => "~/.kube/config".to_string(),
    }
}

/// A client, the namespace the selected context defaults to, and the cluster's cache directory.
pub async fn connect(options: &ClientOptions) -> Result<Connection, KubeError> {
    let kube_options = KubeConfigOptions {
        context: options.context.clone(),
        ..Default::default()
    };
    let mut config = match (&options.kubeconfig, &options.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                config_error(format!("cannot read kubeconfig {}: {e}", path.display()))
            })?;
            if let Some(context) = &options.context
                && let Some(e) = unknown_context(&kubeconfig, context, &path.display().to_string())
            {
                return Err(e);
            }
            Config::from_custom_kubeconfig(kubeconfig, &kube_options)
                .await
                .map_err(|e| config_error(format!("kubeconfig {}: {e}", path.display())))?
        }
        (None, Some(context)) => {
            if let Ok(kubeconfig) = Kubeconfig::read()
                && let Some(e) = unknown_context(&kubeconfig, context, &kubeconfig_source())
            {
                return Err(e);
            }
            Config::from_kubeconfig(&kube_options)
                .await
                .map_err(|e| config_error(format!("kubeconfig: {e}")))?
        }
        (None, None) => Config::infer().await.map_err(|e| {
            config_error(format!(
                "no cluster configured ({e}): set KUBECONFIG, pass --kubeconfig, or run inside a pod"
            ))
        })?,
    };
    if let Some(timeout) = options.request_timeout {
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
    }
    let namespace = config.default_namespace.clone();
    let cache_dir = options
        .cache_dir
        .as_deref()
        .map(|base| super::record::cluster_cache_dir(base, &config.cluster_url.to_string()));
    let log = RequestLog::new(&config.cluster_url.to_string());
    let client = ClientBuilder::try_from(config)
        .map_err(|e| config_error(format!("cannot build a client for the cluster: {e}")))?
        .with_layer(&log)
        .build();
    Ok(Connection {
        client,
        namespace,
        cache_dir,
    })
}

/// One DEBUG line per API request (`-v 2`), as kubectl's `-v 6` prints: method, path with its
/// query, HTTP status and the time until the response headers arrived, e.g.
/// `GET /apis/portalloc.dev/v1alpha1/portpools/p 200 4.1ms`. It wraps kube's whole stack, so the
/// path is still relative to the cluster URL, and a request kube retries itself (429, 503, 504)
/// is one line with the last attempt's status and the time of all attempts.
///
/// A request that gets no answer fails as [`Unreachable`], naming the server it dialled, so the
/// message can say where (kube's transport errors do not).
#[derive(Clone, Debug)]
pub struct RequestLog {
    server: Arc<str>,
}

impl RequestLog {
    pub fn new(server: &str) -> RequestLog {
        RequestLog {
            server: server.trim_end_matches('/').into(),
        }
    }
}

impl<S> Layer<S> for RequestLog {
    type Service = RequestLogService<S>;

    fn layer(&self, inner: S) -> RequestLogService<S> {
        RequestLogService {
            inner,
            server: self.server.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct RequestLogService<S> {
    inner: S,
    server: Arc<str>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// kube's own errors (raised by its layers below, e.g. authentication) pass as they are, so
/// kube still classifies them; everything else is a request the server never answered.
fn unreachable(server: &str, error: impl Into<BoxError>) -> BoxError {
    let error = error.into();
    if error.is::<kube::Error>() {
        return error;
    }
    Box::new(Unreachable {
        server: server.to_string(),
        source: error,
    })
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, RequestBody, ResponseBody> Service<Request<RequestBody>> for RequestLogService<S>
where
    S: Service<Request<RequestBody>, Response = Response<ResponseBody>>,
    S::Future: Send + 'static,
    S::Error: Display + Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        let server = self.server.clone();
        self.inner
            .poll_ready(cx)
            .map_err(|e| unreachable(&server, e))
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let server = self.server.clone();
        if !tracing::enabled!(tracing::Level::DEBUG) {
            let response = self.inner.call(request);
            return Box::pin(async move { response.await.map_err(|e| unreachable(&server, e)) });
        }
        let method = request.method().clone();
        let path = shown_path(request.uri());
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let took = started.elapsed();
            match &result {
                Ok(response) => {
                    tracing::debug!("{method} {path} {} {took:.1?}", response.status().as_u16());
                }
                Err(error) => tracing::debug!("{method} {path} failed after {took:.1?}: {error}"),
            }
            result.map_err(|e| unreachable(&server, e))
        })
    }
}

/// The path and query as sent, without the empty query kube leaves (`/x?`, `/x?&limit=5`).
fn shown_path(uri: &http::Uri) -> String {
    let query = uri.query().unwrap_or_default().trim_start_matches('&');
    if query.is_empty() {
        uri.path().to_string()
    } else {
        format!("{}?{query}", uri.path())
    }
}

#[cfg(test)]
mod tests {
    use std::future::{Ready, ready};
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use http::StatusCode;
    use tracing::level_filters::LevelFilter;

    use super::*;

    /// A stand-in for kube's stack: answers every request with `answer`.
    struct Answer(Result<StatusCode, &'static str>);

    impl Service<Request<()>> for Answer {
        type Response = Response<()>;
        type Error = &'static str;
        type Future = Ready<Result<Response<()>, &'static str>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            ready(self.0.map(|status| {
                let mut response = Response::new(());
                *response.status_mut() = status;
                response
            }))
        }
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the layer logs for one request through `inner`, with events up to `level` shown.
    async fn logged(level: LevelFilter, inner: Answer, method: &str, uri: &str) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let request = Request::builder().method(method).uri(uri).body(()).unwrap();
        let _ = RequestLog::new("https://10.0.0.1:6443")
            .layer(inner)
            .call(request)
            .await;
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    fn words(line: &str) -> Vec<&str> {
        line.split_whitespace().collect()
    }

    #[tokio::test]
    async fn one_line_per_request_with_method_path_status_and_time() {
        let path = "/apis/portalloc.dev/v1alpha1/portpools/p?fieldSelector=a%3Db&limit=5";
        // kube starts every query with `&`; the line shows the query as one would write it.
        let sent = path.replace('?', "?&");
        let out = logged(LevelFilter::DEBUG, Answer(Ok(StatusCode::OK)), "GET", &sent).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let first = words(lines[0]);
        assert_eq!(
            &first[..5],
            ["DEBUG", "portalloc::k8s::client:", "GET", path, "200"]
        );
        let took = first[5];
        assert!(
            took.ends_with('s')
                && took
                    .trim_end_matches(char::is_alphabetic)
                    .parse::<f64>()
                    .is_ok(),
            "{took:?}"
        );

        // The cluster URL's scheme and host are not part of the line; a failure says why.
        let out = logged(
            LevelFilter::DEBUG,
            Answer(Err("connection refused")),
            "PUT",
            "https://10.0.0.1:6443/api/v1/namespaces/a?",
        )
        .await;
        let failed = words(&out);
        assert_eq!(
            &failed[2..6],
            ["PUT", "/api/v1/namespaces/a", "failed", "after"]
        );
        assert!(out.trim_end().ends_with(": connection refused"), "{out}");
    }

    #[tokio::test]
    async fn nothing_below_debug() {
        let out = logged(
            LevelFilter::INFO,
            Answer(Ok(StatusCode::NOT_FOUND)),
            "GET",
            "/x",
        )
        .await;
        assert_eq!(out, "");
    }
}

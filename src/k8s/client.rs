//! Building a client the way kubectl does: `--kubeconfig`, `--context`, `KUBECONFIG`, in-cluster.

use std::path::PathBuf;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::KubeError;

/// The kubectl-style flags that pick a cluster and bound each request.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// Bounds every single request (connect, read, write); `None` keeps kube's defaults.
    pub request_timeout: Option<Duration>,
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

/// A client and the namespace the selected context defaults to.
pub async fn connect(options: &ClientOptions) -> Result<(Client, String), KubeError> {
    let kube_options = KubeConfigOptions {
        context: options.context.clone(),
        ..Default::default()
    };
    let mut config = match (&options.kubeconfig, &options.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                config_error(format!("cannot read kubeconfig {}: {e}", path.display()))
            })?;
            Config::from_custom_kubeconfig(kubeconfig, &kube_options)
                .await
                .map_err(|e| config_error(format!("kubeconfig {}: {e}", path.display())))?
        }
        (None, Some(_)) => Config::from_kubeconfig(&kube_options)
            .await
            .map_err(|e| config_error(format!("kubeconfig: {e}")))?,
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
    let client = Client::try_from(config)
        .map_err(|e| config_error(format!("cannot build a client for the cluster: {e}")))?;
    Ok((client, namespace))
}

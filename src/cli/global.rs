//! Flags every subcommand takes, named and behaving as kubectl's.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::duration::parse_duration;
use crate::k8s::ClientOptions;

#[derive(Args, Clone, Debug, Default)]
pub struct GlobalArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,

    /// Namespace of PortAllocations (default: the context's namespace).
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Bound on each API request, e.g. 30s, 1m30s, 500ms, or seconds ("0" means no bound).
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_duration)]
    pub request_timeout: Option<Duration>,

    /// Where to keep copies of pool shards between commands, as kubectl keeps discovery: a
    /// command then starts from the shard the last one wrote (default: $KUBECACHEDIR, else
    /// ~/.kube/cache; "" keeps nothing). A stale copy costs one retry, never a wrong port.
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        value_parser = clap::builder::TypedValueParser::map(clap::builder::OsStringValueParser::new(), PathBuf::from)
    )]
    pub cache_dir: Option<PathBuf>,

    /// Log verbosity on stderr: 0 warnings only, 1 what the command decided, 2 also each API
    /// request (method, path, status, duration), 3 and up everything, the client's internals too.
    #[arg(
        short = 'v',
        long = "v",
        global = true,
        value_name = "LEVEL",
        default_value_t = 0
    )]
    pub verbosity: u8,
}

impl GlobalArgs {
    pub fn client_options(&self) -> ClientOptions {
        ClientOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            request_timeout: self.request_timeout.filter(|t| !t.is_zero()),
            cache_dir: match &self.cache_dir {
                Some(dir) if dir.as_os_str().is_empty() => None,
                Some(dir) => Some(dir.clone()),
                None => default_cache_dir(),
            },
        }
    }
}

/// kubectl's default cache directory: `$KUBECACHEDIR`, else `~/.kube/cache`.
fn default_cache_dir() -> Option<PathBuf> {
    match std::env::var_os("KUBECACHEDIR") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(|home| PathBuf::from(home).join(".kube").join("cache")),
    }
}

//! What every verb that talks to the cluster needs: a client, the namespace, an allocator.

use kube::Client;

use super::GlobalArgs;
use crate::k8s::{self, Allocator};

pub struct Session {
    pub client: Client,
    /// `-n`, else the context's namespace.
    pub namespace: String,
    pub allocator: Allocator,
    pub verbosity: u8,
}

impl Session {
    pub async fn connect(global: &GlobalArgs) -> anyhow::Result<Session> {
        let connection = k8s::connect(&global.client_options()).await?;
        let (client, default_namespace) = (connection.client, connection.namespace);
        let mut allocator = Allocator::new(client.clone()).cache_dir(connection.cache_dir);
        if let Some(timeout) = global.request_timeout.filter(|t| !t.is_zero()) {
            // A retry budget longer than the user's patience would hide the timeout they asked for.
            allocator.policy.max_elapsed = allocator.policy.max_elapsed.min(timeout * 4);
        }
        Ok(Session {
            client,
            namespace: global.namespace.clone().unwrap_or(default_namespace),
            allocator,
            verbosity: global.verbosity,
        })
    }
}

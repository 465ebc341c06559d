//! The Allocator decides against the shard its last write returned instead of reading it again;
//! a copy another writer made stale costs one 409 and a fresh read, never a port held twice.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use portalloc::api::PortAllocation;
use portalloc::k8s::Allocator;

use crate::support::invariants::assert_consistent;
use crate::support::{self, simple_allocation};

pub type Log = Arc<Mutex<Vec<String>>>;

/// Records `METHOD /path` of every request, then passes it on.
#[derive(Clone)]
struct Recorder<S> {
    inner: S,
    log: Log,
}

impl<S, B> tower::Service<http::Request<B>> for Recorder<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let line = format!("{} {}", request.method(), request.uri().path());
        self.log.lock().unwrap().push(line);
        self.inner.call(request)
    }
}

pub async fn recording_client() -> (Client, Log) {
    let file = Kubeconfig::read_from(&support::cluster().kubeconfig).unwrap();
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .unwrap();
    let log = Log::default();
    let recorder = log.clone();
    let client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&tower::layer::layer_fn(move |inner| Recorder {
            inner,
            log: recorder.clone(),
        }))
        .build();
    (client, log)
}

/// The requests since the last call, as `GET pool`, `GET shard`, `PUT shard/status` (any
/// shard), `GET shards` (a LIST), `PUT status` (a PortAllocation's).
pub fn taken(log: &Log, pool: &str) -> Vec<String> {
    let pool_path = format!("/apis/portalloc.dev/v1alpha1/portpools/{pool}");
    log.lock()
        .unwrap()
        .drain(..)
        .map(|line| {
            let (verb, path) = line.split_once(' ').unwrap();
            let status = if path.ends_with("/status") {
                "/status"
            } else {
                ""
            };
            if path.ends_with("/portpoolshards") {
                format!("{verb} shards")
            } else if path.contains("/portpoolshards/") {
                format!("{verb} shard{status}")
            } else if path.contains("/portallocations/") && !status.is_empty() {
                format!("{verb} status")
            } else {
                line.replace(&pool_path, "pool")
            }
        })
        .collect()
}

#[tokio::test]
async fn the_last_write_is_decided_against_and_a_stale_copy_costs_one_conflict() {
    let admin = support::client().await;
    let ns = support::namespace(&admin, "pool-cache").await;
    let pool = support::unique_name("pool-cache");
    // Window 141 (36096-36351): one shard, which carries the pool's spec.
    support::create_pool(&pool, "36100-36199");
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), &ns);
    let create = |name: &str| {
        let pa: PortAllocation =
            serde_yaml::from_str(&simple_allocation(name, &pool, "web", 2, &["http"])).unwrap();
        let api = api.clone();
        async move { api.create(&PostParams::default(), &pa).await.unwrap() }
    };
    let (client, log) = recording_client().await;
    let ours = Allocator::new(client);
    let other = Allocator::new(admin.clone());

    // A new object's home is computed from the pool's spec: read once, then remembered.
    let first = ours.sync(create("first").await).await.unwrap();
    assert_eq!(first.conflicts, 0);
    assert_eq!(
        taken(&log, &pool),
        ["GET pool", "GET shard", "PUT shard/status", "PUT status"]
    );

    // The response to that write is the shard now: no read before the next allocation.
    let second = ours.sync(create("second").await).await.unwrap();
    assert_eq!((second.conflicts, second.holdings.len()), (0, 2));
    assert_eq!(taken(&log, &pool), ["PUT shard/status", "PUT status"]);

    // Another client writes the shard: our copy is stale, which the write's 409 tells.
    other.sync(create("other").await).await.unwrap();
    let third = ours.sync(create("third").await).await.unwrap();
    assert_eq!(third.conflicts, 1);
    assert_eq!(
        taken(&log, &pool),
        [
            "PUT shard/status",
            "GET shard",
            "PUT shard/status",
            "PUT status"
        ]
    );

    // Nothing to write: no compare-and-swap would check the copy, so it is read afresh.
    let again = ours.sync(third.allocation.clone()).await.unwrap();
    assert_eq!((again.allocated, again.holdings), (0, third.holdings));
    assert_eq!(taken(&log, &pool), ["GET shard"]);

    let held = assert_consistent(&admin, &pool).await;
    assert_eq!(held.values().map(|h| h.len()).sum::<usize>(), 8);

    // Off: every allocation reads the pool and its shard first.
    let (client, log) = recording_client().await;
    let reading = Allocator::new(client).remember_shards(false);
    reading.sync(create("fourth").await).await.unwrap();
    reading.sync(create("fifth").await).await.unwrap();
    assert_eq!(
        taken(&log, &pool),
        ["GET pool", "GET shard", "PUT shard/status", "PUT status"].repeat(2)
    );
}

/// The `-v 2` request log of one CLI run, named as [`taken`] names them (`PUT status` is the
/// PortAllocation's), a PortAllocation's create or read as `POST object` or `GET object`.
fn requests_of(stderr: &str, pool: &str) -> Vec<String> {
    let log = Log::default();
    for line in stderr.lines() {
        // "DEBUG GET /apis/... 200 4.1ms"
        let mut words = line
            .split_whitespace()
            .skip_while(|w| !matches!(*w, "GET" | "PUT" | "POST" | "DELETE"));
        if let (Some(verb), Some(path)) = (words.next(), words.next()) {
            let path = path.split('?').next().unwrap_or(path);
            log.lock().unwrap().push(format!("{verb} {path}"));
        }
    }
    taken(&log, pool)
        .into_iter()
        .map(|r| {
            let verb = r.split(' ').next().unwrap_or_default().to_string();
            if r.ends_with("/portallocations") || r.contains("/portallocations/") {
                format!("{verb} object")
            } else {
                r
            }
        })
        .collect()
}

/// A CLI command keeps the shard it wrote (and the pool's spec) in its cache directory, so the
/// next command starts from them: a create is then 3 requests (4 with an empty cache), a fresh
/// object's sync 3, a sync with nothing to do 2; a copy another client made stale costs one 409
/// and one read.
#[tokio::test]
async fn cli_commands_start_from_the_shard_the_last_one_wrote() {
    let admin = support::client().await;
    let ns = support::namespace(&admin, "cli-cache").await;
    let pool = support::unique_name("cli-cache");
    // Window 141 again: one shard.
    support::create_pool(&pool, "36200-36299");
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_str().unwrap();
    let cli = |args: &[&str], stdin: Option<String>| {
        let mut all = vec!["--cache-dir", dir, "-v", "2", "-n", &ns];
        all.extend_from_slice(args);
        let run = match stdin {
            Some(text) => support::cli::run_stdin(&all, &text),
            None => support::cli::run(&all),
        };
        assert!(run.ok(), "{args:?}: {run}");
        requests_of(&run.stderr, &pool)
    };
    let manifest = |name: &str| simple_allocation(name, &pool, "web", 2, &["http"]);

    // An empty cache: one LIST of the pool's shards, which carry its spec; a pool of one
    // window is read whole, and the allocation after the create decides on that LIST.
    assert_eq!(
        cli(&["create", "-f", "-"], Some(manifest("a"))),
        [
            "GET shards",
            "POST object",
            "PUT shard/status",
            "PUT status"
        ]
    );
    // From the copies the last command kept.
    assert_eq!(
        cli(&["create", "-f", "-"], Some(manifest("b"))),
        ["POST object", "PUT shard/status", "PUT status"]
    );

    // A freshly applied object (as GitOps leaves it): GET it, write the shard, its status.
    let api: Api<PortAllocation> = Api::namespaced(admin.clone(), &ns);
    let fresh: PortAllocation = serde_yaml::from_str(&manifest("c")).unwrap();
    api.create(&PostParams::default(), &fresh).await.unwrap();
    assert_eq!(
        cli(&["sync", "c"], None),
        ["GET object", "PUT shard/status", "PUT status"]
    );
    // Nothing to do: the object, and the shard read afresh (no compare-and-swap checks it).
    assert_eq!(cli(&["sync", "c"], None), ["GET object", "GET shard"]);

    // Another client (no cache) writes the shard: the next command's copy is stale.
    let run = support::cli::run_stdin(
        &["--cache-dir", "", "create", "-f", "-", "-n", &ns],
        &manifest("d"),
    );
    assert!(run.ok(), "{run}");
    let stale = cli(&["create", "-f", "-"], Some(manifest("e")));
    assert_eq!(
        stale
            .iter()
            .filter(|r| r.contains("shard"))
            .collect::<Vec<_>>(),
        ["PUT shard/status", "GET shard", "PUT shard/status"],
        "{stale:?}"
    );
    let held = assert_consistent(&admin, &pool).await;
    assert_eq!(held.values().map(|h| h.len()).sum::<usize>(), 10);
}

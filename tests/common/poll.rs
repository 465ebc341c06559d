//! Waiting for a condition in the cluster: poll, fail the test past a deadline, and say how
//! long it took (the tests print those times) or what the wait ended on.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use kube::api::Api;
use serde::de::DeserializeOwned;

const EVERY: Duration = Duration::from_millis(20);

/// Poll `check` until it holds; how long that took. Panics after `within`, naming `what`.
pub async fn until<F, Fut>(what: &str, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(EVERY).await;
    }
    started.elapsed()
}

/// Poll until `check` holds for object `name` (`None`: it does not exist); how long that took.
/// Panics after `within`, showing the object as last read.
pub async fn until_object<K>(
    api: &Api<K>,
    name: &str,
    within: Duration,
    check: impl Fn(Option<&K>) -> bool,
) -> Duration
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let started = Instant::now();
    loop {
        let object = api.get_opt(name).await.unwrap();
        if check(object.as_ref()) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{} {name} never reached the state: {object:?}",
            K::kind(&())
        );
        tokio::time::sleep(EVERY).await;
    }
}

/// Retry `attempt` (a dry run) every 500 ms until the API server refuses it; the refusal.
/// Admission policies take effect a moment after they are created. Panics after 60 s.
pub async fn until_refused<F, Fut>(what: &str, attempt: F) -> String
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match attempt().await {
            Err(e) => return e.to_string(),
            Ok(()) => {
                assert!(Instant::now() < deadline, "{what}: never refused");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

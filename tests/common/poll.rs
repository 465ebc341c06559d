//! Waiting for a condition in the cluster: poll every 20 ms, fail the test past a deadline, and
//! say how long it took (the tests print those times). Include this file with `#[path]`, as
//! `control_plane.rs`.

#![allow(dead_code)]

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

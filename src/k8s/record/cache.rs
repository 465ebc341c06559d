//! The last copy of each shard an [`super::Allocator`] read or wrote, and of each pool's spec,
//! so the next allocation can skip the read: the response to a successful write already is the
//! current object. A CLI command is one short process, so it keeps its copies on disk too (as
//! kubectl keeps discovery under `~/.kube/cache`): the next command starts from them.
//!
//! A copy is only ever a guess. A write decided against it carries its resourceVersion, so a
//! stale copy costs one 409 and then a fresh read, never a wrong port. A decision that writes
//! nothing (unchanged, or a refusal) is not checked by any compare-and-swap, so the allocator
//! makes those only against a fresh read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::PortPoolShard;
use crate::ledger::PoolSnapshot;

/// Above this share of stale copies, read first (break-even: a stale copy costs two requests
/// more, a current one saves one).
const STALE_LIMIT: f64 = 0.5;
/// The weight of the newest outcome in the moving average.
const STALE_WEIGHT: f64 = 0.1;

/// The last shard objects, by name.
pub type ShardCache = ObjectCache<PortPoolShard>;
/// The newest spec of each pool seen (read, or carried by a shard), by pool name: what an
/// owner's home shard is computed from.
pub type PoolCache = ObjectCache<PoolSnapshot>;

/// Each copy by name, with when it was read or written if known.
type Copies<T> = HashMap<String, (T, Option<Instant>)>;

/// Shared by the clones of one Allocator (the watcher's tasks, `sync --all`'s batches).
#[derive(Clone, Debug)]
pub struct ObjectCache<T> {
    /// When each copy was read or written is what [`ObjectCache::get_recent`] goes by.
    objects: Arc<Mutex<Copies<T>>>,
    /// Where copies are kept between processes (`<name>.json`); `None`: memory only.
    dir: Option<PathBuf>,
    /// Off: every allocation reads first and trusts no copy (the benchmark compares both
    /// ways).
    disabled: bool,
    /// How often remembered copies were out of date lately (see [`ObjectCache::trusted`]).
    staleness: Arc<Mutex<f64>>,
}

impl<T> Default for ObjectCache<T> {
    fn default() -> Self {
        ObjectCache {
            objects: Arc::default(),
            dir: None,
            disabled: false,
            staleness: Arc::default(),
        }
    }
}

impl<T: Clone + Serialize + DeserializeOwned> ObjectCache<T> {
    pub fn disabled() -> ObjectCache<T> {
        ObjectCache {
            disabled: true,
            ..Default::default()
        }
    }

    /// Kept in `dir` as well, for the next process. A directory that cannot be written (a
    /// read-only root file system in a pod) leaves the cache in memory only.
    pub fn on_disk(dir: PathBuf) -> ObjectCache<T> {
        ObjectCache {
            dir: Some(dir),
            ..Default::default()
        }
    }

    /// Whether a remembered copy is worth deciding against. A current copy saves a read; a
    /// stale one costs a 409 and then the read. Where other clients write the same objects
    /// (16 allocators on a dozen shards), most copies are stale by the time they are used,
    /// so past half of them (a moving average of the last ~10 outcomes) reads come first.
    /// The caller keeps feeding [`ObjectCache::observe`] either way (a fresh read says
    /// whether the remembered copy was current), so trust comes back when contention ends.
    pub fn trusted(&self) -> bool {
        *self.staleness.lock().unwrap_or_else(|e| e.into_inner()) < STALE_LIMIT
    }

    /// One outcome: a remembered copy was current (`true`) or out of date.
    pub fn observe(&self, current: bool) {
        let mut staleness = self.staleness.lock().unwrap_or_else(|e| e.into_inner());
        let sample = if current { 0.0 } else { 1.0 };
        *staleness += STALE_WEIGHT * (sample - *staleness);
    }

    pub fn get(&self, name: &str) -> Option<T> {
        self.get_aged(name).map(|(object, _)| object)
    }

    /// The copy of `name` if it was read or written at most `max_age` ago (by this process, or
    /// by the last one, after the file's modification time).
    pub fn get_recent(&self, name: &str, max_age: Duration) -> Option<T> {
        self.get_aged(name)
            .filter(|(_, at)| at.is_some_and(|at| at.elapsed() <= max_age))
            .map(|(object, _)| object)
    }

    fn get_aged(&self, name: &str) -> Option<(T, Option<Instant>)> {
        if self.disabled {
            return None;
        }
        if let Some(entry) = self.lock().get(name) {
            return Some(entry.clone());
        }
        let path = self.file(name)?;
        let object: T = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        let at = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .and_then(|age| Instant::now().checked_sub(age));
        self.lock().insert(name.to_string(), (object.clone(), at));
        Some((object, at))
    }

    /// Keep `object` as the latest copy of `name`.
    pub fn remember(&self, name: &str, object: &T) {
        if self.disabled || name.is_empty() {
            return;
        }
        self.lock()
            .insert(name.to_string(), (object.clone(), Some(Instant::now())));
        if let Some(path) = self.file(name)
            && let Err(e) = write_atomically(&path, object)
        {
            tracing::debug!("cache {}: {e}", path.display());
        }
    }

    /// Replace the copy of `name` held in memory, if there is one and `replaces` approves
    /// (a watch event newer than the copy); the file, if any, waits for the next `remember`.
    pub fn refresh(&self, name: &str, object: &T, replaces: impl FnOnce(&T) -> bool) {
        if let Some((copy, at)) = self.lock().get_mut(name)
            && replaces(copy)
        {
            *copy = object.clone();
            *at = Some(Instant::now());
        }
    }

    pub fn forget(&self, name: &str) {
        self.lock().remove(name);
        if let Some(path) = self.file(name) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The file of `name`; names are Kubernetes object names (DNS subdomains), safe as file
    /// names.
    fn file(&self, name: &str) -> Option<PathBuf> {
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !name.starts_with('.');
        Some(self.dir.as_ref()?.join(format!("{name}.json"))).filter(|_| valid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Copies<T>> {
        // A panic elsewhere while holding the lock leaves a map that is still just a cache.
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Write through a temporary file and a rename, so a concurrent reader (another process) sees
/// the old copy or the new one, never half of one.
fn write_atomically(path: &Path, object: &impl Serialize) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, serde_json::to_vec(object)?)?;
    std::fs::rename(&tmp, path)
}

/// The cache directory for one cluster under `base` (kubectl's `--cache-dir`, by default
/// `~/.kube/cache`): `<base>/portalloc/<host_port>`, as kubectl names its discovery cache.
pub fn cluster_cache_dir(base: &Path, cluster_url: &str) -> PathBuf {
    let authority = cluster_url
        .split("://")
        .nth(1)
        .unwrap_or(cluster_url)
        .split('/')
        .next()
        .unwrap_or_default();
    let safe: String = authority
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    base.join("portalloc").join(safe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_latest_copy_and_forget_drops_it() {
        let cache: ObjectCache<u32> = ObjectCache::default();
        let clone = cache.clone();
        cache.remember("p", &1);
        clone.remember("p", &2);
        assert_eq!(cache.get("p"), Some(2));
        clone.forget("p");
        assert_eq!(cache.get("p"), None);
        let off: ObjectCache<u32> = ObjectCache::disabled();
        off.remember("p", &3);
        assert_eq!(off.get("p"), None);
    }

    #[test]
    fn a_copy_on_disk_reaches_the_next_process_and_forget_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let first: ObjectCache<u32> = ObjectCache::on_disk(dir.path().join("c"));
        first.remember("pool-12", &7);
        // A new cache over the same directory: what the next command starts from.
        let next: ObjectCache<u32> = ObjectCache::on_disk(dir.path().join("c"));
        assert_eq!(next.get("pool-12"), Some(7));
        next.forget("pool-12");
        assert_eq!(
            ObjectCache::<u32>::on_disk(dir.path().join("c")).get("pool-12"),
            None
        );
        // Only object names become files.
        first.remember("../x", &1);
        assert!(!dir.path().join("x.json").exists());
        assert_eq!(first.get("../x"), Some(1), "kept in memory all the same");
        // A corrupt file is no copy.
        std::fs::write(dir.path().join("c/bad.json"), "{").unwrap();
        assert_eq!(next.get("bad"), None);
    }

    #[test]
    fn a_recent_copy_is_one_read_or_written_lately_here_or_by_the_last_process() {
        let dir = tempfile::tempdir().unwrap();
        let cache: ObjectCache<u32> = ObjectCache::on_disk(dir.path().join("c"));
        cache.remember("pool-12", &7);
        let hour = Duration::from_secs(3600);
        assert_eq!(cache.get_recent("pool-12", hour), Some(7));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(cache.get_recent("pool-12", Duration::from_millis(10)), None);
        assert_eq!(cache.get("pool-12"), Some(7), "still there for get");
        // The next process dates a file by its modification time.
        let file = std::fs::File::options()
            .write(true)
            .open(dir.path().join("c/pool-12.json"))
            .unwrap();
        // (A minute: the monotonic clock cannot reach back before the machine started.)
        let minute = Duration::from_secs(60);
        file.set_modified(SystemTime::now() - minute).unwrap();
        let next: ObjectCache<u32> = ObjectCache::on_disk(dir.path().join("c"));
        assert_eq!(next.get_recent("pool-12", minute / 2), None);
        assert_eq!(next.get_recent("pool-12", 2 * minute), Some(7));
    }

    #[test]
    fn copies_stop_being_trusted_when_most_were_stale_and_trust_returns() {
        let cache: ObjectCache<u32> = ObjectCache::default();
        assert!(cache.trusted());
        let clone = cache.clone();
        for _ in 0..5 {
            clone.observe(false);
        }
        assert!(
            cache.trusted(),
            "a few stale copies are the price of the cache"
        );
        for _ in 0..5 {
            clone.observe(false);
        }
        assert!(!cache.trusted(), "mostly stale: read first");
        for _ in 0..10 {
            cache.observe(true);
        }
        assert!(cache.trusted(), "current again");
    }

    #[test]
    fn one_directory_per_cluster_named_by_host_and_port() {
        let base = Path::new("/home/u/.kube/cache");
        assert_eq!(
            cluster_cache_dir(base, "https://10.0.0.1:6443"),
            base.join("portalloc/10.0.0.1_6443")
        );
        assert_eq!(
            cluster_cache_dir(base, "https://api.example.com/prefix"),
            base.join("portalloc/api.example.com")
        );
    }
}

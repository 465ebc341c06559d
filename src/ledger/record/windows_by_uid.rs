//! Which windows of one copy each owner has an entry in, so finding an owner's shards is one
//! lookup instead of a search of every shard's holders. Pure.
//!
//! Worked out from the shards when first asked, kept current by the copy's own changes to an
//! owner's entries, and forgotten whenever a shard may have changed in a way it does not see
//! (a shard replaced, or handed out to change): the next question rebuilds it. At the envelope
//! a batch asks where each of 15,000 owners is across 32 copies of about 106 shards each;
//! searching them was a fifth of the decision.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// UID → the windows holding an entry of it (decoded or not), ascending.
#[derive(Clone, Debug, Default)]
pub struct WindowsByUid {
    /// Shared between clones of the record: a clone that changes an owner drops its own copy
    /// rather than copy the whole index.
    built: OnceLock<Arc<HashMap<String, Vec<u16>>>>,
}

impl WindowsByUid {
    /// The windows where `uid` has an entry; `build` lists every (window, uid) pair of the
    /// copy, in ascending window order, when the index is not known.
    pub fn windows_of<'a, I>(&self, uid: &str, build: impl FnOnce() -> I) -> Vec<u16>
    where
        I: Iterator<Item = (u16, &'a str)>,
    {
        let index = self.built.get_or_init(|| {
            let mut index: HashMap<String, Vec<u16>> = HashMap::new();
            for (window, uid) in build() {
                let windows = index.entry(uid.to_string()).or_default();
                if windows.last() != Some(&window) {
                    windows.push(window);
                }
            }
            Arc::new(index)
        });
        index.get(uid).cloned().unwrap_or_default()
    }

    /// `uid` now has entries in exactly `windows` (ascending).
    pub fn set(&mut self, uid: &str, windows: Vec<u16>) {
        let Some(index) = self.built.get_mut() else {
            return;
        };
        match Arc::get_mut(index) {
            Some(index) if windows.is_empty() => {
                index.remove(uid);
            }
            Some(index) => {
                index.insert(uid.to_string(), windows);
            }
            None => self.forget(),
        }
    }

    /// A shard changed in a way the index did not see: work it out again when next asked.
    pub fn forget(&mut self) {
        self.built = OnceLock::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs() -> Vec<(u16, &'static str)> {
        vec![(1, "a"), (1, "b"), (2, "a"), (2, "a"), (7, "c")]
    }

    #[test]
    fn built_from_the_shards_once_and_kept_by_changes() {
        let mut index = WindowsByUid::default();
        assert_eq!(index.windows_of("a", || pairs().into_iter()), vec![1, 2]);
        // Known now: the shards are not listed again.
        assert_eq!(index.windows_of("c", std::iter::empty), vec![7]);
        index.set("a", vec![3]);
        index.set("c", vec![]);
        assert_eq!(index.windows_of("a", std::iter::empty), vec![3]);
        assert!(index.windows_of("c", std::iter::empty).is_empty());
        assert!(index.windows_of("z", std::iter::empty).is_empty());
    }

    #[test]
    fn a_clone_that_changes_an_owner_rebuilds_and_leaves_the_original_alone() {
        let original = WindowsByUid::default();
        original.windows_of("a", || pairs().into_iter());
        let mut clone = original.clone();
        clone.set("a", vec![9]);
        assert_eq!(original.windows_of("a", std::iter::empty), vec![1, 2]);
        assert_eq!(
            clone.windows_of("a", || vec![(9, "a")].into_iter()),
            vec![9]
        );
    }

    #[test]
    fn forgetting_rebuilds_from_the_shards() {
        let mut index = WindowsByUid::default();
        index.windows_of("a", || pairs().into_iter());
        index.forget();
        assert_eq!(
            index.windows_of("a", || vec![(5, "a")].into_iter()),
            vec![5]
        );
    }
}

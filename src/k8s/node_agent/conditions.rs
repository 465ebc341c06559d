//! Conditions that last over many rounds (a Lease namespace that does not exist, a setting that
//! cannot be written, a pod whose ports cannot be read), each said when it starts, when what it
//! says changes, and when it ends: not once per round, five times a second. Pure; the agent
//! logs what [`Conditions::observe`] returns.

use std::collections::BTreeMap;

/// What a round's outcome changes in a condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// It holds now, and did not last round: say so, as a warning.
    Started(String),
    /// It still holds, with another message.
    Changed(String),
    /// It held until now; the message it last had.
    Ended(String),
}

/// The conditions holding now, by key, with the message each last had.
#[derive(Debug, Default)]
pub struct Conditions {
    holding: BTreeMap<String, String>,
}

impl Conditions {
    /// This round's outcome for `key`: `Err(message)` while the condition holds, `Ok` when it
    /// does not; `None` when nothing changed.
    pub fn observe(&mut self, key: &str, outcome: Result<(), String>) -> Option<Transition> {
        match outcome {
            Err(message) => match self.holding.insert(key.to_string(), message.clone()) {
                None => Some(Transition::Started(message)),
                Some(before) if before != message => Some(Transition::Changed(message)),
                Some(_) => None,
            },
            Ok(()) => self.holding.remove(key).map(Transition::Ended),
        }
    }

    /// End, without a word, the conditions whose key `keep` refuses (those of a pod that is
    /// gone: what was wrong with it no longer matters).
    pub fn forget_unless(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.holding.retain(|key, _| keep(key));
    }

    /// The keys holding now that start with `prefix`.
    pub fn holding_with(&self, prefix: &str) -> Vec<String> {
        self.holding
            .keys()
            .filter(|key| key.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Whether `key` holds now.
    #[cfg(test)]
    pub fn holds(&self, key: &str) -> bool {
        self.holding.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_is_said_when_it_starts_changes_and_ends_not_every_round() {
        let mut conditions = Conditions::default();
        assert_eq!(conditions.observe("lease", Ok(())), None, "never held");
        let missing = || Err("namespace portalloc-system not found".to_string());
        assert_eq!(
            conditions.observe("lease", missing()),
            Some(Transition::Started(
                "namespace portalloc-system not found".into()
            ))
        );
        for _ in 0..100 {
            assert_eq!(conditions.observe("lease", missing()), None);
        }
        assert!(conditions.holds("lease"));
        assert_eq!(
            conditions.observe("lease", Err("Forbidden".into())),
            Some(Transition::Changed("Forbidden".into()))
        );
        assert_eq!(
            conditions.observe("lease", Ok(())),
            Some(Transition::Ended("Forbidden".into()))
        );
        assert_eq!(conditions.observe("lease", Ok(())), None);
        assert!(!conditions.holds("lease"));
        // It may start again.
        assert!(matches!(
            conditions.observe("lease", missing()),
            Some(Transition::Started(_))
        ));
    }

    #[test]
    fn conditions_are_apart_and_a_gone_pods_are_forgotten() {
        let mut conditions = Conditions::default();
        assert!(conditions.observe("pod/a", Err("x".into())).is_some());
        assert!(conditions.observe("pod/b", Err("y".into())).is_some());
        assert!(conditions.observe("reserve", Err("z".into())).is_some());
        assert_eq!(
            conditions.observe("pod/a", Ok(())),
            Some(Transition::Ended("x".into()))
        );
        assert!(conditions.holds("pod/b"));
        assert_eq!(conditions.holding_with("pod/"), ["pod/b"]);
        conditions.forget_unless(|key| !key.starts_with("pod/"));
        assert!(!conditions.holds("pod/b"));
        assert!(conditions.holds("reserve"));
        assert_eq!(
            conditions.observe("pod/b", Ok(())),
            None,
            "forgotten, not ended"
        );
    }
}

//! References to another role's port: `role.port`, `role.port[i]`, `role.port[*]`.

use std::fmt;

use thiserror::Error;

use super::holding::is_valid_name;

/// Which pods' ports a reference selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Selector {
    /// `role.port`: a RoleScoped port, or the PodScoped port of a one-replica role.
    Single,
    /// `role.port[i]`: pod i's port.
    Index(u32),
    /// `role.port[*]`: every pod's port, comma-separated in index order.
    All,
}

/// A parsed `from` of a PortReference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    pub role: String,
    pub port: String,
    pub selector: Selector,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "reference {text:?} is malformed: write role.port, role.port[i] or role.port[*], e.g. prefill.bootstrap[*]"
)]
pub struct ReferenceSyntaxError {
    pub text: String,
}

impl Reference {
    pub fn parse(text: &str) -> Result<Reference, ReferenceSyntaxError> {
        let bad = || ReferenceSyntaxError {
            text: text.to_owned(),
        };
        let (path, selector) = match text.split_once('[') {
            None => (text, Selector::Single),
            Some((path, rest)) => {
                let inner = rest.strip_suffix(']').ok_or_else(bad)?;
                let selector = if inner == "*" {
                    Selector::All
                } else if !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_digit()) {
                    Selector::Index(inner.parse().map_err(|_| bad())?)
                } else {
                    return Err(bad());
                };
                (path, selector)
            }
        };
        let (role, port) = path.split_once('.').ok_or_else(bad)?;
        if !is_valid_name(role) || !is_valid_name(port) {
            return Err(bad());
        }
        Ok(Reference {
            role: role.to_owned(),
            port: port.to_owned(),
            selector,
        })
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.role, self.port)?;
        match self.selector {
            Selector::Single => Ok(()),
            Selector::Index(i) => write!(f, "[{i}]"),
            Selector::All => f.write_str("[*]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        let r = Reference::parse("router.http").unwrap();
        assert_eq!(
            (r.role.as_str(), r.port.as_str(), r.selector),
            ("router", "http", Selector::Single)
        );
        assert_eq!(
            Reference::parse("prefill.bootstrap[2]").unwrap().selector,
            Selector::Index(2)
        );
        assert_eq!(
            Reference::parse("prefill.bootstrap[*]").unwrap().selector,
            Selector::All
        );
    }

    #[test]
    fn round_trips_through_display() {
        for text in ["a.b", "leader.http-port[0]", "x-1.y[*]", "r.p[17]"] {
            assert_eq!(Reference::parse(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn rejects_malformed_text_and_quotes_it() {
        for text in [
            "router",
            "router.",
            ".http",
            "router.http[",
            "router.http[]",
            "router.http[x]",
            "router.http[-1]",
            "Router.http",
            "a.b.c",
            "a.b[1]x",
            "",
        ] {
            let err = Reference::parse(text).unwrap_err();
            assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
        }
    }
}

//! References to other roles: their ports (`role.port`, `role.port[i]`, `role.port[*]`) or their
//! pods (`role`, `role[i]`, `role[*]`, written with a format).

use std::fmt;

use thiserror::Error;

use super::holding::is_valid_name;

/// Which pods (or their ports) a reference selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Selector {
    /// `role.port` or `role`: a RoleScoped port, or the one pod of a one-replica role.
    Single,
    /// `role.port[i]` or `role[i]`: pod i.
    Index(u32),
    /// `role.port[*]` or `role[*]`: every pod, joined in index order.
    All,
}

/// A parsed `from` of a PortReference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    pub role: String,
    /// The port, for a port reference; `None` for a pod reference.
    pub port: Option<String>,
    pub selector: Selector,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "reference {text:?} is malformed: write role.port, role.port[i], role.port[*], role, role[i] or role[*], e.g. prefill.bootstrap[*]"
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
        let (role, port) = match path.split_once('.') {
            Some((role, port)) => (role, Some(port)),
            None => (path, None),
        };
        if !is_valid_name(role) || port.is_some_and(|p| !is_valid_name(p)) {
            return Err(bad());
        }
        Ok(Reference {
            role: role.to_owned(),
            port: port.map(str::to_owned),
            selector,
        })
    }

    /// Whether this names pods (to be formatted) rather than a port.
    pub fn is_pod(&self) -> bool {
        self.port.is_none()
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.role)?;
        if let Some(port) = &self.port {
            write!(f, ".{port}")?;
        }
        match self.selector {
            Selector::Single => Ok(()),
            Selector::Index(i) => write!(f, "[{i}]"),
            Selector::All => f.write_str("[*]"),
        }
    }
}

/// One piece of a pod reference's `format`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatPart {
    Literal(String),
    /// `{address}`
    Address,
    /// `{pod}`
    Pod,
    /// `{index}`: the pod's index within its group.
    Index,
    /// `{port}`, `{port.last}`, `{port.range}`.
    Port {
        name: String,
        form: PortForm,
    },
}

/// How a port (possibly a block) is written in a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortForm {
    First,
    Last,
    Range,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    #[error("format {text:?} has a '{{' without its '}}'")]
    Unclosed { text: String },
    #[error(
        "format {text:?} has an unknown placeholder {{{name}}}: use {{address}}, {{pod}}, {{index}}, {{<port>}}, {{<port>.last}} or {{<port>.range}}"
    )]
    Unknown { text: String, name: String },
}

/// Splits a format into literals and placeholders. Port names are not checked here (the role
/// is not known); every other placeholder is.
pub fn parse_format(text: &str) -> Result<Vec<FormatPart>, FormatError> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(FormatPart::Literal(rest[..open].to_owned()));
        }
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| FormatError::Unclosed {
            text: text.to_owned(),
        })?;
        let name = &after[..close];
        let unknown = || FormatError::Unknown {
            text: text.to_owned(),
            name: name.to_owned(),
        };
        parts.push(match name {
            "address" => FormatPart::Address,
            "pod" => FormatPart::Pod,
            "index" => FormatPart::Index,
            _ => {
                let (port, form) = match name.split_once('.') {
                    None => (name, PortForm::First),
                    Some((port, "last")) => (port, PortForm::Last),
                    Some((port, "range")) => (port, PortForm::Range),
                    Some(_) => return Err(unknown()),
                };
                if !is_valid_name(port) {
                    return Err(unknown());
                }
                FormatPart::Port {
                    name: port.to_owned(),
                    form,
                }
            }
        });
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        parts.push(FormatPart::Literal(rest.to_owned()));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_six_forms() {
        let r = Reference::parse("router.http").unwrap();
        assert_eq!(
            (r.role.as_str(), r.port.as_deref(), r.selector),
            ("router", Some("http"), Selector::Single)
        );
        assert_eq!(
            Reference::parse("prefill.bootstrap[2]").unwrap().selector,
            Selector::Index(2)
        );
        assert_eq!(
            Reference::parse("prefill.bootstrap[*]").unwrap().selector,
            Selector::All
        );
        let pod = Reference::parse("leader").unwrap();
        assert!(pod.is_pod());
        assert_eq!(
            (pod.role.as_str(), pod.selector),
            ("leader", Selector::Single)
        );
        assert_eq!(
            Reference::parse("prefill[3]").unwrap(),
            Reference {
                role: "prefill".into(),
                port: None,
                selector: Selector::Index(3)
            }
        );
        assert_eq!(
            Reference::parse("decode[*]").unwrap().selector,
            Selector::All
        );
    }

    #[test]
    fn round_trips_through_display() {
        for text in [
            "a.b",
            "leader.http-port[0]",
            "x-1.y[*]",
            "r.p[17]",
            "leader",
            "w[2]",
            "d[*]",
        ] {
            assert_eq!(Reference::parse(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn rejects_malformed_text_and_quotes_it() {
        for text in [
            "router.",
            ".http",
            "router.http[",
            "router.http[]",
            "router.http[x]",
            "router.http[-1]",
            "Router.http",
            "Router",
            "a.b.c",
            "a.b[1]x",
            "a[1]x",
            "",
        ] {
            let err = Reference::parse(text).unwrap_err();
            assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
        }
    }

    #[test]
    fn formats_split_into_literals_and_placeholders() {
        let parts = parse_format("--prefill http://{address}:{http} {bootstrap}").unwrap();
        assert_eq!(
            parts,
            vec![
                FormatPart::Literal("--prefill http://".into()),
                FormatPart::Address,
                FormatPart::Literal(":".into()),
                FormatPart::Port {
                    name: "http".into(),
                    form: PortForm::First
                },
                FormatPart::Literal(" ".into()),
                FormatPart::Port {
                    name: "bootstrap".into(),
                    form: PortForm::First
                },
            ]
        );
        assert_eq!(
            parse_format("{pod}/{index}/{w.last}/{w.range}").unwrap(),
            vec![
                FormatPart::Pod,
                FormatPart::Literal("/".into()),
                FormatPart::Index,
                FormatPart::Literal("/".into()),
                FormatPart::Port {
                    name: "w".into(),
                    form: PortForm::Last
                },
                FormatPart::Literal("/".into()),
                FormatPart::Port {
                    name: "w".into(),
                    form: PortForm::Range
                },
            ]
        );
        assert_eq!(parse_format("plain}").unwrap().len(), 1);
    }

    #[test]
    fn bad_formats_say_what_is_wrong() {
        assert!(matches!(
            parse_format("http://{address"),
            Err(FormatError::Unclosed { .. })
        ));
        for bad in ["{http.first}", "{Address}", "{}", "{a b}"] {
            let err = parse_format(bad).unwrap_err();
            assert!(matches!(err, FormatError::Unknown { .. }), "{bad}: {err}");
        }
    }
}

//! A port or inclusive port range as users write it: `"30000"` or `"30000-32767"`.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// Text of one port (`"A"`) or inclusive range (`"A-B"`). Kept as text in the API so manifests
/// read naturally; the API server checks syntax, bounds (1..65535) and order (A <= B) with CEL.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PortRangeText(pub String);

impl PortRangeText {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for PortRangeText {
    fn from(text: &str) -> Self {
        Self(text.to_string())
    }
}

impl std::fmt::Display for PortRangeText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// CEL: the first and last port of a range text that already matched the pattern.
pub(crate) fn cel_first(var: &str) -> String {
    format!("int({var}.split('-')[0])")
}
pub(crate) fn cel_last(var: &str) -> String {
    format!("int({var}.split('-')[{var}.split('-').size() - 1])")
}

impl JsonSchema for PortRangeText {
    fn schema_name() -> Cow<'static, str> {
        "PortRangeText".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let (first, last) = (cel_first("self"), cel_last("self"));
        json_schema!({
            "type": "string",
            "description": "A port (\"30009\") or an inclusive port range (\"30000-32767\").",
            "maxLength": 11,
            "x-kubernetes-validations": [
                {
                    "rule": "self.matches('^[0-9]{1,5}(-[0-9]{1,5})?$')",
                    "message": "must be a port \"A\" or an inclusive range \"A-B\", e.g. \"30000-32767\""
                },
                {
                    "rule": format!("!self.matches('^[0-9]{{1,5}}(-[0-9]{{1,5}})?$') || ({first} >= 1 && {last} <= 65535)"),
                    "message": "ports must be within 1..65535"
                },
                {
                    "rule": format!("!self.matches('^[0-9]{{1,5}}(-[0-9]{{1,5}})?$') || {first} <= {last}"),
                    "message": "in a range \"A-B\" the first port must not exceed the last"
                }
            ]
        })
    }
}

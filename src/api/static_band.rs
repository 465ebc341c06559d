//! `spec.staticBand` of a PortPool: `Auto`, `None`, or a port count.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How many ports at the low end of a pool are kept for requested (fixed) ports: automatic
/// allocation uses them only when the rest of the pool is full (Kubernetes KEP-3668).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StaticBandSetting {
    /// `0 if n <= 16 else clamp(n / 32, 16, 128)` for a pool of `n` ports.
    #[default]
    Auto,
    /// No static band: automatic allocation may use any port first.
    None,
    /// Exactly this many ports (capped at the pool size).
    Count(u32),
}

impl Serialize for StaticBandSetting {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Auto => s.serialize_str("Auto"),
            Self::None => s.serialize_str("None"),
            Self::Count(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for StaticBandSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u32),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Count(n) => Ok(Self::Count(n)),
            Raw::Word(w) if w == "Auto" => Ok(Self::Auto),
            Raw::Word(w) if w == "None" => Ok(Self::None),
            Raw::Word(w) => match w.parse::<u32>() {
                Ok(n) => Ok(Self::Count(n)),
                Err(_) => Err(serde::de::Error::custom(format!(
                    "staticBand must be Auto, None or a port count, not {w:?}"
                ))),
            },
        }
    }
}

impl JsonSchema for StaticBandSetting {
    fn schema_name() -> Cow<'static, str> {
        "StaticBandSetting".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Ports at the low end of the pool kept for requested ports: Auto (the Kubernetes formula 0 if n <= 16 else clamp(n/32, 16, 128)), None, or a count.",
            "x-kubernetes-int-or-string": true,
            "default": "Auto",
            "x-kubernetes-validations": [{
                "rule": "type(self) == int ? (self >= 0 && self <= 65535) : (self == 'Auto' || self == 'None')",
                "message": "must be Auto, None, or a port count from 0 to 65535"
            }]
        })
    }
}

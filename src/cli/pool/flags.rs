//! The closed sets `pool create` takes: `--protocol` and `--static-band`. A wrong value is a
//! usage error (exit 2) whose message lists what is accepted, as clap does for any closed set.

use std::ffi::OsStr;

use clap::builder::{StyledStr, TypedValueParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, Command, ValueEnum};

use crate::api::{Protocol, StaticBandSetting};

/// `--protocol`: Kubernetes spells protocols in capitals, as Service ports do. A type of the
/// command line's own, since `api::Protocol` lives in the library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProtocolFlag {
    #[value(name = "TCP")]
    Tcp,
    #[value(name = "UDP")]
    Udp,
    #[value(name = "SCTP")]
    Sctp,
}

impl From<ProtocolFlag> for Protocol {
    fn from(flag: ProtocolFlag) -> Protocol {
        match flag {
            ProtocolFlag::Tcp => Protocol::Tcp,
            ProtocolFlag::Udp => Protocol::Udp,
            ProtocolFlag::Sctp => Protocol::Sctp,
        }
    }
}

/// The largest static band the CRD admits.
const MAX_STATIC_BAND: u32 = 65535;

/// `--static-band`: `Auto`, `None` (either also in lower case, as accepted so far), or a count.
#[derive(Clone, Copy, Debug)]
pub struct StaticBandParser;

impl StaticBandParser {
    pub fn parse(text: &str) -> Option<StaticBandSetting> {
        match text {
            "Auto" | "auto" => Some(StaticBandSetting::Auto),
            "None" | "none" => Some(StaticBandSetting::None),
            count if count.bytes().all(|b| b.is_ascii_digit()) => count
                .parse()
                .ok()
                .filter(|&n| n <= MAX_STATIC_BAND)
                .map(StaticBandSetting::Count),
            _ => None,
        }
    }
}

impl TypedValueParser for StaticBandParser {
    type Value = StaticBandSetting;

    fn parse_ref(
        &self,
        command: &Command,
        arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<StaticBandSetting, clap::Error> {
        let text = value.to_string_lossy();
        if let Some(setting) = Self::parse(&text) {
            return Ok(setting);
        }
        let mut error = clap::Error::new(ErrorKind::InvalidValue).with_cmd(command);
        let arg = arg.map_or_else(|| "--static-band".to_string(), ToString::to_string);
        error.insert(ContextKind::InvalidArg, ContextValue::String(arg));
        error.insert(ContextKind::InvalidValue, ContextValue::String(text.into()));
        error.insert(
            ContextKind::ValidValue,
            ContextValue::Strings(vec!["Auto".into(), "None".into(), "COUNT".into()]),
        );
        error.insert(
            ContextKind::Suggested,
            ContextValue::StyledStrs(vec![StyledStr::from(format!(
                "COUNT is a number of ports from 0 to {MAX_STATIC_BAND}, e.g. 32"
            ))]),
        );
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Flags {
        #[arg(long, value_enum, default_value = "TCP")]
        protocol: ProtocolFlag,
        #[arg(long, value_parser = StaticBandParser, default_value = "Auto")]
        static_band: StaticBandSetting,
    }

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
    }

    #[test]
    fn protocols_are_the_kubernetes_words() {
        assert_eq!(Protocol::from(parse(&[]).unwrap().protocol), Protocol::Tcp);
        for (word, protocol) in [
            ("TCP", Protocol::Tcp),
            ("UDP", Protocol::Udp),
            ("SCTP", Protocol::Sctp),
        ] {
            let flag = parse(&["--protocol", word]).unwrap().protocol;
            assert_eq!(Protocol::from(flag), protocol);
            // What is accepted prints back as the pool shows it.
            assert_eq!(protocol.to_string(), word);
        }
        for wrong in ["udp", "HTTP", ""] {
            let error = parse(&["--protocol", wrong]).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{wrong:?}");
            assert!(
                error
                    .to_string()
                    .contains("[possible values: TCP, UDP, SCTP]"),
                "{error}"
            );
        }
    }

    #[test]
    fn static_bands_are_auto_none_or_a_count() {
        // `=` so that "-1" reaches the parser rather than reading as a flag.
        let band = |text: &str| parse(&[&format!("--static-band={text}")]).map(|f| f.static_band);
        assert_eq!(parse(&[]).unwrap().static_band, StaticBandSetting::Auto);
        assert_eq!(band("Auto").unwrap(), StaticBandSetting::Auto);
        assert_eq!(band("auto").unwrap(), StaticBandSetting::Auto);
        assert_eq!(band("None").unwrap(), StaticBandSetting::None);
        assert_eq!(band("none").unwrap(), StaticBandSetting::None);
        assert_eq!(band("0").unwrap(), StaticBandSetting::Count(0));
        assert_eq!(band("32").unwrap(), StaticBandSetting::Count(32));
        assert_eq!(band("65535").unwrap(), StaticBandSetting::Count(65535));
        for wrong in ["lots", "65536", "-1", "+3", "3.5", "", "AUTO"] {
            let error = band(wrong).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidValue, "{wrong:?}");
            assert_eq!(error.exit_code(), 2, "{wrong:?}");
            let text = error.to_string();
            assert!(
                text.contains("[possible values: Auto, None, COUNT]")
                    && text.contains("from 0 to 65535, e.g. 32")
                    && text.contains("--static-band"),
                "{wrong:?}: {text}"
            );
        }
    }
}

//! Durations as kubectl reads them: Go's `time.ParseDuration` (`1m30s`, `1.5s`, `300ms`, `0`),
//! or a bare number of seconds, as `--request-timeout` accepts. No crate parses exactly this:
//! humantime takes other units (`1min`, `2days`) and no fractions.

use std::time::Duration;

/// What a wrong value is answered with: clap prefixes it with the flag and the value.
const EXAMPLES: &str = "write e.g. 30s, 1m30s, 1.5s, 300ms, 1h2m, or a number of seconds";

/// Go's largest duration (int64 nanoseconds): anything larger is an error there, and here.
const MAX_NANOS: u128 = i64::MAX as u128;

/// Parse a duration flag's value; the error says what is wrong and shows the accepted forms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let explain = |why: String| format!("{why}: {EXAMPLES}");
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if unsigned.is_empty() {
        return Err(explain(format!("{text:?} is not a duration")));
    }
    let nanos = if is_bare_number(unsigned) {
        // kubectl: "a single integer in seconds"; a fraction kept from this plugin's own past.
        scaled(unsigned, 1_000_000_000)
            .ok_or_else(|| explain(format!("{text:?} is too long a duration")))?
    } else {
        go_duration(unsigned).map_err(|why| explain(format!("{text:?}: {why}")))?
    };
    if negative && nanos > 0 {
        return Err(explain(format!("{text:?} is negative")));
    }
    let nanos = u64::try_from(nanos).expect("bounded by MAX_NANOS");
    Ok(Duration::from_nanos(nanos))
}

fn is_bare_number(text: &str) -> bool {
    let digits = text.bytes().filter(u8::is_ascii_digit).count();
    let dots = text.bytes().filter(|&b| b == b'.').count();
    digits > 0 && dots <= 1 && digits + dots == text.len()
}

/// `1h2m3.5s`: one or more numbers, each with a unit; `0` alone needs none (Go's rules).
fn go_duration(text: &str) -> Result<u128, String> {
    if text == "0" {
        return Ok(0);
    }
    let mut total: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if !is_bare_number(number) {
            return Err(if rest.len() == text.len() {
                "not a duration".to_string()
            } else {
                format!("expected a number at {rest:?}")
            });
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos = match unit {
            "" => return Err(format!("{number} has no unit")),
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3600 * 1_000_000_000,
            other => {
                return Err(format!(
                    "unknown unit {other:?} (units: h, m, s, ms, us, ns)"
                ));
            }
        };
        total = scaled(number, unit_nanos)
            .and_then(|n| n.checked_add(total))
            .filter(|&n| n <= MAX_NANOS)
            .ok_or("too long a duration")?;
        rest = after;
    }
    Ok(total)
}

/// `number` (digits with at most one dot) times `unit` nanoseconds, the fraction truncated to
/// whole nanoseconds as Go does; `None` past Go's largest duration.
fn scaled(number: &str, unit: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let mut nanos: u128 = 0;
    for digit in whole.bytes() {
        nanos = nanos
            .checked_mul(10)?
            .checked_add(u128::from(digit - b'0'))?;
        if nanos > MAX_NANOS {
            return None;
        }
    }
    nanos = nanos.checked_mul(unit)?;
    // Digits past the 20th cannot change a whole nanosecond of any unit up to an hour.
    let fraction = &fraction[..fraction.len().min(20)];
    let mut numerator: u128 = 0;
    for digit in fraction.bytes() {
        numerator = numerator * 10 + u128::from(digit - b'0');
    }
    let denominator = 10u128.pow(u32::try_from(fraction.len()).ok()?);
    nanos = nanos.checked_add(numerator * unit / denominator)?;
    (nanos <= MAX_NANOS).then_some(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Duration {
        parse_duration(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    #[test]
    fn go_durations() {
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1h2m"), Duration::from_secs(3720));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("300ms"), Duration::from_millis(300));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("-0"), Duration::ZERO);
        assert_eq!(ok("+5s"), Duration::from_secs(5));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("5.s"), Duration::from_secs(5));
        assert_eq!(ok("2h45m0.5s"), Duration::from_millis(9_900_500));
        assert_eq!(ok("1us"), Duration::from_micros(1));
        assert_eq!(ok("1µs"), Duration::from_micros(1));
        assert_eq!(ok("1μs"), Duration::from_micros(1));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("1.0000000019s"), Duration::from_nanos(1_000_000_001));
        assert_eq!(ok("30s1m"), Duration::from_secs(90), "Go allows any order");
    }

    #[test]
    fn bare_numbers_are_seconds() {
        assert_eq!(ok("30"), Duration::from_secs(30));
        assert_eq!(ok(" 30 "), Duration::from_secs(30));
        assert_eq!(ok("1.5"), Duration::from_millis(1500));
    }

    #[test]
    fn what_go_refuses_is_refused_with_examples() {
        for bad in [
            "", "soon", "5d", "1h5", ".", "1..5s", "s", "-1s", "-3", "1e3s", "1 s", "5 m",
        ] {
            let error = parse_duration(bad).expect_err(bad);
            assert!(
                error.contains("1m30s") && error.contains("300ms"),
                "{bad:?}: {error}"
            );
        }
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("\"soon\": not a duration")
        );
        assert!(
            parse_duration("5d")
                .unwrap_err()
                .contains("unknown unit \"d\"")
        );
        assert!(parse_duration("1h5").unwrap_err().contains("5 has no unit"));
        assert!(parse_duration("-1s").unwrap_err().contains("negative"));
    }

    #[test]
    fn go_bounds() {
        // Go's largest duration is 2562047h47m16.854775807s.
        assert_eq!(ok("2562047h"), Duration::from_secs(2_562_047 * 3600));
        assert!(parse_duration("2562048h").is_err());
        assert!(parse_duration("9223372036854775808ns").is_err());
        assert!(parse_duration("99999999999999999999999999999s").is_err());
        assert!(parse_duration("9999999999999999999").is_err());
    }

    proptest::proptest! {
        /// Whatever the parts, `XhYmZs` is their sum, and writing it back in that form reads
        /// the same.
        #[test]
        fn sums_of_parts(h in 0u64..1000, m in 0u64..600, s in 0u64..600, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let expected = Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_millis(ms);
            proptest::prop_assert_eq!(parse_duration(&text), Ok(expected));
            let fraction = format!("{}.{:03}s", h * 3600 + m * 60 + s, ms);
            proptest::prop_assert_eq!(parse_duration(&fraction), Ok(expected));
        }
    }
}

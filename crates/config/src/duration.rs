//! Go `time.Duration` strings, because kube-proxy's flags and config file speak them.
//!
//! Upstream parses every duration with `time.ParseDuration` and writes them back with
//! `Duration.String()` ("30s", "1m0s", "24h0m0s", "500ms"). Config files written by upstream
//! (and by `--write-config-to`) must read back unchanged, so both directions follow Go exactly,
//! including negative values (which validation then rejects with a clear message).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NANOS_PER_MICRO: u64 = 1_000;
const NANOS_PER_MILLI: u64 = 1_000_000;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A signed span of nanoseconds, as Go's `time.Duration` (range of an `i64`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration {
    nanos: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {input:?}: {reason}")]
    Invalid { input: String, reason: &'static str },
    #[error("invalid duration {input:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit { input: String, unit: String },
}

impl GoDuration {
    pub const ZERO: Self = Self { nanos: 0 };

    pub const fn from_nanos(nanos: i64) -> Self {
        Self { nanos }
    }

    pub const fn from_millis(millis: i64) -> Self {
        Self::from_nanos(millis * NANOS_PER_MILLI as i64)
    }

    pub const fn from_secs(secs: i64) -> Self {
        Self::from_nanos(secs * NANOS_PER_SEC as i64)
    }

    pub const fn from_mins(mins: i64) -> Self {
        Self::from_secs(mins * 60)
    }

    pub const fn from_hours(hours: i64) -> Self {
        Self::from_mins(hours * 60)
    }

    pub const fn as_nanos(self) -> i64 {
        self.nanos
    }

    pub const fn is_zero(self) -> bool {
        self.nanos == 0
    }

    pub const fn is_negative(self) -> bool {
        self.nanos < 0
    }

    /// The same span as a `std::time::Duration`; `None` when negative.
    pub fn to_std(self) -> Option<std::time::Duration> {
        u64::try_from(self.nanos)
            .ok()
            .map(std::time::Duration::from_nanos)
    }

    /// Saturates at Go's maximum (about 292 years).
    pub fn from_std(duration: std::time::Duration) -> Self {
        Self::from_nanos(i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX))
    }

    /// Parses like Go's `time.ParseDuration`: a sign, then one or more decimal numbers each
    /// with a unit ("300ms", "-1.5h", "2h45m"); a bare "0" is allowed without a unit.
    pub fn parse(input: &str) -> Result<Self, DurationError> {
        let invalid = |reason| DurationError::Invalid {
            input: input.to_string(),
            reason,
        };
        let (negative, body) = split_sign(input);
        if body == "0" {
            return Ok(Self::ZERO);
        }
        if body.is_empty() {
            return Err(invalid("empty"));
        }
        let mut total: u128 = 0;
        let mut rest = body;
        while !rest.is_empty() {
            let (term, after) = parse_term(rest, input)?;
            total += term;
            rest = after;
        }
        signed_nanos(total, negative)
            .map(Self::from_nanos)
            .ok_or_else(|| invalid("out of range"))
    }
}

fn split_sign(input: &str) -> (bool, &str) {
    match input.as_bytes().first() {
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        _ => (false, input),
    }
}

/// Upper bound for the magnitude: `i64::MIN` is representable, one more is not.
const MAX_MAGNITUDE: u128 = 1 << 63;

fn signed_nanos(total: u128, negative: bool) -> Option<i64> {
    match (negative, total) {
        (true, MAX_MAGNITUDE) => Some(i64::MIN),
        (true, t) if t < MAX_MAGNITUDE => i64::try_from(t).ok().map(|t| -t),
        (false, t) => i64::try_from(t).ok(),
        _ => None,
    }
}

/// One "<number><unit>" term; returns its nanoseconds and the unparsed rest.
fn parse_term<'a>(text: &'a str, input: &str) -> Result<(u128, &'a str), DurationError> {
    let invalid = |reason| DurationError::Invalid {
        input: input.to_string(),
        reason,
    };
    let int_len = count_digits(text);
    let (int_digits, after_int) = text.split_at(int_len);
    let (frac_digits, after_number) = match after_int.strip_prefix('.') {
        Some(after_dot) => after_dot.split_at(count_digits(after_dot)),
        None => ("", after_int),
    };
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(invalid("expected a number"));
    }
    let unit_len = after_number
        .find(|c: char| c == '.' || c.is_ascii_digit())
        .unwrap_or(after_number.len());
    let (unit, rest) = after_number.split_at(unit_len);
    if unit.is_empty() {
        return Err(invalid("missing unit"));
    }
    let unit_nanos = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
        input: input.to_string(),
        unit: unit.to_string(),
    })?;
    let whole = decimal(int_digits).ok_or_else(|| invalid("out of range"))?;
    let nanos = whole
        .checked_mul(unit_nanos)
        .filter(|n| *n <= MAX_MAGNITUDE)
        .ok_or_else(|| invalid("out of range"))?;
    Ok((nanos + fraction_nanos(frac_digits, unit_nanos), rest))
}

fn count_digits(text: &str) -> usize {
    text.bytes().take_while(u8::is_ascii_digit).count()
}

fn decimal(digits: &str) -> Option<u128> {
    digits.bytes().try_fold(0u128, |acc, d| {
        acc.checked_mul(10)?
            .checked_add(u128::from(d - b'0'))
            .filter(|v| *v <= MAX_MAGNITUDE)
    })
}

/// The fractional part's nanoseconds, truncated; digits beyond nanosecond precision are dropped.
fn fraction_nanos(digits: &str, unit_nanos: u128) -> u128 {
    let mut numerator: u128 = 0;
    let mut scale: u128 = 1;
    for d in digits.bytes().take(30) {
        numerator = numerator * 10 + u128::from(d - b'0');
        scale *= 10;
    }
    numerator * unit_nanos / scale
}

fn unit_nanos(unit: &str) -> Option<u128> {
    let nanos = match unit {
        "ns" => 1,
        // Go accepts the micro sign (U+00B5) and the Greek mu (U+03BC).
        "us" | "\u{b5}s" | "\u{3bc}s" => NANOS_PER_MICRO,
        "ms" => NANOS_PER_MILLI,
        "s" => NANOS_PER_SEC,
        "m" => 60 * NANOS_PER_SEC,
        "h" => 3600 * NANOS_PER_SEC,
        _ => return None,
    };
    Some(u128::from(nanos))
}

impl fmt::Display for GoDuration {
    /// Formats like Go's `Duration.String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.nanos < 0 { "-" } else { "" };
        let u = self.nanos.unsigned_abs();
        if u == 0 {
            return f.write_str("0s");
        }
        if u < NANOS_PER_MICRO {
            return write!(f, "{sign}{u}ns");
        }
        if u < NANOS_PER_MILLI {
            let frac = fraction(u % NANOS_PER_MICRO, 3);
            return write!(f, "{sign}{}{frac}\u{b5}s", u / NANOS_PER_MICRO);
        }
        if u < NANOS_PER_SEC {
            let frac = fraction(u % NANOS_PER_MILLI, 6);
            return write!(f, "{sign}{}{frac}ms", u / NANOS_PER_MILLI);
        }
        let frac = fraction(u % NANOS_PER_SEC, 9);
        let total_secs = u / NANOS_PER_SEC;
        let (secs, total_mins) = (total_secs % 60, total_secs / 60);
        let (mins, hours) = (total_mins % 60, total_mins / 60);
        match (hours, total_mins) {
            (0, 0) => write!(f, "{sign}{secs}{frac}s"),
            (0, _) => write!(f, "{sign}{mins}m{secs}{frac}s"),
            _ => write!(f, "{sign}{hours}h{mins}m{secs}{frac}s"),
        }
    }
}

/// ".5", ".0001" or "" for a remainder with `digits` decimal places, trailing zeros dropped.
fn fraction(remainder: u64, digits: usize) -> String {
    if remainder == 0 {
        return String::new();
    }
    let padded = format!("{remainder:0digits$}");
    format!(".{}", padded.trim_end_matches('0'))
}

impl FromStr for GoDuration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    /// Like upstream's `metav1.Duration`: only a duration string is accepted.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> i64 {
        GoDuration::parse(s).unwrap().as_nanos()
    }

    #[test]
    fn parses_go_duration_strings() {
        const S: i64 = 1_000_000_000;
        assert_eq!(parse("30s"), 30 * S);
        assert_eq!(parse("1m0s"), 60 * S);
        assert_eq!(parse("1.5h"), 5400 * S);
        assert_eq!(parse("300ms"), 300_000_000);
        assert_eq!(parse("1h2m3.5s"), 3723 * S + S / 2);
        assert_eq!(parse("0"), 0);
        assert_eq!(parse("-0"), 0);
        assert_eq!(parse("+5s"), 5 * S);
        assert_eq!(parse("-1.5s"), -(S + S / 2));
        assert_eq!(parse(".5s"), S / 2);
        assert_eq!(parse("1.s"), S);
        assert_eq!(parse("10us"), 10_000);
        assert_eq!(parse("10µs"), 10_000);
        assert_eq!(parse("10μs"), 10_000);
        assert_eq!(parse("7ns"), 7);
        assert_eq!(parse("24h0m0s"), 86_400 * S);
        assert_eq!(parse("1.0000000009s"), S, "sub-nanosecond digits are truncated");
        assert_eq!(parse("2562047h47m16.854775807s"), i64::MAX);
        assert_eq!(parse("-2562047h47m16.854775808s"), i64::MIN);
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in [
            "",
            "-",
            "+",
            "30",
            "1.5",
            "s",
            ".s",
            "1x",
            "1sec",
            "1 s",
            " 1s",
            "1s ",
            "1h-2m",
            "2562047h47m16.854775808s",
            "9999999999999999999999h",
        ] {
            assert!(GoDuration::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn unknown_unit_is_named() {
        let err = GoDuration::parse("5days").unwrap_err();
        assert!(err.to_string().contains("\"days\""), "{err}");
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (GoDuration::ZERO, "0s"),
            (GoDuration::from_secs(30), "30s"),
            (GoDuration::from_secs(60), "1m0s"),
            (GoDuration::from_mins(15), "15m0s"),
            (GoDuration::from_hours(1), "1h0m0s"),
            (GoDuration::from_hours(24), "24h0m0s"),
            (GoDuration::from_millis(500), "500ms"),
            (GoDuration::from_millis(1500), "1.5s"),
            (GoDuration::from_nanos(1_000_100_000), "1.0001s"),
            (GoDuration::from_nanos(3_723_500_000_000), "1h2m3.5s"),
            (GoDuration::from_secs(90), "1m30s"),
            (GoDuration::from_nanos(1_500), "1.5µs"),
            (GoDuration::from_nanos(999), "999ns"),
            (GoDuration::from_nanos(1_234_567), "1.234567ms"),
            (GoDuration::from_secs(-90), "-1m30s"),
            (GoDuration::from_nanos(i64::MAX), "2562047h47m16.854775807s"),
            (GoDuration::from_nanos(i64::MIN), "-2562047h47m16.854775808s"),
        ];
        for (duration, text) in cases {
            assert_eq!(duration.to_string(), text);
            assert_eq!(GoDuration::parse(text).unwrap(), duration, "round trip of {text}");
        }
    }

    #[test]
    fn converts_to_std_only_when_not_negative() {
        assert_eq!(
            GoDuration::from_millis(1500).to_std(),
            Some(std::time::Duration::from_millis(1500))
        );
        assert_eq!(GoDuration::from_secs(-1).to_std(), None);
        assert_eq!(
            GoDuration::from_std(std::time::Duration::from_secs(u64::MAX)),
            GoDuration::from_nanos(i64::MAX)
        );
    }

    #[test]
    fn serde_uses_go_strings() {
        let d: GoDuration = serde_json::from_str("\"1m30s\"").unwrap();
        assert_eq!(d, GoDuration::from_secs(90));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"1m30s\"");
        assert!(
            serde_json::from_str::<GoDuration>("30").is_err(),
            "bare numbers are not durations"
        );
    }
}

//! Go's `time.Time.String()`, the form upstream's health bodies carry their times in.
//!
//! Upstream prints `lastUpdated` and `currentTime` with `%q` of a `time.Time`, which is its
//! `String()`: `2006-01-02 15:04:05.999999999 -0700 MST m=+0.000000001`, in the local time
//! zone, fraction without trailing zeros, and a final `m=` field with the monotonic clock
//! reading (seconds since the process started) that Go adds to every `time.Now()`. Probes
//! and scripts written against upstream see the same shape here.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use jiff::Timestamp;
use jiff::tz::TimeZone;

/// What Go prints for a zero `time.Time` (upstream's `lastUpdated` before any update).
pub const ZERO_TIME: &str = "0001-01-01 00:00:00 +0000 UTC";

/// A moment as Go's `time.Now()` records it: the wall clock for printing, the monotonic
/// reading for measuring (so a wall-clock jump cannot make the proxy look late).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    wall: SystemTime,
    /// Since the process started (the first use of this module), as Go counts it.
    monotonic: Duration,
}

impl Stamp {
    pub fn now() -> Self {
        Self {
            wall: SystemTime::now(),
            monotonic: process_start().elapsed(),
        }
    }

    pub fn wall(self) -> SystemTime {
        self.wall
    }

    /// How long after `earlier` this is, by the monotonic clock.
    pub fn since(self, earlier: Stamp) -> Duration {
        self.monotonic.saturating_sub(earlier.monotonic)
    }

    /// The same moment, `by` later (tests move time instead of sleeping).
    #[cfg(test)]
    pub fn later(self, by: Duration) -> Self {
        Self {
            wall: self.wall + by,
            monotonic: self.monotonic + by,
        }
    }

    /// Go's `String()` in the local time zone, as upstream's health server prints it.
    pub fn go_string(self) -> String {
        self.go_string_in(&local_zone())
    }

    fn go_string_in(self, zone: &TimeZone) -> String {
        let mut out = String::with_capacity(64);
        // Out-of-range wall clocks cannot come from SystemTime::now(); print Go's zero then.
        let Ok(timestamp) = Timestamp::try_from(self.wall) else {
            return ZERO_TIME.to_string();
        };
        let info = zone.to_offset_info(timestamp);
        let civil = info.offset().to_datetime(timestamp);
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
            civil.year(),
            civil.month(),
            civil.day(),
            civil.hour(),
            civil.minute(),
            civil.second()
        );
        push_fraction(&mut out, civil.subsec_nanosecond());
        let offset = info.offset().seconds();
        out.push(' ');
        push_offset(&mut out, offset);
        out.push(' ');
        match info.abbreviation() {
            // Go prints the offset again when the zone has no abbreviation.
            "" => push_offset(&mut out, offset),
            name => out.push_str(name),
        }
        push_monotonic(&mut out, self.monotonic);
        out
    }
}

fn process_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// `time.Local` as Go finds it (`TZ`, else /etc/localtime, else UTC).
fn local_zone() -> TimeZone {
    TimeZone::try_system().unwrap_or(TimeZone::UTC)
}

/// `.999999999`: nanoseconds without trailing zeros, nothing at all for a whole second.
fn push_fraction(out: &mut String, nanos: i32) {
    if nanos == 0 {
        return;
    }
    let digits = format!("{nanos:09}");
    out.push('.');
    out.push_str(digits.trim_end_matches('0'));
}

/// `-0700`: sign, hours and minutes of the UTC offset.
fn push_offset(out: &mut String, seconds: i32) {
    let sign = if seconds < 0 { '-' } else { '+' };
    let minutes = seconds.unsigned_abs() / 60;
    let _ = write!(out, "{sign}{:02}{:02}", minutes / 60, minutes % 60);
}

/// ` m=+12.345678901`: seconds with nine decimals.
fn push_monotonic(out: &mut String, since_start: Duration) {
    let _ = write!(
        out,
        " m=+{}.{:09}",
        since_start.as_secs(),
        since_start.subsec_nanos()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(unix_nanos: u64, monotonic: Duration) -> Stamp {
        Stamp {
            wall: SystemTime::UNIX_EPOCH + Duration::from_nanos(unix_nanos),
            monotonic,
        }
    }

    #[test]
    fn utc_with_fraction_and_monotonic_reading() {
        let t = stamp(1_700_000_000_500_000_000, Duration::new(12, 345_678));
        assert_eq!(
            t.go_string_in(&TimeZone::UTC),
            "2023-11-14 22:13:20.5 +0000 UTC m=+12.000345678"
        );
    }

    #[test]
    fn whole_second_has_no_fraction() {
        let t = stamp(1_700_000_000_000_000_000, Duration::from_nanos(1));
        assert_eq!(
            t.go_string_in(&TimeZone::UTC),
            "2023-11-14 22:13:20 +0000 UTC m=+0.000000001"
        );
    }

    #[test]
    fn local_zone_name_and_offset() {
        let new_york = TimeZone::posix("EST5EDT,M3.2.0,M11.1.0").unwrap();
        let winter = stamp(1_704_941_204_000_000_123, Duration::from_secs(3600));
        assert_eq!(
            winter.go_string_in(&new_york),
            "2024-01-10 21:46:44.000000123 -0500 EST m=+3600.000000000"
        );
        let summer = stamp(1_720_000_000_000_000_000, Duration::ZERO);
        assert!(
            summer.go_string_in(&new_york).contains(" -0400 EDT m="),
            "{}",
            summer.go_string_in(&new_york)
        );
    }

    #[test]
    fn monotonic_reading_grows() {
        let a = Stamp::now();
        let b = a.later(Duration::from_secs(2));
        assert_eq!(b.since(a), Duration::from_secs(2));
        assert_eq!(a.since(b), Duration::ZERO);
    }
}

//! How numbers read in the report: durations and sizes with units a reader can compare at
//! a glance, and a cell for every outcome, including the ones that did not happen.

use std::time::Duration;

use crate::load::Outcome;

/// `0.84 ms`, `12.3 ms`, `184 ms`, `4.91 s`, `312 s`.
pub fn duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    match ms {
        ms if ms < 10.0 => format!("{ms:.2} ms"),
        ms if ms < 100.0 => format!("{ms:.1} ms"),
        ms if ms < 1000.0 => format!("{ms:.0} ms"),
        ms if ms < 100_000.0 => format!("{:.2} s", ms / 1000.0),
        ms => format!("{:.0} s", ms / 1000.0),
    }
}

/// Decimal units, as the reference figures use: `512 B`, `3.1 KB`, `32.9 MB`.
pub fn bytes(n: usize) -> String {
    let n = n as f64;
    if n < 1000.0 {
        format!("{n} B")
    } else if n < 1_000_000.0 {
        format!("{:.1} KB", n / 1000.0)
    } else {
        format!("{:.1} MB", n / 1_000_000.0)
    }
}

/// `1,234,567`.
pub fn count(n: usize) -> String {
    let digits = n.to_string();
    // The first group is whatever is left over by groups of three.
    let first = match digits.len() % 3 {
        0 => 3,
        rest => rest,
    };
    let mut out = digits[..first.min(digits.len())].to_string();
    for group in digits.as_bytes()[first.min(digits.len())..].chunks(3) {
        out.push(',');
        out.push_str(&String::from_utf8_lossy(group));
    }
    out
}

pub fn mebibytes(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

/// `101.4 MiB`: a tenth of a MiB, for memory compared over time.
pub fn mebibytes_tenths(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// A table cell for `outcome`, showing a finished one with `show`.
pub fn outcome<T>(outcome: &Outcome<T>, show: impl Fn(&T) -> String) -> String {
    match outcome {
        Outcome::Done(value) => show(value),
        Outcome::TimedOut(after) => format!("timed out after {} s", after.as_secs()),
        Outcome::NotAvailable(why) => format!("n/a: {}", one_line(why)),
        Outcome::Failed(why) => format!("failed: {}", one_line(why)),
    }
}

/// Keeps a table row one line and readable: first line, pipes escaped, at most 120 chars.
pub fn one_line(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default().replace('|', "\\|");
    match first.char_indices().nth(120) {
        Some((cut, _)) => format!("{}…", &first[..cut]),
        None => first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_three_significant_digits() {
        let ms = Duration::from_millis;
        assert_eq!(duration(Duration::from_micros(840)), "0.84 ms");
        assert_eq!(duration(Duration::from_micros(12_340)), "12.3 ms");
        assert_eq!(duration(ms(184)), "184 ms");
        assert_eq!(duration(ms(4_912)), "4.91 s");
        assert_eq!(duration(ms(312_400)), "312 s");
    }

    #[test]
    fn sizes_and_counts() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3_140), "3.1 KB");
        assert_eq!(bytes(32_912_345), "32.9 MB");
        assert_eq!(count(7), "7");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(100_000), "100,000");
        assert_eq!(mebibytes(2048), "2 MiB");
        assert_eq!(mebibytes_tenths(103_834), "101.4 MiB");
    }

    #[test]
    fn every_outcome_has_a_cell() {
        let show = |d: &Duration| duration(*d);
        assert_eq!(outcome(&Outcome::Done(Duration::from_millis(5)), show), "5.00 ms");
        assert_eq!(
            outcome(&Outcome::<Duration>::TimedOut(Duration::from_secs(600)), show),
            "timed out after 600 s"
        );
        assert_eq!(
            outcome(&Outcome::<Duration>::NotAvailable("x not installed".into()), show),
            "n/a: x not installed"
        );
        let long = format!("a|b\nsecond line {}", "z".repeat(200));
        assert_eq!(outcome(&Outcome::<Duration>::Failed(long), show), "failed: a\\|b");
    }
}

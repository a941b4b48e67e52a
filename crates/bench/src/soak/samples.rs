//! What the soak's samples say, computed purely from them: the RSS growth after the
//! warm-up (the issue's ≤ 5 % criterion), the rows of the RSS-over-time table, and which
//! metric families gained series (a label set that grows with the number of changes is a
//! leak a node would carry forever, as upstream's EndpointSlice cache was).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::proxy::Memory;

/// One sample of the running proxy.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Since the soak started (after the first sync).
    pub at: Duration,
    pub memory: Memory,
    /// Series per metric family on `/metrics` (`None`: the scrape failed).
    pub series: Option<BTreeMap<String, usize>>,
    /// Endpoint changes written so far.
    pub endpoint_changes: usize,
    /// Services in the API server now (the shape's plus the live extras).
    pub services: usize,
}

/// Memory after the warm-up against memory at the end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Growth {
    /// The first sample at or after the warm-up's end, and when it was taken.
    pub warm_at: Duration,
    pub warm_kib: u64,
    pub end_kib: u64,
    /// The highest RSS sampled after the warm-up.
    pub max_after_warm_kib: u64,
    /// `(end - warm) / warm`, in percent (negative when it shrank).
    pub percent: f64,
}

/// Which figure of [`Memory`] a growth is of.
pub type Figure = fn(&Memory) -> Option<u64>;

/// `VmRSS`, the measure.
pub fn rss(memory: &Memory) -> Option<u64> {
    memory.rss_kib
}

/// `RssAnon`: the heap without the binary's pages.
pub fn anon(memory: &Memory) -> Option<u64> {
    memory.anon_kib
}

/// The growth of `figure` from the warm-up's end to the last sample; `None` without a
/// sample after the warm-up, or when the figure was unreadable there.
pub fn growth(samples: &[Sample], warm_up: Duration, figure: Figure) -> Option<Growth> {
    let after: Vec<(Duration, u64)> = samples
        .iter()
        .filter(|s| s.at >= warm_up)
        .filter_map(|s| Some((s.at, figure(&s.memory)?)))
        .collect();
    let &(warm_at, warm_kib) = after.first()?;
    let &(_, end_kib) = after.last()?;
    let max_after_warm_kib = after.iter().map(|&(_, kib)| kib).max()?;
    let percent = if warm_kib == 0 {
        0.0
    } else {
        (end_kib as f64 - warm_kib as f64) * 100.0 / warm_kib as f64
    };
    Some(Growth {
        warm_at,
        warm_kib,
        end_kib,
        max_after_warm_kib,
        percent,
    })
}

/// The samples of the RSS-over-time table: the first at or after each multiple of `step`,
/// and the last one.
pub fn table_rows(samples: &[Sample], step: Duration) -> Vec<&Sample> {
    let mut rows: Vec<&Sample> = Vec::new();
    let mut next = Duration::ZERO;
    for sample in samples {
        if sample.at >= next {
            rows.push(sample);
            while next <= sample.at && !step.is_zero() {
                next += step;
            }
        }
    }
    if let (Some(last), Some(shown)) = (samples.last(), rows.last())
        && !std::ptr::eq(last, *shown)
    {
        rows.push(last);
    }
    rows
}

/// A metric family whose series count changed after the warm-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeriesChange {
    pub family: String,
    pub at_warm: usize,
    pub at_end: usize,
    pub max: usize,
}

/// Every family whose series count after the warm-up was ever different from its count at
/// the warm-up's end (families that first appear later count from 0).
pub fn series_changes(samples: &[Sample], warm_up: Duration) -> Vec<SeriesChange> {
    let scraped: Vec<&BTreeMap<String, usize>> = samples
        .iter()
        .filter(|s| s.at >= warm_up)
        .filter_map(|s| s.series.as_ref())
        .collect();
    let (Some(first), Some(last)) = (scraped.first(), scraped.last()) else {
        return Vec::new();
    };
    let mut families: BTreeMap<&str, usize> = BTreeMap::new();
    for counts in &scraped {
        for (family, &n) in counts.iter() {
            let max = families.entry(family).or_default();
            *max = (*max).max(n);
        }
    }
    families
        .into_iter()
        .filter_map(|(family, max)| {
            let at_warm = first.get(family).copied().unwrap_or(0);
            let at_end = last.get(family).copied().unwrap_or(0);
            let unchanged = scraped
                .iter()
                .all(|counts| counts.get(family).copied().unwrap_or(0) == at_warm);
            (!unchanged).then(|| SeriesChange {
                family: family.to_string(),
                at_warm,
                at_end,
                max,
            })
        })
        .collect()
}

/// Series per metric family of a text exposition: sample lines are grouped under the
/// family their `# TYPE` line names (a histogram's `_bucket`, `_sum` and `_count` and a
/// counter's `_total` under theirs); a line without one counts under its own name.
pub fn series_per_family(exposition: &str) -> BTreeMap<String, usize> {
    let families: Vec<&str> = exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.split_whitespace().next())
        .collect();
    let mut counts = BTreeMap::new();
    for line in exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap_or(line);
        let family = families
            .iter()
            .find(|f| belongs_to(name, f))
            .copied()
            .unwrap_or(name);
        *counts.entry(family.to_string()).or_insert(0) += 1;
    }
    counts
}

fn belongs_to(name: &str, family: &str) -> bool {
    match name.strip_prefix(family) {
        Some("") => true,
        Some(rest) => ["_bucket", "_sum", "_count", "_total", "_created", "_info"].contains(&rest),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(secs: u64, rss_mib: u64, series: &[(&str, usize)]) -> Sample {
        Sample {
            at: Duration::from_secs(secs),
            memory: Memory {
                peak_kib: Some(200 << 10),
                rss_kib: Some(rss_mib << 10),
                anon_kib: None,
            },
            series: Some(series.iter().map(|&(f, n)| (f.to_string(), n)).collect()),
            endpoint_changes: secs as usize * 100,
            services: 10_005,
        }
    }

    #[test]
    fn growth_runs_from_the_first_sample_after_warm_up_to_the_last() {
        let samples = [
            sample(0, 150, &[]),
            sample(50, 90, &[]),
            sample(60, 100, &[]),
            sample(120, 108, &[]),
            sample(300, 104, &[]),
        ];
        let g = growth(&samples, Duration::from_secs(55), rss).expect("samples after warm-up");
        assert_eq!(g.warm_at, Duration::from_secs(60));
        assert_eq!(
            (g.warm_kib, g.end_kib, g.max_after_warm_kib),
            (100 << 10, 104 << 10, 108 << 10)
        );
        assert!((g.percent - 4.0).abs() < 1e-9, "{g:?}");
        let shrank = growth(&samples[..4], Duration::from_secs(100), rss).unwrap();
        assert_eq!(shrank.percent, 0.0);
        let down = growth(&[sample(0, 100, &[]), sample(10, 90, &[])], Duration::ZERO, rss).unwrap();
        assert!((down.percent + 10.0).abs() < 1e-9, "{down:?}");
        assert_eq!(growth(&samples, Duration::from_secs(301), rss), None);
        // No RssAnon in these samples: no anonymous growth to report.
        assert_eq!(growth(&samples, Duration::ZERO, anon), None);
    }

    #[test]
    fn the_table_has_one_row_per_step_and_the_last_sample() {
        let samples: Vec<Sample> = (0..=31).map(|i| sample(i * 10, 100, &[])).collect();
        let at: Vec<u64> = table_rows(&samples, Duration::from_secs(60))
            .iter()
            .map(|s| s.at.as_secs())
            .collect();
        assert_eq!(at, [0, 60, 120, 180, 240, 300, 310]);
        // Samples that come late (a busy sampler) still give one row per step.
        let late = [sample(0, 1, &[]), sample(61, 1, &[]), sample(185, 1, &[])];
        let at: Vec<u64> = table_rows(&late, Duration::from_secs(60))
            .iter()
            .map(|s| s.at.as_secs())
            .collect();
        assert_eq!(at, [0, 61, 185]);
    }

    #[test]
    fn a_family_that_gains_series_after_warm_up_is_reported() {
        let samples = [
            sample(0, 1, &[("a", 1)]),
            sample(60, 1, &[("a", 2), ("b", 5)]),
            sample(120, 1, &[("a", 2), ("b", 6), ("c", 1)]),
            sample(180, 1, &[("a", 2), ("b", 5), ("c", 1)]),
        ];
        let changes = series_changes(&samples, Duration::from_secs(60));
        assert_eq!(
            changes,
            [
                SeriesChange {
                    family: "b".into(),
                    at_warm: 5,
                    at_end: 5,
                    max: 6
                },
                SeriesChange {
                    family: "c".into(),
                    at_warm: 0,
                    at_end: 1,
                    max: 1
                },
            ]
        );
        let flat = [sample(60, 1, &[("a", 2)]), sample(120, 1, &[("a", 2)])];
        assert!(series_changes(&flat, Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn series_are_counted_under_their_type_family() {
        let text = "# HELP kubeproxy_sync_proxy_rules_endpoint_changes Endpoint changes.\n\
            # TYPE kubeproxy_sync_proxy_rules_endpoint_changes counter\n\
            kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv4\"} 12\n\
            # TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\n\
            kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"} 1.5\n\
            kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 3\n\
            kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.1\"} 1\n\
            kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} 3\n\
            # TYPE kubeproxy_sync_proxy_rules_duration gauge\n\
            kubeproxy_sync_proxy_rules_duration 7\n\
            untyped_metric 1\n\
            # EOF\n";
        let counts = series_per_family(text);
        let expected: BTreeMap<String, usize> = [
            ("kubeproxy_sync_proxy_rules_endpoint_changes", 1),
            ("kubeproxy_sync_proxy_rules_duration_seconds", 4),
            ("kubeproxy_sync_proxy_rules_duration", 1),
            ("untyped_metric", 1),
        ]
        .into_iter()
        .map(|(f, n)| (f.to_string(), n))
        .collect();
        assert_eq!(counts, expected);
    }
}

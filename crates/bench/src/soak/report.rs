//! The soak's part of the report: a summary row per run, the RSS-over-time table, and
//! which metric families gained series after the warm-up.

use std::fmt::Write as _;
use std::time::Duration;

use super::samples::{anon, growth, rss, series_changes, table_rows};
use super::schedule::warm_up;
use super::{SoakRow, TURNOVER_WINDOW};
use crate::format::{count, duration, mebibytes_tenths, one_line, outcome};

/// One row of the RSS-over-time table per this much soak time.
pub const TABLE_STEP: Duration = Duration::from_secs(60);

fn kib(kib: Option<u64>) -> String {
    kib.map_or_else(|| "n/a".to_string(), mebibytes_tenths)
}

/// The summary table (what the terminal shows too).
pub fn summary_table(out: &mut String, rows: &[SoakRow]) {
    out.push_str(
        "| services × endpoints | mode | soak | first sync | written | RSS after warm-up | RSS at the end | growth | growth of RssAnon | max RSS after warm-up | peak (VmHWM) | metric families that changed |\n\
         |---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for row in rows {
        let warm = warm_up(row.cadence.length);
        let g = growth(&row.samples, warm, rss);
        let anon_growth = growth(&row.samples, warm, anon)
            .map_or_else(|| "n/a".to_string(), |g| format!("{:+.1} %", g.percent));
        let w = &row.written;
        let mut written = format!(
            "{} endpoint changes, {} Services created / {} deleted, {} watch drops, {} forced relists",
            count(w.endpoint_changes),
            count(w.services_created),
            count(w.services_deleted),
            w.watch_drops,
            w.relists
        );
        if let Some(why) = &row.stopped {
            let _ = write!(written, "; **stopped: {}**", one_line(why));
        }
        let changed = series_changes(&row.samples, warm);
        let families = if row.samples.iter().all(|s| s.series.is_none()) {
            "n/a: no scrape".to_string()
        } else if changed.is_empty() {
            "none".to_string()
        } else {
            changed
                .iter()
                .map(|c| format!("**{}: {} → {} (max {})**", c.family, c.at_warm, c.at_end, c.max))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "| {} × {} | {} | {} | {} | {written} | {} | {} | {} | {anon_growth} | {} | {} | {families} |",
            count(row.shape.services),
            row.shape.endpoints,
            row.mode,
            duration(row.elapsed),
            outcome(&row.first_sync, |d| duration(*d)),
            g.map_or_else(
                || "n/a".to_string(),
                |g| format!("{} (at {} s)", mebibytes_tenths(g.warm_kib), g.warm_at.as_secs())
            ),
            kib(g.map(|g| g.end_kib)),
            g.map_or_else(|| "n/a".to_string(), |g| format!("{:+.1} %", g.percent)),
            kib(g.map(|g| g.max_after_warm_kib)),
            kib(row.samples.last().and_then(|s| s.memory.peak_kib)),
        );
    }
}

/// The whole soak section of BENCHMARKS.md.
pub fn section(out: &mut String, rows: &[SoakRow]) {
    let Some(first) = rows.first() else {
        return;
    };
    let c = &first.cadence;
    let _ = write!(
        out,
        "### Flat under churn (soak)\n\n\
         `kube-proxy-rs` watching the test API server (in its namespace) that holds the \
         cluster; after its first sync, for {minutes} min: {rate} endpoint changes per second \
         (one endpoint of a random slice moves to an address never used before), {turnover} \
         Service turnover(s) per second (a new Service with its slice is created and, past \
         {TURNOVER_WINDOW} extras, the oldest extra deleted, so the cluster stays at N to \
         N + {TURNOVER_WINDOW} Services), every {drop} s all watches ended (the proxy \
         resumes), every {relist} s the server's history forgotten and all watches ended (the \
         proxy's resumed watches get `410 Gone` and it relists everything). Every {sample} s \
         the proxy's `VmRSS` / `VmHWM` and its `/metrics` series per family are sampled. The \
         warm-up is the first fifth of the run, at most 5 min; *growth* is RSS at the end \
         against RSS at the first sample after it (the issue's target: ≤ 5 %); the same for \
         `RssAnon` beside it, the process's own memory without the pages of its binary, which \
         come in as code paths are first used. *Metric \
         families that changed*: any family whose series count after the warm-up ever \
         differed from its count at the warm-up's end (a label set growing with the number \
         of changes would show here). *Written* counts what the soak wrote; the server saw \
         the listed relists as fresh lists.\n\n",
        minutes = c.length.as_secs_f64() / 60.0,
        rate = c.endpoint_changes,
        turnover = c.service_turnovers,
        drop = c.watch_drop_every.as_secs(),
        relist = c.relist_every.as_secs(),
        sample = c.sample_every.as_secs(),
    );
    summary_table(out, rows);
    out.push('\n');
    for row in rows {
        let w = &row.written;
        let _ = writeln!(
            out,
            "{} × {}, {} mode: the server answered {} fresh lists during the soak (first pages; \
             one per watched type per relist); the proxy counted {} slice events against {} \
             slice writes (relists add the re-listed slices).\n",
            count(row.shape.services),
            row.shape.endpoints,
            row.mode,
            w.lists_seen,
            w.slice_events_counted.map_or_else(
                || "n/a".to_string(),
                |n| count(usize::try_from(n).unwrap_or(usize::MAX))
            ),
            count(w.endpoint_changes + w.services_created + w.services_deleted),
        );
        over_time_table(out, row);
        out.push('\n');
    }
    if crate::plots::soak::drawn(rows) {
        crate::plots::embed(out, &crate::plots::soak::FIGURE);
    }
}

/// RSS over time, one row per [`TABLE_STEP`] and the last sample.
fn over_time_table(out: &mut String, row: &SoakRow) {
    out.push_str(
        "| time | RSS (VmRSS) | anonymous (RssAnon) | peak (VmHWM) | endpoint changes written | Services | metric series |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for sample in table_rows(&row.samples, TABLE_STEP) {
        let series = sample
            .series
            .as_ref()
            .map_or_else(|| "n/a".to_string(), |s| count(s.values().sum()));
        let _ = writeln!(
            out,
            "| {} min {:02} s | {} | {} | {} | {} | {} | {series} |",
            sample.at.as_secs() / 60,
            sample.at.as_secs() % 60,
            kib(sample.memory.rss_kib),
            kib(sample.memory.anon_kib),
            kib(sample.memory.peak_kib),
            count(sample.endpoint_changes),
            count(sample.services),
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cluster::Shape;
    use crate::load::Outcome;
    use crate::proxy::Memory;
    use crate::soak::Written;
    use crate::soak::samples::Sample;
    use crate::soak::schedule::Cadence;

    /// A 5-minute soak at 10k sampled every 30 s: RSS `(seconds, MiB)` as given, RssAnon
    /// 20 MiB below it, and `series` for the family `f` in every sample from `series.0` on.
    pub(crate) fn soak_row(rss: &[(u64, u64)], series: (u64, usize, usize)) -> SoakRow {
        let samples = rss
            .iter()
            .map(|&(secs, mib)| Sample {
                at: Duration::from_secs(secs),
                memory: Memory {
                    peak_kib: Some(150 << 10),
                    rss_kib: Some(mib << 10),
                    anon_kib: Some((mib - 20) << 10),
                },
                series: Some(BTreeMap::from([(
                    "f".to_string(),
                    if secs >= series.0 { series.2 } else { series.1 },
                )])),
                endpoint_changes: secs as usize * 100,
                services: 10_010,
            })
            .collect();
        SoakRow {
            shape: Shape {
                services: 10_000,
                endpoints: 10,
            },
            mode: "nftables",
            cadence: Cadence {
                length: Duration::from_secs(300),
                endpoint_changes: 100,
                service_turnovers: 1,
                watch_drop_every: Duration::from_secs(60),
                relist_every: Duration::from_secs(150),
                sample_every: Duration::from_secs(30),
            },
            first_sync: Outcome::Done(Duration::from_millis(1_800)),
            stopped: None,
            written: Written {
                endpoint_changes: 30_000,
                services_created: 300,
                services_deleted: 290,
                watch_drops: 4,
                relists: 1,
                lists_seen: 3,
                slice_events_counted: Some(40_590),
            },
            samples,
            elapsed: Duration::from_secs(300),
        }
    }

    #[test]
    fn the_section_shows_growth_after_warm_up_and_rss_per_minute() {
        let rss: Vec<(u64, u64)> = (0..=10).map(|i| (i * 30, 100 + i)).collect();
        let row = soak_row(&rss, (0, 7, 7));
        let mut out = String::new();
        section(&mut out, &[row]);
        assert!(
            out.ends_with("](benchmarks/soak-rss.svg)\n\n"),
            "the plot ends the section: {out}"
        );
        // Warm-up: 60 s; 102 MiB then, 110 MiB at the end: +7.8 %; RssAnon 82 → 90: +9.8 %.
        assert!(
            out.contains(
                "| 30,000 endpoint changes, 300 Services created / 290 deleted, 4 watch drops, 1 forced relists | 102.0 MiB (at 60 s) | 110.0 MiB | +7.8 % | +9.8 % | 110.0 MiB | 150.0 MiB | none |"
            ),
            "{out}"
        );
        let minutes: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("| ") && l.contains(" min "))
            .collect();
        assert_eq!(minutes.len(), 6, "{out}");
        assert!(
            minutes[5].starts_with("| 5 min 00 s | 110.0 MiB | 90.0 MiB | 150.0 MiB | 30,000 | 10,010 | 7 |"),
            "{out}"
        );
        assert!(
            out.contains("the proxy counted 40,590 slice events against 30,590 slice writes"),
            "{out}"
        );
    }

    #[test]
    fn a_family_gaining_series_is_named_in_bold() {
        let row = soak_row(&[(0, 100), (120, 100), (240, 100), (300, 100)], (240, 7, 9));
        let mut out = String::new();
        summary_table(&mut out, &[row]);
        assert!(out.contains("| +0.0 % |"), "{out}");
        assert!(out.ends_with("| **f: 7 → 9 (max 9)** |\n"), "{out}");
    }
}

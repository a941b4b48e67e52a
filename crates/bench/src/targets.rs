//! The issues' targets against this run's figures, as a table: each target with the measured
//! value and whether it is met, so a regression shows in review. Issue 9 (nftables mode):
//! backend sync times, memory at 50k and the programming latency under churn; issue 12: the
//! real binary's first sync at 10k, from the API server and from manifests, in both modes,
//! and its memory and metric series flat under churn (the soak); issue 10: the userspace
//! mode's data path at least as fast as HAProxy's on every figure of the L4 run.

use std::fmt::Write as _;
use std::time::Duration;

use crate::e2e::E2eSource;
use crate::format::{duration, mebibytes, mebibytes_tenths, outcome};
use crate::load::Outcome;
use crate::nftables::NftRow;
use crate::report::Measured;
use crate::soak::samples::{growth, rss, series_changes};
use crate::soak::schedule::warm_up;

/// One line of the targets table.
struct Target {
    what: String,
    target: &'static str,
    measured: Option<String>,
    met: Option<bool>,
}

pub fn targets_section(m: &Measured<'_>) -> String {
    let mut lines = backend_targets(m.nft_rows);
    let rss = m
        .e2e_rows
        .iter()
        .filter(|r| r.mode == "nftables" && r.shape.services == 50_000)
        .filter_map(|r| r.memory.peak_kib)
        .max();
    lines.push(Target {
        what: "whole-process peak RSS at 50k (the real binary, the larger of both sources)".to_string(),
        target: "≤ 128 MiB",
        measured: rss.map(mebibytes),
        met: rss.map(|kib| kib <= 128 * 1024),
    });
    lines.extend(churn_targets(m));
    lines.extend(first_sync_targets(m));
    lines.extend(soak_targets(m));
    lines.extend(l4_targets(m));
    render(&lines)
}

/// Issue 9: the nftables backend's own syncs.
fn backend_targets(nft_rows: &[NftRow]) -> Vec<Target> {
    let mut lines = Vec::new();
    for (services, limit) in [(10_000, 1.0), (50_000, 5.0)] {
        let cold = nft(nft_rows, services).and_then(|r| done(&r.cold));
        lines.push(time_target(
            format!("cold full sync, {services} Services (backend)"),
            if services == 10_000 { "≤ 1 s" } else { "≤ 5 s" },
            cold,
            limit,
        ));
    }
    let at_50k = nft(nft_rows, 50_000);
    let p99 = |pick: fn(&NftRow) -> &Outcome<crate::nftables::Spread>| {
        at_50k.and_then(|r| match pick(r) {
            Outcome::Done(s) => Some(s.p99),
            _ => None,
        })
    };
    lines.push(time_target(
        "one endpoint change at 50k, p99".to_string(),
        "≤ 5 ms",
        p99(|r| &r.endpoint_change),
        0.005,
    ));
    lines.push(time_target(
        "one new Service at 50k, p99".to_string(),
        "≤ 5 ms",
        p99(|r| &r.new_service),
        0.005,
    ));
    lines
}

/// Issue 9: p99 network programming latency under churn, per nftables churn run.
fn churn_targets(m: &Measured<'_>) -> Vec<Target> {
    let what = |detail: String| format!("network programming latency under churn, p99{detail}");
    let lines: Vec<Target> = m
        .churn_rows
        .iter()
        .filter(|r| r.mode == "nftables")
        .map(|r| {
            let detail = format!(
                " ({} Services, {}/s for {} s, min sync period {})",
                crate::format::count(r.shape.services),
                r.rate,
                r.seconds,
                r.min_sync_period.as_deref().unwrap_or("default")
            );
            let p99 = match &r.first_sync {
                Outcome::Done(_) => match &r.latency {
                    Outcome::Done(l) => Outcome::Done(l.p99),
                    Outcome::TimedOut(t) => Outcome::TimedOut(*t),
                    Outcome::NotAvailable(why) => Outcome::NotAvailable(why.clone()),
                    Outcome::Failed(why) => Outcome::Failed(why.clone()),
                },
                no_sync => no_sync.clone(),
            };
            outcome_target(what(detail), "≤ 100 ms", &p99, 0.1)
        })
        .collect();
    if lines.is_empty() {
        return vec![time_target(what(String::new()), "≤ 100 ms", None, 0.1)];
    }
    lines
}

/// Issue 12: the real binary's first sync at 10k, per mode and source.
fn first_sync_targets(m: &Measured<'_>) -> Vec<Target> {
    m.e2e_rows
        .iter()
        .filter(|r| r.shape.services == 10_000)
        .map(|r| {
            let (target, limit) = match r.source {
                E2eSource::Api => ("≤ 2 s", 2.0),
                E2eSource::Manifest => ("≤ 3 s", 3.0),
            };
            let what = format!(
                "first sync at 10k from the {} ({} mode, the real binary)",
                r.source.label(),
                r.mode
            );
            outcome_target(what, target, &r.first_sync, limit)
        })
        .collect()
}

/// Issue 12: flat under churn, per soak run: RSS growth after the warm-up, and no metric
/// family gaining series.
fn soak_targets(m: &Measured<'_>) -> Vec<Target> {
    if m.soak_rows.is_empty() {
        return vec![Target {
            what: "RSS growth after warm-up, soak".to_string(),
            target: "≤ 5 %",
            measured: None,
            met: None,
        }];
    }
    let mut lines = Vec::new();
    for row in m.soak_rows {
        let warm = warm_up(row.cadence.length);
        let detail = format!(
            "{} Services, {} mode, {} min, {} endpoint changes/s",
            crate::format::count(row.shape.services),
            row.mode,
            row.elapsed.as_secs() / 60,
            row.cadence.endpoint_changes
        );
        let stopped = row.stopped.as_deref().map(crate::format::one_line);
        let g = growth(&row.samples, warm, rss);
        lines.push(Target {
            what: format!("RSS growth after warm-up, soak ({detail})"),
            target: "≤ 5 %",
            measured: match (&stopped, g) {
                (Some(why), _) => Some(format!("stopped: {why}")),
                (None, Some(g)) => Some(format!(
                    "{:+.1} % ({} → {})",
                    g.percent,
                    mebibytes_tenths(g.warm_kib),
                    mebibytes_tenths(g.end_kib)
                )),
                (None, None) => None,
            },
            met: g.filter(|_| stopped.is_none()).map(|g| g.percent <= 5.0),
        });
        let scraped = row.samples.iter().any(|s| s.series.is_some());
        let changed = series_changes(&row.samples, warm);
        lines.push(Target {
            what: format!("metric series per family after warm-up, soak ({detail})"),
            target: "no growth",
            measured: scraped.then(|| match changed.len() {
                0 => "flat".to_string(),
                n => format!("{n} families changed"),
            }),
            met: (scraped && stopped.is_none()).then_some(changed.iter().all(|c| c.max <= c.at_warm)),
        });
    }
    lines
}

/// Issue 10: the userspace mode against HAProxy's better configuration, figure by figure
/// (only when the L4 run was made: it is not in the default run).
fn l4_targets(m: &Measured<'_>) -> Vec<Target> {
    let Some(run) = m.l4 else {
        return Vec::new();
    };
    crate::l4::report::versus_haproxy(run)
        .into_iter()
        .map(|line| Target {
            what: format!("L4, userspace mode: {}", line.what),
            target: "at least HAProxy's",
            measured: line.ours.map(|ours| {
                format!(
                    "{ours} (HAProxy {})",
                    line.haproxy.as_deref().unwrap_or("not measured")
                )
            }),
            met: line.met,
        })
        .collect()
}

fn nft(rows: &[NftRow], services: usize) -> Option<&NftRow> {
    rows.iter().find(|r| r.shape.services == services)
}

fn done(outcome: &Outcome<Duration>) -> Option<Duration> {
    match outcome {
        Outcome::Done(d) => Some(*d),
        _ => None,
    }
}

fn time_target(what: String, target: &'static str, measured: Option<Duration>, limit_secs: f64) -> Target {
    Target {
        what,
        target,
        measured: measured.map(duration),
        met: measured.map(|d| d.as_secs_f64() <= limit_secs),
    }
}

/// A time target from an outcome: a timeout is a miss, a run that could not measure is no
/// verdict.
fn outcome_target(
    what: String,
    target: &'static str,
    measured: &Outcome<Duration>,
    limit_secs: f64,
) -> Target {
    let met = match measured {
        Outcome::Done(d) => Some(d.as_secs_f64() <= limit_secs),
        Outcome::TimedOut(_) => Some(false),
        Outcome::NotAvailable(_) | Outcome::Failed(_) => None,
    };
    Target {
        what,
        target,
        measured: Some(outcome(measured, |d| duration(*d))),
        met,
    }
}

fn render(lines: &[Target]) -> String {
    let mut out = String::from(
        "### Against the issues' targets\n\n\
         | what | target | this run | met |\n|---|---|---:|---|\n",
    );
    for line in lines {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            line.what,
            line.target,
            line.measured.as_deref().unwrap_or("not measured"),
            match line.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            }
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{churn_row, e2e_row};
    use crate::soak::report::tests::soak_row;

    fn section(e2e: &[crate::e2e::E2eRow], churn: &[crate::churn::ChurnRow]) -> String {
        targets_section(&Measured {
            rows: &[],
            nft_rows: &[],
            ebpf_rows: &[],
            e2e_rows: e2e,
            churn_rows: churn,
            soak_rows: &[],
            stage_rows: &[],
            l4: None,
        })
    }

    #[test]
    fn soak_growth_is_judged_against_5_percent_and_series_against_none() {
        let flat = soak_row(&[(0, 90), (60, 100), (300, 105)], (0, 7, 7));
        let grown = soak_row(&[(0, 90), (60, 100), (300, 106)], (200, 7, 8));
        let mut stopped = soak_row(&[(0, 90), (60, 100)], (0, 7, 7));
        stopped.stopped = Some("kube-proxy-rs exited".into());
        let text = targets_section(&Measured {
            rows: &[],
            nft_rows: &[],
            ebpf_rows: &[],
            e2e_rows: &[],
            churn_rows: &[],
            soak_rows: &[flat, grown, stopped],
            stage_rows: &[],
            l4: None,
        });
        let what = "(10,000 Services, nftables mode, 5 min, 100 endpoint changes/s)";
        for line in [
            format!(
                "| RSS growth after warm-up, soak {what} | ≤ 5 % | +5.0 % (100.0 MiB → 105.0 MiB) | yes |"
            ),
            format!("| metric series per family after warm-up, soak {what} | no growth | flat | yes |"),
            format!(
                "| RSS growth after warm-up, soak {what} | ≤ 5 % | +6.0 % (100.0 MiB → 106.0 MiB) | **no** |"
            ),
            format!(
                "| metric series per family after warm-up, soak {what} | no growth | 1 families changed | **no** |"
            ),
            format!("| RSS growth after warm-up, soak {what} | ≤ 5 % | stopped: kube-proxy-rs exited | — |"),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        let none = section(&[], &[]);
        assert!(
            none.contains("| RSS growth after warm-up, soak | ≤ 5 % | not measured | — |"),
            "{none}"
        );
    }

    #[test]
    fn churn_p99_is_judged_against_100_ms_per_nftables_run() {
        let text = section(
            &[],
            &[
                churn_row("nftables", 6_000, 80),
                churn_row("nftables", 6_000, 140),
                churn_row("iptables", 6_000, 900),
            ],
        );
        let latency: Vec<&str> = text.lines().filter(|l| l.contains("under churn")).collect();
        assert_eq!(latency.len(), 2, "{text}");
        assert!(
            latency[0].ends_with(
                "(10,000 Services, 100/s for 60 s, min sync period 1s) | ≤ 100 ms | 80.0 ms | yes |"
            ),
            "{text}"
        );
        assert!(latency[1].ends_with("| ≤ 100 ms | 140 ms | **no** |"), "{text}");
        let none = section(&[], &[]);
        assert!(
            none.contains("| network programming latency under churn, p99 | ≤ 100 ms | not measured | — |"),
            "{none}"
        );
    }

    #[test]
    fn first_sync_targets_depend_on_the_source_and_a_timeout_is_a_miss() {
        let rows = [
            e2e_row(
                "nftables",
                E2eSource::Api,
                Outcome::Done(Duration::from_millis(1_900)),
            ),
            e2e_row(
                "nftables",
                E2eSource::Manifest,
                Outcome::Done(Duration::from_millis(2_500)),
            ),
            e2e_row(
                "nftables",
                E2eSource::Api,
                Outcome::Done(Duration::from_millis(2_500)),
            ),
            e2e_row(
                "iptables",
                E2eSource::Manifest,
                Outcome::TimedOut(Duration::from_secs(120)),
            ),
        ];
        let text = section(&rows, &[]);
        for line in [
            "| first sync at 10k from the test API server (nftables mode, the real binary) | ≤ 2 s | 1.90 s | yes |",
            "| first sync at 10k from the manifest file (nftables mode, the real binary) | ≤ 3 s | 2.50 s | yes |",
            "| first sync at 10k from the test API server (nftables mode, the real binary) | ≤ 2 s | 2.50 s | **no** |",
            "| first sync at 10k from the manifest file (iptables mode, the real binary) | ≤ 3 s | timed out after 120 s | **no** |",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn l4_lines_compare_the_userspace_mode_with_haproxy_and_are_absent_without_the_run() {
        use crate::l4::report::tests::{figures, run};
        let measured = run(Outcome::Done(figures(6.0, 7_500, 1)));
        let with = |l4| {
            targets_section(&Measured {
                rows: &[],
                nft_rows: &[],
                ebpf_rows: &[],
                e2e_rows: &[],
                churn_rows: &[],
                soak_rows: &[],
                stage_rows: &[],
                l4,
            })
        };
        let text = with(Some(&measured));
        for line in [
            "| L4, userspace mode: bulk throughput, 1 stream | at least HAProxy's | 6.00 Gbit/s (HAProxy 5.00 Gbit/s) | yes |",
            "| L4, userspace mode: new connections/s, 32 at once | at least HAProxy's | 7,500/s (HAProxy 8,000/s) | **no** |",
            "| L4, userspace mode: connect + request latency p99, one at a time | at least HAProxy's | 1.00 ms (HAProxy 2.00 ms) | yes |",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        let failed = run(Outcome::Failed("not available".into()));
        assert!(with(Some(&failed)).contains(
            "| L4, userspace mode: bulk throughput, 1 stream | at least HAProxy's | not measured | — |"
        ));
        assert!(!with(None).contains("L4"));
    }
}

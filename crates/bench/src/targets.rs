//! The targets for nftables mode against this run's figures, as a table: each target
//! with the measured value and whether it is met, so a regression shows in review.

use std::fmt::Write as _;
use std::time::Duration;

use crate::e2e::E2eRow;
use crate::format::{duration, mebibytes};
use crate::load::Outcome;
use crate::nftables::NftRow;

/// One line of the targets table.
struct Target {
    what: String,
    target: &'static str,
    measured: Option<String>,
    met: Option<bool>,
}

pub fn targets_section(nft_rows: &[NftRow], e2e_rows: &[E2eRow]) -> String {
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
    let rss = e2e_rows
        .iter()
        .find(|r| r.mode == "nftables" && r.shape.services == 50_000)
        .and_then(|r| r.peak_rss_kib);
    lines.push(Target {
        what: "whole-process peak RSS at 50k (the real binary)".to_string(),
        target: "≤ 128 MiB",
        measured: rss.map(mebibytes),
        met: rss.map(|kib| kib <= 128 * 1024),
    });
    lines.push(Target {
        what: "network programming latency under churn, p99".to_string(),
        target: "≤ 100 ms",
        measured: None,
        met: None,
    });
    render(&lines)
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

fn render(lines: &[Target]) -> String {
    let mut out = String::from(
        "### nftables mode against the issue's targets\n\n\
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

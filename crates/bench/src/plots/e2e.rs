//! The real binary end to end: spawn to first sync and peak RSS against the number of
//! Services (log axis), one line per mode and source, in two panels side by side.

use std::collections::BTreeMap;

use plotters::prelude::*;

use super::Figure;
use super::chart::{self, failed};
use crate::e2e::E2eRow;
use crate::format::count;

pub const FIGURE: Figure = Figure {
    file: "e2e-cold-sync.svg",
    alt: "Spawn to first sync and peak RSS against the number of Services, per mode and source",
};

/// `(label, points)` of one panel's lines.
type Lines = Vec<(String, Vec<(f64, f64)>)>;

/// Whether any row has a first sync or a peak RSS to draw.
pub fn drawn(rows: &[E2eRow]) -> bool {
    !lines(rows, sync_seconds).is_empty() || !lines(rows, peak_mib).is_empty()
}

/// The two panels, or `None` when no row has either figure.
pub fn svg(rows: &[E2eRow]) -> Option<Result<String, String>> {
    let sync = lines(rows, sync_seconds);
    let peak = lines(rows, peak_mib);
    if sync.is_empty() && peak.is_empty() {
        return None;
    }
    Some(chart::svg((1200, 480), |area| {
        let panels = area.split_evenly((1, 2));
        panel(&panels[0], "Spawn to first sync", "seconds", &sync)?;
        panel(&panels[1], "Peak RSS (VmHWM)", "MiB", &peak)
    }))
}

fn sync_seconds(row: &E2eRow) -> Option<f64> {
    row.first_sync.done().map(std::time::Duration::as_secs_f64)
}

fn peak_mib(row: &E2eRow) -> Option<f64> {
    row.memory.peak_kib.map(|kib| kib as f64 / 1024.0)
}

/// One line per mode and source: `(Services, figure)` in increasing Services, rows without
/// the figure left out.
fn lines(rows: &[E2eRow], figure: fn(&E2eRow) -> Option<f64>) -> Lines {
    let mut by_key: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for row in rows {
        if let Some(value) = figure(row) {
            let key = format!("{}, {}", row.mode, row.source.label());
            by_key
                .entry(key)
                .or_default()
                .push((row.shape.services as f64, value));
        }
    }
    for points in by_key.values_mut() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    by_key.into_iter().collect()
}

fn panel(area: &chart::Area<'_>, title: &str, unit: &str, lines: &Lines) -> Result<(), String> {
    let points = || lines.iter().flat_map(|(_, l)| l.iter());
    let x = chart::log_range(points().map(|p| p.0));
    let y = chart::zero_to(points().map(|p| p.1));
    let mut chart = chart::builder(area, title)
        .build_cartesian_2d(x.log_scale(), y)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc("Services (log scale)")
        .y_desc(unit)
        .x_label_formatter(&|v| count(v.round() as usize))
        .y_label_formatter(&chart::number)
        .draw()
        .map_err(failed)?;
    for (index, (label, points)) in lines.iter().enumerate() {
        chart::line(&mut chart, points.clone(), label, index)?;
    }
    if lines.is_empty() {
        return Ok(());
    }
    chart::legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::e2e::E2eSource;
    use crate::load::Outcome;
    use crate::report::tests::e2e_row;

    fn at(services: usize, mode: &'static str, source: E2eSource, secs: u64) -> E2eRow {
        let mut row = e2e_row(mode, source, Outcome::Done(Duration::from_secs(secs)));
        row.shape.services = services;
        row
    }

    #[test]
    fn each_mode_and_source_is_a_line_over_the_services() {
        let rows = [
            at(10_000, "nftables", E2eSource::Api, 4),
            at(1_000, "nftables", E2eSource::Api, 1),
            at(1_000, "iptables", E2eSource::Manifest, 2),
            at(100_000, "iptables", E2eSource::Manifest, 30),
        ];
        let sync = lines(&rows, sync_seconds);
        assert_eq!(sync.len(), 2);
        assert_eq!(sync[0].0, "iptables, manifest file");
        assert_eq!(
            sync[1],
            (
                "nftables, test API server".to_string(),
                vec![(1e3, 1.0), (1e4, 4.0)]
            )
        );
        let svg = svg(&rows).unwrap().unwrap();
        for text in [
            "Spawn to first sync",
            "Peak RSS (VmHWM)",
            "Services (log scale)",
            "seconds",
            "MiB",
            "iptables, manifest file",
            "nftables, test API server",
            "10,000",
        ] {
            assert!(svg.contains(text), "{text} missing: {svg}");
        }
    }

    #[test]
    fn a_row_without_a_sync_still_shows_its_memory() {
        let mut row = e2e_row(
            "nftables",
            E2eSource::Api,
            Outcome::TimedOut(Duration::from_secs(60)),
        );
        assert!(lines(std::slice::from_ref(&row), sync_seconds).is_empty());
        assert!(drawn(std::slice::from_ref(&row)));
        assert!(svg(std::slice::from_ref(&row)).unwrap().is_ok());
        row.memory.peak_kib = None;
        assert!(!drawn(std::slice::from_ref(&row)));
        assert!(svg(&[row]).is_none());
        assert!(svg(&[]).is_none());
    }
}

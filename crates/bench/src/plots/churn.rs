//! Programming latency under churn: per row (mode, min sync period), the share of changes
//! programmed within a latency, read off the proxy's histogram at its bucket bounds and
//! joined by straight lines (the linear interpolation `histogram_quantile` uses, so the
//! table's p50 and p99 lie on the curve); latency on a log axis.

use plotters::prelude::*;

use super::Figure;
use super::chart::{self, failed};
use crate::churn::ChurnRow;
use crate::format::count;

pub const FIGURE: Figure = Figure {
    file: "churn-latency.svg",
    alt: "Network programming latency under churn: share of changes programmed within a latency, per mode and min sync period",
};

/// Whether any row has a latency distribution to draw.
pub fn drawn(rows: &[ChurnRow]) -> bool {
    rows.iter().any(|row| curve(row).is_some())
}

/// The CDF plot, or `None` without a distribution.
pub fn svg(rows: &[ChurnRow]) -> Option<Result<String, String>> {
    let curves: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
        .filter_map(|row| Some((label(row), curve(row)?)))
        .collect();
    (!curves.is_empty()).then(|| chart::svg((900, 520), |area| draw(area, &curves)))
}

fn label(row: &ChurnRow) -> String {
    format!(
        "{} × {}, {}, min sync period {}",
        count(row.shape.services),
        row.shape.endpoints,
        row.mode,
        row.min_sync_period.as_deref().unwrap_or("default")
    )
}

/// `(latency in ms, share of samples at or below it)` at each finite bucket bound, from the
/// last bound still at 0 to the first at every sample; `None` without samples.
fn curve(row: &ChurnRow) -> Option<Vec<(f64, f64)>> {
    let latency = row.latency.done()?;
    if latency.samples == 0 {
        return None;
    }
    let total = latency.samples as f64;
    let points: Vec<(f64, f64)> = latency
        .buckets
        .iter()
        .filter(|(le, _)| le.is_finite() && *le > 0.0)
        .map(|&(le, n)| (le * 1e3, n as f64 / total))
        .collect();
    let start = points.iter().rposition(|p| p.1 == 0.0).unwrap_or(0);
    let end = points
        .iter()
        .position(|p| p.1 >= 1.0)
        .map_or(points.len(), |i| i + 1);
    let points = points.get(start..end)?.to_vec();
    (!points.is_empty()).then_some(points)
}

fn draw(area: &chart::Area<'_>, curves: &[(String, Vec<(f64, f64)>)]) -> Result<(), String> {
    let x = chart::log_range(curves.iter().flat_map(|(_, c)| c.iter().map(|p| p.0)));
    let mut chart = chart::builder(area, "Network programming latency under churn")
        .build_cartesian_2d(x.log_scale(), 0.0..1.0)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc("latency (ms, log scale)")
        .y_desc("changes programmed within it")
        .x_label_formatter(&chart::number)
        .y_label_formatter(&|v: &f64| format!("{:.0} %", v * 100.0))
        .draw()
        .map_err(failed)?;
    for (index, (label, points)) in curves.iter().enumerate() {
        chart::line(&mut chart, points.clone(), label, index)?;
    }
    chart::legend(&mut chart, SeriesLabelPosition::LowerRight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Outcome;
    use crate::plots::chart::Hex;
    use crate::report::tests::churn_row;

    #[test]
    fn each_row_is_a_named_curve_on_a_log_latency_axis() {
        let mut short = churn_row("nftables", 100, 40);
        short.min_sync_period = None;
        let rows = [churn_row("iptables", 100, 40), short];
        assert!(drawn(&rows));
        let svg = svg(&rows).unwrap().unwrap();
        assert!(svg.contains("Network programming latency under churn"), "{svg}");
        assert!(svg.contains("latency (ms, log scale)"), "{svg}");
        assert!(svg.contains("10,000 × 10, iptables, min sync period 1s"), "{svg}");
        assert!(
            svg.contains("10,000 × 10, nftables, min sync period default"),
            "{svg}"
        );
        assert!(svg.contains("50 %"), "{svg}");
        // Each curve and its legend mark in its own colour, a point per bucket bound.
        for index in 0..2 {
            let stroke = format!("stroke=\"{}\"", chart::color(index).to_hex());
            let lines = svg
                .lines()
                .filter(|l| l.starts_with("<polyline") && l.contains(&stroke));
            assert_eq!(lines.count(), 2, "{stroke} in {svg}");
        }
        assert_eq!(svg.matches("<circle").count(), 4, "{svg}");
    }

    #[test]
    fn the_curve_runs_from_the_last_empty_bound_to_the_first_full_one() {
        let mut row = churn_row("nftables", 10, 40);
        if let Outcome::Done(latency) = &mut row.latency {
            latency.buckets = vec![
                (0.001, 0),
                (0.002, 0),
                (0.005, 5),
                (0.01, 10),
                (0.1, 10),
                (f64::INFINITY, 10),
            ];
        }
        assert_eq!(curve(&row), Some(vec![(2.0, 0.0), (5.0, 0.5), (10.0, 1.0)]));
    }

    #[test]
    fn rows_without_a_distribution_draw_nothing() {
        let mut row = churn_row("nftables", 0, 40);
        assert!(!drawn(std::slice::from_ref(&row)));
        row.latency = Outcome::Failed("no first sync".into());
        assert!(svg(&[row]).is_none());
        assert!(svg(&[]).is_none());
    }
}

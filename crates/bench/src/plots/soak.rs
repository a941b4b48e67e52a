//! RSS over the soak: the proxy's `VmRSS` in MiB against the minutes since its first sync,
//! one line per soak row.

use plotters::prelude::*;

use super::Figure;
use super::chart::{self, failed};
use crate::format::count;
use crate::soak::SoakRow;

pub const FIGURE: Figure = Figure {
    file: "soak-rss.svg",
    alt: "Resident memory (VmRSS) of the proxy over the soak, per run",
};

/// Whether any row has an RSS sample to draw.
pub fn drawn(rows: &[SoakRow]) -> bool {
    rows.iter().any(|row| !line(row).is_empty())
}

/// The RSS-over-time plot, or `None` without a sample.
pub fn svg(rows: &[SoakRow]) -> Option<Result<String, String>> {
    let lines: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
        .map(|row| (label(row), line(row)))
        .filter(|(_, points)| !points.is_empty())
        .collect();
    (!lines.is_empty()).then(|| chart::svg((900, 480), |area| draw(area, &lines)))
}

fn label(row: &SoakRow) -> String {
    format!(
        "{} × {}, {}",
        count(row.shape.services),
        row.shape.endpoints,
        row.mode
    )
}

/// `(minutes, MiB)` of every sample whose RSS was read.
fn line(row: &SoakRow) -> Vec<(f64, f64)> {
    row.samples
        .iter()
        .filter_map(|s| Some((s.at.as_secs_f64() / 60.0, s.memory.rss_kib? as f64 / 1024.0)))
        .collect()
}

fn draw(area: &chart::Area<'_>, lines: &[(String, Vec<(f64, f64)>)]) -> Result<(), String> {
    let points = || lines.iter().flat_map(|(_, l)| l.iter());
    let x = chart::zero_to(points().map(|p| p.0));
    let y = chart::zero_to(points().map(|p| p.1));
    let mut chart = chart::builder(area, "RSS over the soak")
        .build_cartesian_2d(x, y)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc("minutes since the first sync")
        .y_desc("RSS (VmRSS, MiB)")
        .x_label_formatter(&chart::number)
        .y_label_formatter(&chart::number)
        .draw()
        .map_err(failed)?;
    for (index, (label, points)) in lines.iter().enumerate() {
        chart::line(&mut chart, points.clone(), label, index)?;
    }
    chart::legend(&mut chart, SeriesLabelPosition::LowerRight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::report::tests::soak_row;

    #[test]
    fn each_soak_is_a_line_of_mib_over_minutes() {
        let mut iptables = soak_row(&[(0, 100), (150, 104), (300, 108)], (0, 7, 7));
        iptables.mode = "iptables";
        let rows = [soak_row(&[(0, 100), (300, 110)], (0, 7, 7)), iptables];
        assert!(drawn(&rows));
        assert_eq!(line(&rows[1]), vec![(0.0, 100.0), (2.5, 104.0), (5.0, 108.0)]);
        let svg = svg(&rows).unwrap().unwrap();
        assert!(svg.contains("RSS over the soak"), "{svg}");
        assert!(svg.contains("minutes since the first sync"), "{svg}");
        assert!(svg.contains("RSS (VmRSS, MiB)"), "{svg}");
        assert!(svg.contains("10,000 × 10, nftables"), "{svg}");
        assert!(svg.contains("10,000 × 10, iptables"), "{svg}");
    }

    #[test]
    fn a_soak_without_samples_draws_nothing() {
        let mut row = soak_row(&[(0, 100)], (0, 7, 7));
        row.samples[0].memory.rss_kib = None;
        assert!(!drawn(std::slice::from_ref(&row)));
        assert!(svg(&[row]).is_none());
        assert!(svg(&[]).is_none());
    }
}

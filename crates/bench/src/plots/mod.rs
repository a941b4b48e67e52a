//! The report's plots, drawn with plotters' SVG backend from the same rows the tables show:
//! programming latency under churn (a CDF per mode and min sync period), RSS over the soak,
//! the end-to-end cold sync time and peak RSS against the number of Services, and the L4
//! paths as bars.
//!
//! Drawing is pure: each plot's `svg` takes rows and returns the SVG text (`None` when its
//! rows hold nothing to draw), and the report embeds a plot exactly when its `drawn` says
//! so. [`write_beside`] is the one place that writes files: `benchmarks/*.svg` beside the
//! report. No fonts are read: the SVG holds `<text>` elements the viewer renders.

mod chart;
pub mod churn;
pub mod e2e;
pub mod l4;
pub mod soak;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::report::Measured;

/// The folder beside the report the SVGs go to (the report links them relative to itself).
pub const DIR: &str = "benchmarks";

/// One plot: its file in [`DIR`] and the alt text the report gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figure {
    pub file: &'static str,
    pub alt: &'static str,
}

/// The Markdown image line showing `figure`, at the end of its section.
pub fn embed(out: &mut String, figure: &Figure) {
    let _ = writeln!(out, "![{}]({DIR}/{})\n", figure.alt, figure.file);
}

/// Every plot the measured rows allow, as SVG text; no I/O.
pub fn render(m: &Measured<'_>) -> Result<Vec<(Figure, String)>, String> {
    let plots = [
        (churn::FIGURE, churn::svg(m.churn_rows)),
        (soak::FIGURE, soak::svg(m.soak_rows)),
        (e2e::FIGURE, e2e::svg(m.e2e_rows)),
        (m.l4.map_or(l4::FIGURE, l4::figure), m.l4.and_then(l4::svg)),
    ];
    plots
        .into_iter()
        .filter_map(|(figure, svg)| Some(svg?.map(|svg| (figure, svg))))
        .collect()
}

/// Draws every plot and writes it into [`DIR`] beside `report`; without a plot nothing is
/// written, not even the folder. Returns the files written.
pub fn write_beside(report: &Path, m: &Measured<'_>) -> Result<Vec<PathBuf>, String> {
    let dir = report.parent().unwrap_or_else(|| Path::new("")).join(DIR);
    write_into(&dir, &render(m)?)
}

fn write_into(dir: &Path, plots: &[(Figure, String)]) -> Result<Vec<PathBuf>, String> {
    if plots.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    plots
        .iter()
        .map(|(figure, svg)| {
            let path = dir.join(figure.file);
            std::fs::write(&path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{churn_row, measured_none};

    fn scratch_dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("kpr-bench-{}-plots-{name}", std::process::id()))
    }

    #[test]
    fn without_rows_nothing_is_drawn_or_written() {
        let none = measured_none();
        assert!(render(&none).unwrap().is_empty());
        let dir = scratch_dir("none");
        let report = dir.join("BENCHMARKS.md");
        assert!(write_beside(&report, &none).unwrap().is_empty());
        assert!(!dir.join(DIR).exists());
    }

    #[test]
    fn plots_are_written_into_the_folder_beside_the_report() {
        let rows = [churn_row("nftables", 6_000, 40)];
        let m = Measured {
            churn_rows: &rows,
            ..measured_none()
        };
        let dir = scratch_dir("churn");
        let written = write_beside(&dir.join("BENCHMARKS.md"), &m).unwrap();
        assert_eq!(written, vec![dir.join("benchmarks/churn-latency.svg")]);
        let svg = std::fs::read_to_string(&written[0]).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_image_line_links_into_the_folder() {
        let mut out = String::new();
        embed(&mut out, &churn::FIGURE);
        assert!(out.starts_with("![Network programming latency"), "{out}");
        assert!(out.ends_with("](benchmarks/churn-latency.svg)\n\n"), "{out}");
    }
}

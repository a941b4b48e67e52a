//! The L4 paths as bars: new connections per second, and bulk throughput over one stream and
//! over the run's streams, one bar per path that has figures, in the report's path order
//! (top to bottom); three panels one above the other.

use plotters::prelude::*;

use super::Figure;
use super::chart::{self, failed};
use crate::l4::L4Run;
use crate::l4::cluster::{Path, Placement};
use crate::l4::figures::{Figures, gbit_per_second, rounds_per_second};

pub const FIGURE: Figure = Figure {
    file: "l4-paths.svg",
    alt: "L4 paths: new connections per second, and throughput over 1 stream and over several streams",
};

/// The same bars for a run whose client is a pod (its own section, its own file).
pub const POD_FIGURE: Figure = Figure {
    file: "l4-pod-paths.svg",
    alt: "L4 paths from a pod: new connections per second, and throughput over 1 stream and over several streams",
};

/// The figure of `run`, by where its client ran.
pub fn figure(run: &L4Run) -> Figure {
    match run.placement {
        Placement::Outside => FIGURE,
        Placement::Pod => POD_FIGURE,
    }
}

/// Height of one bar's slot, and what a panel needs besides its bars.
const BAR_HEIGHT: u32 = 30;
const PANEL_FRAME: u32 = 110;

/// Whether any path has figures.
pub fn drawn(run: &L4Run) -> bool {
    !measured(run).is_empty()
}

/// The bars, or `None` when no path has figures.
pub fn svg(run: &L4Run) -> Option<Result<String, String>> {
    let paths = measured(run);
    if paths.is_empty() {
        return None;
    }
    let labels: Vec<&str> = paths.iter().map(|(path, _)| path.label()).collect();
    let values = |figure: fn(&Figures) -> f64| paths.iter().map(|(_, f)| figure(f)).collect::<Vec<_>>();
    let panels = [
        (
            "New connections per second".to_string(),
            "connections/s",
            values(connections),
        ),
        ("Throughput, 1 stream".to_string(), "Gbit/s", values(one_stream)),
        (
            format!("Throughput, {} streams", run.streams),
            "Gbit/s",
            values(streams),
        ),
    ];
    let height = panels.len() as u32 * (PANEL_FRAME + BAR_HEIGHT * labels.len() as u32);
    Some(chart::svg((1000, height), |area| {
        let areas = area.split_evenly((panels.len(), 1));
        panels
            .iter()
            .zip(&areas)
            .try_for_each(|((title, unit, values), area)| bars(area, title, unit, &labels, values))
    }))
}

fn connections(f: &Figures) -> f64 {
    rounds_per_second(&f.connections.result)
}

fn one_stream(f: &Figures) -> f64 {
    gbit_per_second(&f.one_stream.result)
}

fn streams(f: &Figures) -> f64 {
    gbit_per_second(&f.streams.result)
}

/// Every path with figures, in [`Path::ALL`]'s order.
fn measured(run: &L4Run) -> Vec<(Path, &Figures)> {
    Path::ALL
        .iter()
        .filter_map(|&path| Some((path, run.row(path)?)))
        .collect()
}

/// Horizontal bars, the first label on top.
fn bars(
    area: &chart::Area<'_>,
    title: &str,
    unit: &str,
    labels: &[&str],
    values: &[f64],
) -> Result<(), String> {
    let n = labels.len();
    let label_of = |v: &SegmentValue<usize>| match v {
        SegmentValue::Exact(i) | SegmentValue::CenterOf(i) => n
            .checked_sub(i + 1)
            .and_then(|k| labels.get(k))
            .copied()
            .unwrap_or("")
            .to_string(),
        SegmentValue::Last => String::new(),
    };
    let mut chart = chart::builder(area, title)
        .y_label_area_size(360)
        .build_cartesian_2d(chart::zero_to(values.iter().copied()), (0..n).into_segmented())
        .map_err(failed)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(unit)
        .y_labels(n)
        .x_label_formatter(&chart::number)
        .y_label_formatter(&label_of)
        .draw()
        .map_err(failed)?;
    let bars = Histogram::horizontal(&chart)
        .style(chart::color(0).filled())
        .margin(5)
        .data(values.iter().rev().enumerate().map(|(i, v)| (i, *v)));
    chart.draw_series(bars).map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l4::report::tests::{figures, run};
    use crate::load::Outcome;

    #[test]
    fn every_measured_path_is_a_bar_in_each_panel() {
        let run = run(Outcome::Done(figures(4.0, 9_000, 2)));
        assert!(drawn(&run));
        let paths: Vec<Path> = measured(&run).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                Path::Userspace,
                Path::Haproxy,
                Path::HaproxySplice,
                Path::Iptables,
                Path::Direct
            ]
        );
        let svg = svg(&run).unwrap().unwrap();
        for text in [
            "New connections per second",
            "Throughput, 1 stream",
            "Throughput, 8 streams",
            "connections/s",
            "Gbit/s",
            "(a) kube-proxy-rs userspace",
            "(b) HAProxy mode tcp, splice-auto",
            "(d) direct to the pod",
        ] {
            assert!(svg.contains(text), "{text} missing: {svg}");
        }
        // Five bars in each of three panels, as filled rectangles beside the white canvas.
        let filled = svg.matches("<rect").count();
        assert!(filled >= 15, "{filled} rectangles: {svg}");
    }

    #[test]
    fn a_run_without_figures_draws_nothing() {
        let mut run = run(Outcome::Failed("no".into()));
        run.rows.retain(|row| row.path == Path::Userspace);
        assert!(!drawn(&run));
        assert!(svg(&run).is_none());
    }
}

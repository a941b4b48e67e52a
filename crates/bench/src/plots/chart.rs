//! What every plot shares: the SVG text a drawing ends as, the colours, axis ranges, and a
//! labelled line.

use std::fmt::Display;
use std::ops::Range;

use plotters::coord::Shift;
use plotters::prelude::*;

pub type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
pub type Chart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

/// Runs `draw` on a white canvas of `size` pixels and returns the SVG it wrote.
pub fn svg(size: (u32, u32), draw: impl FnOnce(&Area<'_>) -> Result<(), String>) -> Result<String, String> {
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, size).into_drawing_area();
        root.fill(&WHITE).map_err(failed)?;
        draw(&root)?;
        root.present().map_err(failed)?;
    }
    Ok(text)
}

/// A plotters error as the report's errors read.
pub fn failed(e: impl Display) -> String {
    format!("plot: {e}")
}

/// The `index`th series' colour.
pub fn color(index: usize) -> RGBAColor {
    Palette99::pick(index).to_rgba()
}

/// `#RRGGBB`, as the SVG writes a colour.
#[cfg(test)]
pub trait Hex {
    fn to_hex(&self) -> String;
}

#[cfg(test)]
impl Hex for RGBAColor {
    fn to_hex(&self) -> String {
        let (r, g, b) = self.rgb();
        format!("#{r:02X}{g:02X}{b:02X}")
    }
}

/// A log axis around the positive `values` (a factor 1.5 of room each side; one value or
/// none still gives a valid range).
pub fn log_range(values: impl IntoIterator<Item = f64>) -> Range<f64> {
    let (low, high) = values
        .into_iter()
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0.0_f64), |(low, high), v| {
            (low.min(v), high.max(v))
        });
    if high == 0.0 {
        return 0.1..10.0;
    }
    low / 1.5..high * 1.5
}

/// A linear axis from 0 to a tenth above the largest of `values` (1 when all are 0).
pub fn zero_to(values: impl IntoIterator<Item = f64>) -> Range<f64> {
    let high = values.into_iter().filter(|v| v.is_finite()).fold(0.0, f64::max);
    0.0..if high > 0.0 { high * 1.1 } else { 1.0 }
}

/// A number as an axis label: `0.5`, `10`, `1000`.
pub fn number(v: &f64) -> String {
    let rounded = (v * 1000.0).round() / 1000.0;
    format!("{rounded}")
}

/// A titled chart in `area` with room for its axis labels.
pub fn builder<'a, 'b>(area: &'a Area<'b>, title: &str) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60);
    builder
}

/// One line with its points marked, in the `index`th colour, named in the legend.
pub fn line<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    points: Vec<(f64, f64)>,
    label: &str,
    index: usize,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let color = color(index);
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)).point_size(3))
        .map_err(failed)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    Ok(())
}

/// The legend, boxed, where it hides the least.
pub fn legend<'a, 'b: 'a, X, Y>(
    chart: &mut Chart<'a, 'b, X, Y>,
    position: SeriesLabelPosition,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_leave_room_and_never_collapse() {
        assert_eq!(log_range([10.0, 1000.0]), 10.0 / 1.5..1500.0);
        assert_eq!(log_range([0.0, f64::INFINITY]), 0.1..10.0);
        assert_eq!(zero_to([2.0, 10.0]), 0.0..10.0 * 1.1);
        assert_eq!(zero_to([]), 0.0..1.0);
        assert_eq!(number(&1000.0), "1000");
        assert_eq!(number(&0.0012), "0.001");
    }
}

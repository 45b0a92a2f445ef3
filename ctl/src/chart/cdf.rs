//! Empirical CDFs: one step curve per series, on a linear or log10 x axis.

use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use super::page::{self, Area, Mark, mesh_style, series_color, tick_label};
use super::{PlotError, Series, finite, labels, padded, range};

/// Extra room beyond the data, as a fraction of the axis.
const PAD: f64 = 0.03;

/// Empirical CDF of each series' values (x = value, y = fraction <= x, 0..1), one colored line
/// per series, legend, title, axis labels, grid. `log_x` uses a log10 x axis (values <= 0 are
/// skipped there).
pub fn cdf_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    series: &[Series],
    log_x: bool,
) -> Result<(), PlotError> {
    let curves: Vec<Vec<f64>> = series
        .iter()
        .map(|s| {
            let mut v: Vec<f64> = finite(&s.values).filter(|&v| !log_x || v > 0.0).collect();
            v.sort_by(f64::total_cmp);
            v
        })
        .collect();
    let (lo, hi) = range(curves.iter().flatten().copied()).ok_or_else(|| {
        let what = if log_x { "positive finite" } else { "finite" };
        PlotError::Empty(format!("{title}: no {what} values"))
    })?;
    page::render(path, title, &labels(series), Mark::Line, |area| {
        if log_x {
            // Pad by a ratio: the same share of the axis at both ends.
            let ratio = if hi > lo { (hi / lo).powf(PAD) } else { 2.0 };
            draw(area, (lo / ratio..hi * ratio).log_scale(), x_label, &curves)
        } else {
            draw(area, padded(lo, hi, PAD), x_label, &curves)
        }
    })
}

/// Draws the axes and the step curves with the x axis `x`.
fn draw<X>(area: &Area<'_>, x: X, x_label: &str, curves: &[Vec<f64>]) -> Result<(), PlotError>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .x_label_area_size(48)
        .y_label_area_size(58)
        .build_cartesian_2d(x, -PAD..1.0 + PAD)?;
    mesh_style(&mut chart.configure_mesh(), x_label, "fraction <= x")
        .x_label_formatter(&tick_label)
        .draw()?;
    let (x_lo, x_hi) = {
        let r = chart.x_range();
        (r.start, r.end)
    };
    for (i, values) in curves.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
        let n = values.len() as f64;
        let mut points = vec![(x_lo, 0.0)];
        for (j, &v) in values.iter().enumerate() {
            // Only the last of equal values makes a step (to the fraction <= v).
            if values.get(j + 1) != Some(&v) {
                points.push((v, points[points.len() - 1].1));
                points.push((v, (j + 1) as f64 / n));
            }
        }
        points.push((x_hi, 1.0));
        chart.draw_series(LineSeries::new(points, series_color(i).stroke_width(2)))?;
    }
    Ok(())
}

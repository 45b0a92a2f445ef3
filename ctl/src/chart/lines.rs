//! Lines over a shared integer x (learning rounds), with markers and gaps at missing values.

use std::path::Path;

use plotters::prelude::*;

use super::page::{self, Area, FixedTicks, Mark, mesh_style, series_color};
use super::{PlotError, Series, finite, labels, padded, range};

/// Extra room beyond the data, as a fraction of the axis.
const PAD: f64 = 0.03;
/// The most x ticks; the step between them is 1, 2 or 5 times a power of ten.
const MAX_X_TICKS: usize = 12;

/// Lines over a shared x (e.g. learning rounds): each series' `values[i]` plotted at x = i, with
/// markers. A non-finite value leaves a gap in its line.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    let (lo, hi) = range(series.iter().flat_map(|s| finite(&s.values)))
        .ok_or_else(|| PlotError::Empty(format!("{title}: no finite values")))?;
    let last = series.iter().map(|s| s.values.len()).max().unwrap_or(1) - 1;
    page::render(path, title, &labels(series), Mark::Line, |area| {
        draw(area, last, padded(lo, hi, PAD), x_label, y_label, series)
    })
}

fn draw(
    area: &Area<'_>,
    last: usize,
    y: std::ops::Range<f64>,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    let step = tick_step(last);
    let ticks: Vec<f64> = (0..=last).step_by(step).map(|i| i as f64).collect();
    let x = padded(0.0, last as f64, PAD);
    let mut chart = ChartBuilder::on(area)
        .x_label_area_size(48)
        .y_label_area_size(58)
        .build_cartesian_2d(FixedTicks::new(x, ticks), y)?;
    mesh_style(&mut chart.configure_mesh(), x_label, y_label)
        .x_label_formatter(&|v| format!("{}", v.round()))
        .draw()?;
    let plot_w = f64::from(chart.plotting_area().dim_in_pixel().0);
    let spacing = plot_w / (last as f64 + 1.0);
    let radius = (spacing / 3.0).min(3.5);
    for (s, one) in series.iter().enumerate() {
        let color = series_color(s);
        for run in runs_of_finite(&one.values) {
            let line = run.map(|i| (i as f64, one.values[i]));
            chart.draw_series(LineSeries::new(line, color.stroke_width(2)))?;
        }
        if radius >= 1.5 {
            let points = one.values.iter().enumerate().filter(|(_, v)| v.is_finite());
            chart.draw_series(points.map(|(i, &v)| {
                EmptyElement::at((i as f64, v))
                    + Circle::new((0, 0), (radius + 1.5) as i32, WHITE.filled())
                    + Circle::new((0, 0), radius as i32, color.filled())
            }))?;
        }
    }
    Ok(())
}

/// The step between x ticks over `0..=last`: 1, 2 or 5 times a power of ten, with at most
/// [`MAX_X_TICKS`] ticks.
fn tick_step(last: usize) -> usize {
    let mut step = 1;
    loop {
        for m in [1, 2, 5] {
            if last / (step * m) < MAX_X_TICKS {
                return step * m;
            }
        }
        step *= 10;
    }
}

/// Index ranges of consecutive finite values.
fn runs_of_finite(values: &[f64]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, v) in values.iter().enumerate() {
        match (v.is_finite(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    runs.extend(start.map(|s| s..values.len()));
    runs
}

#[cfg(test)]
mod tests {
    use super::{runs_of_finite, tick_step};

    #[test]
    fn x_ticks_step_by_one_two_or_five() {
        assert_eq!(tick_step(0), 1);
        assert_eq!(tick_step(11), 1);
        assert_eq!(tick_step(12), 2);
        assert_eq!(tick_step(39), 5);
        assert_eq!(tick_step(119), 10);
        assert_eq!(tick_step(1000), 100);
    }

    #[test]
    fn runs_split_at_non_finite_values() {
        let v = [1.0, f64::NAN, 2.0, 3.0, f64::INFINITY];
        assert_eq!(runs_of_finite(&v), vec![0..1, 2..4]);
    }
}

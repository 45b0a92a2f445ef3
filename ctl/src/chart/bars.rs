//! Grouped bars: one group per category, one bar per series, values written above the bars.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::page::{
    self, Area, FixedTicks, Mark, TICK_SIZE, fit_text, mesh_style, series_color, text,
};
use super::{PlotError, Series, finite, labels, range};

/// Headroom above the tallest bar (and below the lowest negative one) for the value labels, as
/// a fraction of the value span.
const HEADROOM: f64 = 0.08;
/// Share of a category's width the bars take together.
const GROUP_FILL: f64 = 0.8;

/// Grouped bars: for each category (x), one bar per series (value = `series.values[i]`, 0..=1
/// when `unit_interval`), legend, title, y label, value labels above bars when there is room.
/// A series shorter than `categories` has no bar in the categories past its end.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[Series],
    unit_interval: bool,
) -> Result<(), PlotError> {
    let cells = series.iter().flat_map(|s| {
        finite(
            s.values
                .get(..categories.len().min(s.values.len()))
                .unwrap_or(&[]),
        )
    });
    let (lo, hi) = range(cells)
        .ok_or_else(|| PlotError::Empty(format!("{title}: no finite values in any category")))?;
    let (lo, hi) = if unit_interval {
        (0.0, 1.0)
    } else {
        (lo.min(0.0), hi.max(0.0))
    };
    let span = if hi > lo { hi - lo } else { 1.0 };
    let y = if lo < 0.0 { lo - span * HEADROOM } else { lo }..hi + span * HEADROOM;
    page::render(path, title, &labels(series), Mark::Bar, |area| {
        draw(area, y, y_label, categories, series, unit_interval)
    })
}

fn draw(
    area: &Area<'_>,
    y: std::ops::Range<f64>,
    y_label: &str,
    categories: &[String],
    series: &[Series],
    unit_interval: bool,
) -> Result<(), PlotError> {
    let n = categories.len();
    let centers: Vec<f64> = (0..n).map(|c| c as f64 + 0.5).collect();
    let mut chart = ChartBuilder::on(area)
        .x_label_area_size(36)
        .y_label_area_size(58)
        .build_cartesian_2d(FixedTicks::new(0.0..n as f64, centers), y)?;
    let plot_w = chart.plotting_area().dim_in_pixel().0;
    let group_px = plot_w / n as u32;
    let tick_style = text(TICK_SIZE);
    let names: Vec<String> = categories
        .iter()
        .map(|c| fit_text(area, c, &tick_style, group_px.saturating_sub(4)))
        .collect();
    let category_label = |v: &f64| {
        let c = v.floor() as usize;
        names.get(c).cloned().unwrap_or_default()
    };
    mesh_style(&mut chart.configure_mesh(), "", y_label)
        .disable_x_mesh()
        .x_label_formatter(&category_label)
        .draw()?;
    let bar_w = GROUP_FILL / series.len() as f64;
    let bar_px = (f64::from(group_px) * bar_w) as u32;
    for (s, one) in series.iter().enumerate() {
        let color = series_color(s);
        for (c, &v) in one.values.iter().enumerate().take(n) {
            if !v.is_finite() {
                continue;
            }
            let shown = if unit_interval { v.clamp(0.0, 1.0) } else { v };
            let x0 = c as f64 + (1.0 - GROUP_FILL) / 2.0 + s as f64 * bar_w;
            // A one-pixel gap between neighbouring bars when they are wide enough to spare it.
            let gap = if bar_px >= 6 {
                bar_w / f64::from(bar_px)
            } else {
                0.0
            };
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x0 + bar_w - gap, shown)],
                color.filled(),
            )))?;
            let label = if unit_interval {
                format!("{v:.2}")
            } else {
                page::value_label(v)
            };
            let (label_w, _) = area.estimate_text_size(&label, &tick_style)?;
            if label_w <= bar_px + 1 {
                let (anchor, dy) = if shown >= 0.0 {
                    (VPos::Bottom, -3)
                } else {
                    (VPos::Top, 3)
                };
                let style = tick_style.pos(Pos::new(HPos::Center, anchor));
                chart.draw_series(std::iter::once(
                    EmptyElement::at((x0 + (bar_w - gap) / 2.0, shown))
                        + Text::new(label, (0, dy), style),
                ))?;
            }
        }
    }
    if chart.y_range().start < 0.0 {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 0.0), (n as f64, 0.0)],
            BLACK,
        )))?;
    }
    Ok(())
}

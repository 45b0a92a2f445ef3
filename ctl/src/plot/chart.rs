//! The three chart kinds: empirical CDFs, grouped bars, and lines over a shared x.

use std::path::Path;

use super::axes::{Axis, INK};
use super::font;
use super::page::{Mark, Page, label_height, label_width, series_color};
use super::ticks::value_label;
use super::{PlotError, Series};

/// Thickness of data lines in pixels.
const LINE_WIDTH: f64 = 2.0;
/// Extra room beyond the outer ticks, as a fraction of the axis, so data at the ends does not
/// sit on the frame.
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
    let mut page = Page::new(title, &labels(series), Mark::Line);
    let (frame, y) = page.plot_area(x_label, "fraction <= x", |h| {
        Axis::linear(0.0, 1.0, h, PAD, label_height)
    });
    let width = frame.right - frame.left;
    let x = if log_x {
        Axis::log(lo, hi, width, label_width)
    } else {
        Axis::linear(lo, hi, width, PAD, label_width)
    };
    let canvas = &mut page.canvas;
    frame.draw_grid(canvas, Some(&x), &y);
    for (i, values) in curves.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
        let mut points = vec![(frame.left, frame.y(&y, 0.0))];
        let n = values.len() as f64;
        for (j, &v) in values.iter().enumerate() {
            // Only the last of equal values makes a step (to the fraction <= v).
            if values.get(j + 1) != Some(&v) {
                let px = frame.x(&x, v);
                points.push((px, points[points.len() - 1].1));
                points.push((px, frame.y(&y, (j + 1) as f64 / n)));
            }
        }
        points.push((frame.right, frame.y(&y, 1.0)));
        canvas.polyline(&points, LINE_WIDTH, series_color(i));
    }
    frame.draw_axes(canvas, Some(&x), &y);
    page.finish(path)
}

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
    let cells = || {
        series.iter().flat_map(|s| {
            finite(
                s.values
                    .get(..categories.len().min(s.values.len()))
                    .unwrap_or(&[]),
            )
        })
    };
    let (lo, hi) = range(cells())
        .ok_or_else(|| PlotError::Empty(format!("{title}: no finite values in any category")))?;
    let (lo, hi) = if unit_interval {
        (0.0, 1.0)
    } else {
        (lo.min(0.0), hi.max(0.0))
    };
    let mut page = Page::new(title, &labels(series), Mark::Bar);
    let (frame, y) = page.plot_area("", y_label, |h| {
        let mut y = Axis::linear(lo, hi, h, 0.0, label_height);
        // Headroom for the value labels; bars grow from zero, so only a negative end is padded.
        let span = y.hi - y.lo;
        y.hi += span * 0.08;
        if y.lo < 0.0 {
            y.lo -= span * 0.08;
        }
        y
    });
    let canvas = &mut page.canvas;
    frame.draw_grid(canvas, None, &y);
    let group_w = (frame.right - frame.left) / categories.len() as f64;
    let bar_w = group_w * 0.8 / series.len() as f64;
    let zero = frame.y(&y, 0.0);
    for (c, category) in categories.iter().enumerate() {
        let group_left = frame.left + c as f64 * group_w;
        for (s, one) in series.iter().enumerate() {
            let Some(&v) = one.values.get(c).filter(|v| v.is_finite()) else {
                continue;
            };
            let shown = if unit_interval { v.clamp(0.0, 1.0) } else { v };
            let x0 = (group_left + group_w * 0.1 + s as f64 * bar_w).round();
            let x1 = (group_left + group_w * 0.1 + (s + 1) as f64 * bar_w).round();
            let gap = if x1 - x0 >= 6.0 { 1.0 } else { 0.0 };
            let top = frame.y(&y, shown).min(zero).round();
            let bottom = frame.y(&y, shown).max(zero).round();
            let (bx, bw) = (x0 as i64, (x1 - x0 - gap).max(1.0) as i64);
            canvas.fill_rect(
                bx,
                top as i64,
                bw,
                (bottom - top).max(1.0) as i64,
                series_color(s),
            );
            let text = if unit_interval {
                format!("{v:.2}")
            } else {
                value_label(v)
            };
            let text_w = i64::from(font::text_width(&text, 1));
            let above = v >= 0.0;
            let text_y = if above {
                top as i64 - 11
            } else {
                bottom as i64 + 4
            };
            let fits =
                text_w <= bw + 1 && text_y >= frame.top as i64 && text_y + 9 < frame.bottom as i64;
            if fits {
                font::draw_text(canvas, bx + (bw - text_w) / 2, text_y, &text, 1, INK);
            }
        }
        let label = fit_text(category, (group_w - 4.0).max(0.0) as u32);
        let text_w = f64::from(font::text_width(&label, 1));
        let text_x = (group_left + (group_w - text_w) / 2.0) as i64;
        font::draw_text(canvas, text_x, frame.bottom as i64 + 7, &label, 1, INK);
    }
    if y.lo < 0.0 {
        canvas.fill_rect(
            frame.left as i64,
            zero as i64,
            (frame.right - frame.left) as i64,
            1,
            INK,
        );
    }
    frame.draw_axes(canvas, None, &y);
    page.finish(path)
}

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
    let last_x = series
        .iter()
        .map(|s| s.values.len())
        .max()
        .unwrap_or(1)
        .saturating_sub(1);
    let mut page = Page::new(title, &labels(series), Mark::Line);
    let (frame, y) = page.plot_area(x_label, y_label, |h| {
        Axis::linear(lo, hi, h, PAD, label_height)
    });
    let x = integer_axis(last_x as f64, frame.right - frame.left);
    let canvas = &mut page.canvas;
    frame.draw_grid(canvas, Some(&x), &y);
    let spacing = (frame.x(&x, 1.0) - frame.x(&x, 0.0)).abs();
    let radius = (spacing / 3.0).min(3.5);
    for (s, one) in series.iter().enumerate() {
        let color = series_color(s);
        let points = |i: usize, v: f64| (frame.x(&x, i as f64), frame.y(&y, v));
        for run in runs_of_finite(&one.values) {
            let line: Vec<(f64, f64)> = run.clone().map(|i| points(i, one.values[i])).collect();
            canvas.polyline(&line, LINE_WIDTH, color);
        }
        if radius >= 1.5 {
            for (i, &v) in one.values.iter().enumerate().filter(|(_, v)| v.is_finite()) {
                let (px, py) = points(i, v);
                canvas.disc(px, py, radius + 1.5, [255, 255, 255]);
                canvas.disc(px, py, radius, color);
            }
        }
    }
    frame.draw_axes(canvas, Some(&x), &y);
    page.finish(path)
}

/// An x axis over `0..=last` with ticks on whole numbers only.
fn integer_axis(last: f64, pixels: f64) -> Axis {
    let mut x = Axis::linear(0.0, last, pixels, PAD, label_width);
    if x.ticks.len() > 1 && x.ticks[1] - x.ticks[0] < 1.0 {
        x.ticks = (x.ticks[0].ceil() as i64..=x.ticks[x.ticks.len() - 1].floor() as i64)
            .map(|i| i as f64)
            .collect();
        x.labels = x.ticks.iter().map(|t| format!("{t}")).collect();
    }
    x
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

fn finite(values: &[f64]) -> impl Iterator<Item = f64> + '_ {
    values.iter().copied().filter(|v| v.is_finite())
}

/// Smallest and largest value; `None` when there are none.
fn range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

fn labels(series: &[Series]) -> Vec<&str> {
    series.iter().map(|s| s.label.as_str()).collect()
}

/// `text`, cut short with ".." when wider than `max_w` pixels.
fn fit_text(text: &str, max_w: u32) -> String {
    if font::text_width(text, 1) <= max_w {
        return text.to_string();
    }
    let keep = (max_w / font::ADVANCE).saturating_sub(2) as usize;
    let cut: String = text.chars().take(keep).collect();
    format!("{cut}..")
}

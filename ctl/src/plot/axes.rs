//! Axes: the visible range and ticks of each axis, the mapping from data to pixels, and
//! drawing the grid, frame and tick labels.

use super::canvas::{Canvas, Rgb};
use super::font::{self, CAP_HEIGHT};
use super::ticks::{linear_labels, linear_ticks, log_label, log_ticks, nice_step, pow10};

/// Grid lines at major ticks.
const GRID: Rgb = [226, 226, 226];
/// Grid lines between decades on a log axis.
const MINOR_GRID: Rgb = [243, 243, 243];
/// The plot frame and tick marks.
pub(crate) const FRAME: Rgb = [90, 90, 90];
/// Text.
pub(crate) const INK: Rgb = [30, 30, 30];
/// Pixels between a tick label and the frame.
pub(crate) const LABEL_GAP: u32 = 6;
/// Smallest gap in pixels between neighbouring tick labels.
const MIN_LABEL_SPACING: f64 = 14.0;

/// The visible data range of one axis, with its ticks and their labels.
#[derive(Debug, Clone)]
pub(crate) struct Axis {
    /// Data value at the start (left or bottom) of the plot area.
    pub(crate) lo: f64,
    /// Data value at the end (right or top).
    pub(crate) hi: f64,
    /// Log10 scale (`lo`, `hi` and all ticks > 0).
    pub(crate) log: bool,
    /// Labelled tick positions, with a grid line each.
    pub(crate) ticks: Vec<f64>,
    /// Labels, one per tick.
    pub(crate) labels: Vec<String>,
    /// Fainter grid lines without labels.
    pub(crate) minor: Vec<f64>,
}

impl Axis {
    /// A linear axis over the data range `lo..=hi` spanning `pixels`, with as many ticks as fit
    /// (labels at least `label_size(label)` + a gap apart). The range widens to the outer ticks,
    /// then by `pad` (a fraction of it) on each side; an empty range widens around its value.
    pub(crate) fn linear(
        lo: f64,
        hi: f64,
        pixels: f64,
        pad: f64,
        label_size: impl Fn(&str) -> f64,
    ) -> Self {
        let (lo, hi) = widen_if_empty(lo, hi);
        let mut chosen = None;
        for max_ticks in (1..=10).rev() {
            let ticks = linear_ticks(lo, hi, max_ticks);
            let step = nice_step(hi - lo, max_ticks);
            let labels = linear_labels(&ticks, step);
            let spacing = pixels / (ticks.len().max(2) - 1) as f64;
            let widest = labels.iter().map(|l| label_size(l)).fold(0.0, f64::max);
            let fits = widest + MIN_LABEL_SPACING <= spacing;
            chosen = Some((ticks, labels));
            if fits {
                break;
            }
        }
        let (ticks, labels) = chosen.expect("at least one tick count is tried");
        let (t0, t1) = (ticks[0], ticks[ticks.len() - 1]);
        let margin = (t1 - t0) * pad;
        Self {
            lo: t0 - margin,
            hi: t1 + margin,
            log: false,
            ticks,
            labels,
            minor: Vec::new(),
        }
    }

    /// A log10 axis over `lo..=hi` (both > 0) spanning `pixels`, widened to whole decades.
    pub(crate) fn log(lo: f64, hi: f64, pixels: f64, label_size: impl Fn(&str) -> f64) -> Self {
        let (lo, hi) = if lo == hi {
            (lo / 2.0, hi * 2.0)
        } else {
            (lo, hi)
        };
        let mut chosen = None;
        for max_ticks in (1..=12).rev() {
            let ticks = log_ticks(lo, hi, max_ticks);
            let labels: Vec<String> = ticks.iter().map(|&t| log_label(t)).collect();
            let widest = labels.iter().map(|l| label_size(l)).fold(0.0, f64::max);
            let fits = ticks
                .windows(2)
                .all(|w| (w[1] / w[0]).log10() / (hi / lo).log10() * pixels > widest + 6.0);
            chosen = Some((ticks, labels));
            if fits {
                break;
            }
        }
        let (ticks, labels) = chosen.expect("at least one tick count is tried");
        let (t0, t1) = (ticks[0], ticks[ticks.len() - 1]);
        let minor = (t0.log10().round() as i32..t1.log10().round() as i32)
            .flat_map(|e| (2..=9).map(move |m| f64::from(m) * pow10(e)))
            .filter(|v| !ticks.iter().any(|t| (t / v - 1.0).abs() < 1e-9))
            .collect();
        Self {
            lo: t0,
            hi: t1,
            log: true,
            ticks,
            labels,
            minor,
        }
    }

    /// Where `v` falls along the axis: 0 at `lo`, 1 at `hi`.
    pub(crate) fn fraction(&self, v: f64) -> f64 {
        if self.log {
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }
}

/// An empty range (one value) gets some width around its value so the axis can be drawn.
fn widen_if_empty(lo: f64, hi: f64) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else {
        let half = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        (lo - half, lo + half)
    }
}

/// The plot area in pixels: data lies within `left..right` x `top..bottom`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame {
    /// Left edge.
    pub(crate) left: f64,
    /// Top edge.
    pub(crate) top: f64,
    /// Right edge.
    pub(crate) right: f64,
    /// Bottom edge.
    pub(crate) bottom: f64,
}

impl Frame {
    /// Pixel x of data value `v` on `axis`.
    pub(crate) fn x(&self, axis: &Axis, v: f64) -> f64 {
        self.left + axis.fraction(v) * (self.right - self.left)
    }

    /// Pixel y of data value `v` on `axis` (up is larger).
    pub(crate) fn y(&self, axis: &Axis, v: f64) -> f64 {
        self.bottom - axis.fraction(v) * (self.bottom - self.top)
    }

    /// Grid lines for the ticks of `x` (when given) and `y`; drawn before the data.
    pub(crate) fn draw_grid(&self, canvas: &mut Canvas, x: Option<&Axis>, y: &Axis) {
        let (left, top) = (self.left as i64, self.top as i64);
        let (width, height) = (
            (self.right - self.left) as i64,
            (self.bottom - self.top) as i64,
        );
        for (values, color) in [(&y.minor, MINOR_GRID), (&y.ticks, GRID)] {
            for &v in values {
                canvas.fill_rect(left, self.y(y, v).floor() as i64, width, 1, color);
            }
        }
        if let Some(x) = x {
            for (values, color) in [(&x.minor, MINOR_GRID), (&x.ticks, GRID)] {
                for &v in values {
                    canvas.fill_rect(self.x(x, v).floor() as i64, top, 1, height, color);
                }
            }
        }
    }

    /// The frame, tick marks and tick labels of `x` (when given) and `y`; drawn after the data.
    pub(crate) fn draw_axes(&self, canvas: &mut Canvas, x: Option<&Axis>, y: &Axis) {
        let (left, top, right, bottom) = (
            self.left as i64,
            self.top as i64,
            self.right as i64,
            self.bottom as i64,
        );
        canvas.stroke_rect(left, top, right - left + 1, bottom - top + 1, FRAME);
        for (&v, label) in y.ticks.iter().zip(&y.labels) {
            let py = self.y(y, v).floor() as i64;
            canvas.fill_rect(left - 4, py, 4, 1, FRAME);
            let w = i64::from(font::text_width(label, 1));
            let text_top = py - i64::from(CAP_HEIGHT) / 2;
            font::draw_text(
                canvas,
                left - 4 - i64::from(LABEL_GAP) / 2 - w,
                text_top,
                label,
                1,
                INK,
            );
        }
        if let Some(x) = x {
            for (&v, label) in x.ticks.iter().zip(&x.labels) {
                let px = self.x(x, v).floor() as i64;
                canvas.fill_rect(px, bottom + 1, 1, 4, FRAME);
                let w = i64::from(font::text_width(label, 1));
                let text_top = bottom + 1 + i64::from(LABEL_GAP);
                font::draw_text(canvas, px - w / 2, text_top, label, 1, INK);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(label: &str) -> f64 {
        f64::from(font::text_width(label, 1))
    }

    #[test]
    fn axis_covers_data_and_degenerate_ranges_get_width() {
        let axis = Axis::linear(3.0, 97.0, 600.0, 0.0, chars);
        assert!(axis.lo <= 3.0 && axis.hi >= 97.0);
        assert_eq!(axis.labels.first().map(String::as_str), Some("0"));
        let single = Axis::linear(5.0, 5.0, 600.0, 0.0, chars);
        assert!(single.lo < 5.0 && single.hi > 5.0);
        let zero = Axis::linear(0.0, 0.0, 600.0, 0.0, chars);
        assert!(zero.lo < 0.0 && zero.hi > 0.0);
        let log = Axis::log(7.0, 7.0, 600.0, chars);
        assert!(log.lo < 7.0 && log.hi > 7.0 && log.fraction(7.0).is_finite());
    }

    #[test]
    fn narrow_axes_get_fewer_ticks() {
        let wide = Axis::linear(0.0, 1000.0, 800.0, 0.0, chars);
        let narrow = Axis::linear(0.0, 1000.0, 120.0, 0.0, chars);
        assert!(narrow.ticks.len() < wide.ticks.len());
        assert!(narrow.ticks.len() >= 2);
    }
}

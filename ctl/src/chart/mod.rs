//! PNG charts for replay and learning reports: latency CDFs, grouped bars, lines over rounds.
//!
//! `plotters` draws every chart into an RGB buffer (its bitmap backend) and `png` encodes it.
//! Text is set in DejaVu Sans, shipped in `ctl/assets/fonts` and embedded in the binary, so
//! charts need no system fonts and come out the same on every machine. Every chart is
//! [`WIDTH`] x [`HEIGHT`] pixels on white, with the title and a legend above the plot; series
//! take colors from a fixed palette of ten in order (then repeat), and NaN or infinite values
//! are left out.

mod bars;
mod cdf;
mod lines;
mod page;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use bars::bar_chart;
pub use cdf::cdf_chart;
pub use lines::line_chart;

/// Width of every chart in pixels.
pub const WIDTH: u32 = 900;
/// Height of every chart in pixels.
pub const HEIGHT: u32 = 560;

/// One named sequence of values: a line, a CDF curve, or one bar per category.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    /// Shown in the legend.
    pub label: String,
    /// The data; NaN and infinite values are skipped.
    pub values: Vec<f64>,
}

impl Series {
    /// A series named `label` holding `values`.
    pub fn new(label: impl Into<String>, values: Vec<f64>) -> Self {
        Self {
            label: label.into(),
            values,
        }
    }
}

/// Why a chart was not written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The PNG file (or its directory) could not be written.
    #[error("writing chart {}: {source}", path.display())]
    Io {
        /// The chart's path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The PNG encoder refused the image.
    #[error("encoding PNG: {0}")]
    Encode(String),
    /// plotters failed to draw into the image buffer.
    #[error("drawing chart: {0}")]
    Draw(String),
    /// There is nothing to draw (no series, no categories, or no finite values).
    #[error("nothing to plot: {0}")]
    Empty(String),
}

impl<E: std::error::Error + Send + Sync> From<plotters::drawing::DrawingAreaErrorKind<E>>
    for PlotError
{
    fn from(e: plotters::drawing::DrawingAreaErrorKind<E>) -> Self {
        Self::Draw(e.to_string())
    }
}

/// The finite values of `values`.
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

/// `lo..hi` widened by `pad` of its span on both sides, or around the value when all values
/// are equal, so data at the ends does not sit on the frame.
fn padded(lo: f64, hi: f64, pad: f64) -> std::ops::Range<f64> {
    let span = hi - lo;
    if span <= f64::EPSILON * lo.abs().max(1.0) {
        let d = (lo.abs() * 0.1).max(1.0);
        return lo - d..hi + d;
    }
    lo - span * pad..hi + span * pad
}

/// The legend labels of `series`.
fn labels(series: &[Series]) -> Vec<&str> {
    series.iter().map(|s| s.label.as_str()).collect()
}

//! PNG charts for replay and learning reports: latency CDFs, grouped bars, lines over rounds.
//!
//! Charts are rasterized here into an RGB buffer with an embedded bitmap font and encoded with
//! the `png` crate, so they need no system fonts or font files and come out byte-for-byte the
//! same on every machine. Every chart is [`WIDTH`] x [`HEIGHT`] pixels on white, series take
//! colors from a fixed palette of eight in order (then repeat), and NaN or infinite values are
//! left out.

mod axes;
mod canvas;
mod chart;
mod font;
mod page;
#[cfg(test)]
mod tests;
mod ticks;

use std::path::PathBuf;

pub use chart::{bar_chart, cdf_chart, line_chart};

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
    /// There is nothing to draw (no series, no categories, or no finite values).
    #[error("nothing to plot: {0}")]
    Empty(String),
}

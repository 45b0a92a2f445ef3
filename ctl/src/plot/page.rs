//! The parts of a chart around the data: background, title, legend, axis titles, and where the
//! plot area goes once the tick labels are known.

use std::path::Path;

use super::axes::{Axis, Frame, INK, LABEL_GAP};
use super::canvas::{Canvas, Rgb};
use super::font::{self, CAP_HEIGHT, LINE_HEIGHT};
use super::{HEIGHT, PlotError, WIDTH};

/// Series colors, in order (Tableau's palette, without its grey and olive): distinguishable
/// from each other and dark enough on white.
const PALETTE: [Rgb; 8] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [23, 190, 207],
];
const BACKGROUND: Rgb = [255, 255, 255];
/// Space kept clear at the image edges.
const MARGIN: u32 = 16;
/// Scale of the title font.
const TITLE_SCALE: u32 = 2;
/// Scale of axis titles and the legend.
pub(crate) const LABEL_SCALE: u32 = 1;
/// Length of a legend swatch.
const SWATCH: u32 = 18;

/// The color of the `i`th series.
pub(crate) fn series_color(i: usize) -> Rgb {
    PALETTE[i % PALETTE.len()]
}

/// How series look in the legend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// A short thick line.
    Line,
    /// A filled square.
    Bar,
}

/// Width of a tick label in pixels.
pub(crate) fn label_width(label: &str) -> f64 {
    f64::from(font::text_width(label, 1))
}

/// Height of a tick label in pixels (for spacing ticks on a vertical axis).
pub(crate) fn label_height(_label: &str) -> f64 {
    f64::from(LINE_HEIGHT)
}

/// A chart being drawn: the canvas, with title and legend done, and the space left below them.
#[derive(Debug)]
pub(crate) struct Page {
    /// The image.
    pub(crate) canvas: Canvas,
    /// The first free row under the title and legend.
    top: u32,
}

impl Page {
    /// A white page with `title` centred at the top and a legend of `labels` under it.
    pub(crate) fn new(title: &str, labels: &[&str], mark: Mark) -> Self {
        let mut canvas = Canvas::new(WIDTH, HEIGHT, BACKGROUND);
        let title_w = font::text_width(title, TITLE_SCALE);
        let title_x = (WIDTH.saturating_sub(title_w) / 2).max(MARGIN);
        font::draw_text(
            &mut canvas,
            title_x.into(),
            MARGIN.into(),
            title,
            TITLE_SCALE,
            INK,
        );
        let mut top = MARGIN + CAP_HEIGHT * TITLE_SCALE + 14;
        top = draw_legend(&mut canvas, top, labels, mark);
        Self {
            canvas,
            top: top + 8,
        }
    }

    /// Lays out the plot area under the legend: room at the bottom for one row of x tick labels
    /// and `x_label`, the y axis from `make_y` (given the area's height in pixels), and room on
    /// the left for its tick labels and `y_label`. Draws both axis titles.
    pub(crate) fn plot_area(
        &mut self,
        x_label: &str,
        y_label: &str,
        make_y: impl FnOnce(f64) -> Axis,
    ) -> (Frame, Axis) {
        let label_h = CAP_HEIGHT * LABEL_SCALE;
        let x_title = if x_label.is_empty() { 0 } else { label_h + 12 };
        let y_title = if y_label.is_empty() { 0 } else { label_h + 12 };
        let bottom = HEIGHT - MARGIN - x_title - (1 + LABEL_GAP + LINE_HEIGHT);
        let top = self.top;
        let y = make_y(f64::from(bottom - top));
        let widest = y
            .labels
            .iter()
            .map(|l| font::text_width(l, 1))
            .max()
            .unwrap_or(0);
        let left = MARGIN + y_title + widest + 4 + LABEL_GAP;
        let right = WIDTH - MARGIN - 8;
        let frame = Frame {
            left: f64::from(left),
            top: f64::from(top),
            right: f64::from(right),
            bottom: f64::from(bottom),
        };
        let canvas = &mut self.canvas;
        let mid_x = i64::from((left + right) / 2);
        let x_w = i64::from(font::text_width(x_label, LABEL_SCALE));
        let x_top = i64::from(HEIGHT - MARGIN - label_h);
        font::draw_text(canvas, mid_x - x_w / 2, x_top, x_label, LABEL_SCALE, INK);
        let mid_y = i64::from((top + bottom) / 2);
        let y_w = i64::from(font::text_width(y_label, LABEL_SCALE));
        font::draw_text_up(
            canvas,
            MARGIN.into(),
            mid_y + y_w / 2,
            y_label,
            LABEL_SCALE,
            INK,
        );
        (frame, y)
    }

    /// Writes the chart to `path` as PNG.
    pub(crate) fn finish(self, path: &Path) -> Result<(), PlotError> {
        self.canvas.save_png(path)
    }
}

/// Draws legend entries in centred rows starting at `top`, wrapping at the page width; returns
/// the row under the legend.
fn draw_legend(canvas: &mut Canvas, top: u32, labels: &[&str], mark: Mark) -> u32 {
    let entry_w = |label: &str| SWATCH + 6 + font::text_width(label, LABEL_SCALE);
    let spacing = 20;
    let room = WIDTH - 2 * MARGIN;
    let row_h = LINE_HEIGHT * LABEL_SCALE + 4;
    let mut rows: Vec<Vec<usize>> = Vec::new();
    let mut used = 0;
    for (i, label) in labels.iter().enumerate() {
        let w = entry_w(label);
        match rows.last_mut() {
            Some(row) if used + spacing + w <= room => {
                row.push(i);
                used += spacing + w;
            }
            _ => {
                rows.push(vec![i]);
                used = w;
            }
        }
    }
    let mut y = top;
    for row in &rows {
        let total: u32 =
            row.iter().map(|&i| entry_w(labels[i])).sum::<u32>() + spacing * (row.len() as u32 - 1);
        let mut x = i64::from(WIDTH.saturating_sub(total) / 2);
        for &i in row {
            let color = series_color(i);
            let mid = f64::from(y) + f64::from(CAP_HEIGHT * LABEL_SCALE) / 2.0;
            match mark {
                Mark::Line => {
                    let (x0, x1) = (x as f64 + 1.0, (x + i64::from(SWATCH)) as f64 - 1.0);
                    canvas.polyline(&[(x0, mid), (x1, mid)], 3.0, color);
                }
                Mark::Bar => {
                    let side = i64::from(CAP_HEIGHT * LABEL_SCALE + 2);
                    let sq_x = x + i64::from(SWATCH) - side;
                    canvas.fill_rect(sq_x, mid as i64 - side / 2, side, side, color);
                }
            }
            let text_x = x + i64::from(SWATCH + 6);
            font::draw_text(canvas, text_x, y.into(), labels[i], LABEL_SCALE, INK);
            x += i64::from(entry_w(labels[i]) + spacing);
        }
        y += row_h;
    }
    y
}

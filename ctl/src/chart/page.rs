//! What every chart shares: the shipped font, the palette, the title and legend above the
//! plot, the text styles, and writing the finished buffer as a PNG file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::OnceLock;

use plotters::chart::MeshStyle;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};

use super::{HEIGHT, PlotError, WIDTH};

/// The family name the shipped font is registered under.
const FAMILY: &str = "sans-serif";
/// DejaVu Sans (Bitstream Vera licence, `ctl/assets/fonts/DejaVuSans-LICENSE`).
static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// Series colors, in order (Tableau's ten, grey and olive last): distinguishable from each
/// other and dark enough on white.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
];
/// Space kept clear at the image edges.
const MARGIN: i32 = 14;
/// Point sizes of the title, of legend entries and axis titles, and of tick and value labels.
const TITLE_SIZE: f64 = 22.0;
const LABEL_SIZE: f64 = 15.0;
pub(super) const TICK_SIZE: f64 = 13.0;
/// Length of a legend swatch, and the gap between legend entries.
const SWATCH: i32 = 22;
const ENTRY_GAP: i32 = 22;

/// The color of the `i`th series.
pub(crate) fn series_color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// A text style in the shipped font.
pub(super) fn text(size: f64) -> TextStyle<'static> {
    (FAMILY, size).into_font().color(&BLACK)
}

/// How series look in the legend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mark {
    /// A short thick line.
    Line,
    /// A filled square.
    Bar,
}

/// The drawing area a chart's plot goes into.
pub(super) type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Draws a chart onto a white page under `title` and a legend of `labels`, then writes it to
/// `path` as PNG. `plot` draws the data into the area below the legend.
pub(super) fn render(
    path: &Path,
    title: &str,
    labels: &[&str],
    mark: Mark,
    plot: impl FnOnce(&Area<'_>) -> Result<(), PlotError>,
) -> Result<(), PlotError> {
    register_shipped_font()?;
    let mut rgb = vec![255; WIDTH as usize * HEIGHT as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let header = header(&root, title, labels, mark)?;
        let (_, body) = root.split_vertically(header);
        plot(&body.margin(0, MARGIN, MARGIN, MARGIN))?;
        root.present()?;
    }
    save_png(path, &rgb)
}

/// Registers the shipped font once per process.
fn register_shipped_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(PlotError::Draw("the shipped font does not parse".into()))
    }
}

/// Draws the centred title and the legend entries in centred rows under it, wrapping at the
/// page width; returns the height they take.
fn header(root: &Area<'_>, title: &str, labels: &[&str], mark: Mark) -> Result<i32, PlotError> {
    let title_style = text(TITLE_SIZE).pos(Pos::new(HPos::Center, VPos::Top));
    root.draw(&Text::new(
        title,
        (WIDTH as i32 / 2, MARGIN),
        title_style.clone(),
    ))?;
    let title_h = root.estimate_text_size(title, &title_style)?.1 as i32;
    let label_style = text(LABEL_SIZE).pos(Pos::new(HPos::Left, VPos::Center));
    let mut widths = Vec::with_capacity(labels.len());
    for label in labels {
        widths.push(SWATCH + 6 + root.estimate_text_size(label, &label_style)?.0 as i32);
    }
    let room = WIDTH as i32 - 2 * MARGIN;
    let mut rows: Vec<Vec<usize>> = Vec::new();
    let mut used = 0;
    for (i, &w) in widths.iter().enumerate() {
        match rows.last_mut() {
            Some(row) if used + ENTRY_GAP + w <= room => {
                row.push(i);
                used += ENTRY_GAP + w;
            }
            _ => {
                rows.push(vec![i]);
                used = w;
            }
        }
    }
    let row_h = LABEL_SIZE as i32 + 6;
    let mut y = MARGIN + title_h + 10 + row_h / 2;
    for row in &rows {
        let total: i32 =
            row.iter().map(|&i| widths[i]).sum::<i32>() + ENTRY_GAP * (row.len() as i32 - 1);
        let mut x = (WIDTH as i32 - total) / 2;
        for &i in row {
            let color = series_color(i).filled();
            match mark {
                Mark::Line => {
                    root.draw(&Rectangle::new([(x, y - 1), (x + SWATCH, y + 2)], color))?
                }
                Mark::Bar => root.draw(&Rectangle::new(
                    [(x + SWATCH / 2 - 6, y - 6), (x + SWATCH / 2 + 6, y + 6)],
                    color,
                ))?,
            }
            root.draw(&Text::new(
                labels[i],
                (x + SWATCH + 6, y),
                label_style.clone(),
            ))?;
            x += widths[i] + ENTRY_GAP;
        }
        y += row_h;
    }
    Ok(y - row_h / 2 + 4)
}

/// Styles the mesh: grid, axes, tick labels in the shipped font, and the axis titles.
pub(super) fn mesh_style<'m, 'a, 'b, X, Y, DB>(
    mesh: &'m mut MeshStyle<'a, 'b, X, Y, DB>,
    x_label: &str,
    y_label: &str,
) -> &'m mut MeshStyle<'a, 'b, X, Y, DB>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    DB: DrawingBackend,
{
    mesh.x_desc(x_label)
        .y_desc(y_label)
        .label_style(text(TICK_SIZE))
        .axis_desc_style(text(LABEL_SIZE))
        .bold_line_style(RGBColor(205, 205, 205))
        .light_line_style(RGBColor(240, 240, 240))
        .max_light_lines(2)
        .axis_style(BLACK)
        .y_label_formatter(&tick_label)
}

/// [`value_label`] in the shape plotters' label formatters take.
pub(super) fn tick_label(v: &f64) -> String {
    value_label(*v)
}

/// A linear f64 axis with ticks (and grid lines) exactly at the given values: bar centres, or
/// whole learning rounds. Labels come from the mesh's `x_label_formatter`.
pub(super) struct FixedTicks {
    axis: RangedCoordf64,
    ticks: Vec<f64>,
}

impl FixedTicks {
    pub(super) fn new(range: std::ops::Range<f64>, ticks: Vec<f64>) -> Self {
        Self {
            axis: range.into(),
            ticks,
        }
    }
}

impl Ranged for FixedTicks {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.axis.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.axis.range()
    }
}

/// A tick or bar label: at most three significant decimals, scientific outside 1e-3..1e6.
pub(super) fn value_label(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        let e = a.log10().floor() as i32;
        let mantissa = trim_zeros(format!("{:.2}", v / 10f64.powi(e)));
        return format!("{mantissa}e{e}");
    }
    let decimals = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 0.01 || a == 0.0 {
        2
    } else {
        3
    };
    trim_zeros(format!("{v:.decimals$}"))
}

fn trim_zeros(s: String) -> String {
    if s.contains('.') {
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "-0" { "0".into() } else { s.into() }
    } else {
        s
    }
}

/// `text`, cut short with ".." when wider than `max_w` pixels in `style`.
pub(super) fn fit_text(area: &Area<'_>, text: &str, style: &TextStyle<'_>, max_w: u32) -> String {
    let width = |s: &str| {
        area.estimate_text_size(s, style)
            .map_or(u32::MAX, |(w, _)| w)
    };
    if width(text) <= max_w {
        return text.to_string();
    }
    let chars: Vec<char> = text.chars().collect();
    (0..chars.len())
        .rev()
        .map(|keep| format!("{}..", chars[..keep].iter().collect::<String>()))
        .find(|cut| width(cut) <= max_w)
        .unwrap_or_default()
}

/// Writes 8-bit RGB `rgb` (`WIDTH` x `HEIGHT`) to `path` as PNG, creating its directory.
fn save_png(path: &Path, rgb: &[u8]) -> Result<(), PlotError> {
    let io = |source| PlotError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut out = BufWriter::new(File::create(path).map_err(io)?);
    let mut encoder = png::Encoder::new(&mut out, WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let encoded = encoder
        .write_header()
        .and_then(|mut writer| {
            writer.write_image_data(rgb)?;
            writer.finish()
        })
        .map_err(|e| match e {
            png::EncodingError::IoError(source) => io(source),
            other => PlotError::Encode(other.to_string()),
        });
    encoded?;
    out.flush().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::value_label;

    #[test]
    fn value_labels_are_short() {
        let cases = [
            (0.0, "0"),
            (-0.0001, "-1e-4"),
            (0.005, "0.005"),
            (0.25, "0.25"),
            (12.34, "12.3"),
            (1500.0, "1500"),
            (2.5e6, "2.5e6"),
            (-40.0, "-40"),
        ];
        for (v, want) in cases {
            assert_eq!(value_label(v), want, "{v}");
        }
    }
}

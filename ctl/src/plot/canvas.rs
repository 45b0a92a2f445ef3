//! An RGB pixel buffer: filled rectangles, anti-aliased thick polylines and discs, and PNG
//! encoding.
//!
//! Coordinates are in pixels with pixel `(x, y)` covering the square `[x, x+1) x [y, y+1)`, so a
//! 1-pixel line at `y = 10.5` fills row 10 exactly. Anything outside the buffer is dropped.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::PlotError;

/// An 8-bit sRGB color.
pub(crate) type Rgb = [u8; 3];

/// A width x height RGB image, row-major, 3 bytes a pixel.
#[derive(Debug, Clone)]
pub(crate) struct Canvas {
    width: u32,
    height: u32,
    data: Vec<u8>,
}

impl Canvas {
    /// A canvas filled with `background`.
    pub(crate) fn new(width: u32, height: u32, background: Rgb) -> Self {
        let data = background.repeat(width as usize * height as usize);
        Self {
            width,
            height,
            data,
        }
    }

    fn index(&self, x: i64, y: i64) -> Option<usize> {
        let inside = x >= 0 && y >= 0 && x < i64::from(self.width) && y < i64::from(self.height);
        inside.then(|| (y as usize * self.width as usize + x as usize) * 3)
    }

    /// The color of pixel `(x, y)`; `None` outside the canvas.
    #[cfg(test)]
    pub(crate) fn pixel(&self, x: i64, y: i64) -> Option<Rgb> {
        self.index(x, y)
            .map(|i| [self.data[i], self.data[i + 1], self.data[i + 2]])
    }

    /// Paints `color` over pixel `(x, y)` with coverage `alpha` (0 = untouched, 1 = replaced).
    pub(crate) fn blend(&mut self, x: i64, y: i64, color: Rgb, alpha: f32) {
        let Some(i) = self.index(x, y) else { return };
        let a = alpha.clamp(0.0, 1.0);
        if a >= 1.0 {
            self.data[i..i + 3].copy_from_slice(&color);
            return;
        }
        for (dst, src) in self.data[i..i + 3].iter_mut().zip(color) {
            let mixed = f32::from(*dst) * (1.0 - a) + f32::from(src) * a;
            *dst = mixed.round() as u8;
        }
    }

    /// Fills the `w` x `h` rectangle whose top-left pixel is `(x, y)`.
    pub(crate) fn fill_rect(&mut self, x: i64, y: i64, w: i64, h: i64, color: Rgb) {
        for py in y.max(0)..(y + h).min(i64::from(self.height)) {
            for px in x.max(0)..(x + w).min(i64::from(self.width)) {
                self.blend(px, py, color, 1.0);
            }
        }
    }

    /// A 1-pixel outline of the `w` x `h` rectangle whose top-left pixel is `(x, y)`.
    pub(crate) fn stroke_rect(&mut self, x: i64, y: i64, w: i64, h: i64, color: Rgb) {
        self.fill_rect(x, y, w, 1, color);
        self.fill_rect(x, y + h - 1, w, 1, color);
        self.fill_rect(x, y, 1, h, color);
        self.fill_rect(x + w - 1, y, 1, h, color);
    }

    /// An anti-aliased polyline `width` pixels thick through `points`, with round joins and caps.
    ///
    /// Coverage is collected in a mask first (the maximum over segments) and painted once, so
    /// joints are not painted twice and do not show as darker dots.
    pub(crate) fn polyline(&mut self, points: &[(f64, f64)], width: f64, color: Rgb) {
        // Points within a quarter pixel of the last one kept change nothing visible; dropping
        // them keeps a CDF of 100k values as cheap as one of a thousand.
        let mut kept: Vec<(f64, f64)> = Vec::new();
        let finite = points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite());
        for &(x, y) in finite {
            match kept.last() {
                Some(&(lx, ly)) if (x - lx).abs() < 0.25 && (y - ly).abs() < 0.25 => {}
                _ => kept.push((x, y)),
            }
        }
        if let (Some(&last), Some(kept_last)) = (points.last(), kept.last_mut())
            && last.0.is_finite()
            && last.1.is_finite()
        {
            *kept_last = last;
        }
        let points = kept;
        let Some(&first) = points.first() else { return };
        let reach = width / 2.0 + 1.0;
        let (mut x0, mut y0, mut x1, mut y1) = (first.0, first.1, first.0, first.1);
        for &(x, y) in &points {
            (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x), y1.max(y));
        }
        let Some(mask) = Mask::covering(self, x0 - reach, y0 - reach, x1 + reach, y1 + reach)
        else {
            return;
        };
        let mut mask = mask;
        let pairs = points.windows(2).map(|w| (w[0], w[1]));
        let segments = std::iter::once((first, first)).chain(pairs);
        for (a, b) in segments {
            mask.add_segment(a, b, width / 2.0);
        }
        mask.paint(self, color);
    }

    /// An anti-aliased filled disc of radius `r` centred on `(cx, cy)`.
    pub(crate) fn disc(&mut self, cx: f64, cy: f64, r: f64, color: Rgb) {
        let reach = r + 1.0;
        let Some(mut mask) = Mask::covering(self, cx - reach, cy - reach, cx + reach, cy + reach)
        else {
            return;
        };
        mask.add_segment((cx, cy), (cx, cy), r);
        mask.paint(self, color);
    }

    /// Writes the image as a PNG file at `path`, creating its parent directories.
    pub(crate) fn save_png(&self, path: &Path) -> Result<(), PlotError> {
        let io = |source| PlotError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        self.write_png(&mut out).map_err(|e| match e {
            png::EncodingError::IoError(source) => io(source),
            other => PlotError::Encode(other.to_string()),
        })?;
        out.flush().map_err(io)
    }

    /// Encodes the image as 8-bit RGB PNG into `out`.
    fn write_png<W: Write>(&self, out: W) -> Result<(), png::EncodingError> {
        let mut encoder = png::Encoder::new(out, self.width, self.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&self.data)?;
        writer.finish()
    }
}

/// Per-pixel coverage (0..=1) over a rectangle of the canvas.
struct Mask {
    left: i64,
    top: i64,
    width: i64,
    height: i64,
    coverage: Vec<f32>,
}

impl Mask {
    /// A mask over the canvas pixels touched by the box `(x0, y0)..(x1, y1)`; `None` when the box
    /// lies outside the canvas.
    fn covering(canvas: &Canvas, x0: f64, y0: f64, x1: f64, y1: f64) -> Option<Self> {
        let left = (x0.floor() as i64).max(0);
        let top = (y0.floor() as i64).max(0);
        let right = (x1.ceil() as i64).min(i64::from(canvas.width));
        let bottom = (y1.ceil() as i64).min(i64::from(canvas.height));
        let (width, height) = (right - left, bottom - top);
        (width > 0 && height > 0).then(|| Self {
            left,
            top,
            width,
            height,
            coverage: vec![0.0; (width * height) as usize],
        })
    }

    /// Adds the capsule of radius `half` around segment `a`-`b` (a disc when `a == b`); a pixel's
    /// coverage falls off linearly over one pixel at the edge.
    fn add_segment(&mut self, a: (f64, f64), b: (f64, f64), half: f64) {
        let reach = half + 1.0;
        let px0 = ((a.0.min(b.0) - reach).floor() as i64).max(self.left);
        let px1 = ((a.0.max(b.0) + reach).ceil() as i64).min(self.left + self.width);
        let py0 = ((a.1.min(b.1) - reach).floor() as i64).max(self.top);
        let py1 = ((a.1.max(b.1) + reach).ceil() as i64).min(self.top + self.height);
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let len2 = dx * dx + dy * dy;
        for py in py0..py1 {
            for px in px0..px1 {
                let (cx, cy) = (px as f64 + 0.5, py as f64 + 0.5);
                let t = if len2 > 0.0 {
                    (((cx - a.0) * dx + (cy - a.1) * dy) / len2).clamp(0.0, 1.0)
                } else {
                    0.0
                };
                let dist = (cx - a.0 - t * dx).hypot(cy - a.1 - t * dy);
                let cover = (half + 0.5 - dist).clamp(0.0, 1.0) as f32;
                let i = ((py - self.top) * self.width + (px - self.left)) as usize;
                self.coverage[i] = self.coverage[i].max(cover);
            }
        }
    }

    fn paint(&self, canvas: &mut Canvas, color: Rgb) {
        for (i, &cover) in self.coverage.iter().enumerate() {
            if cover > 0.0 {
                let i = i as i64;
                canvas.blend(
                    self.left + i % self.width,
                    self.top + i / self.width,
                    color,
                    cover,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHITE: Rgb = [255, 255, 255];
    const RED: Rgb = [200, 0, 0];

    #[test]
    fn png_round_trips_size_and_pixels() {
        let mut canvas = Canvas::new(7, 5, WHITE);
        canvas.fill_rect(2, 1, 3, 2, RED);
        let mut bytes = Vec::new();
        canvas.write_png(&mut bytes).unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(&bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (7, 5));
        assert_eq!(&buf[..info.buffer_size()], &canvas.data[..]);
    }

    #[test]
    fn thick_line_covers_its_width_and_nothing_far_away() {
        let mut canvas = Canvas::new(40, 20, WHITE);
        canvas.polyline(&[(5.0, 10.0), (35.0, 10.0)], 3.0, RED);
        assert_eq!(canvas.pixel(20, 10), Some(RED));
        assert_eq!(canvas.pixel(20, 9), Some(RED));
        assert_eq!(canvas.pixel(20, 14), Some(WHITE));
        assert_eq!(canvas.pixel(38, 10), Some(WHITE));
    }

    #[test]
    fn drawing_off_canvas_is_ignored() {
        let mut canvas = Canvas::new(10, 10, WHITE);
        canvas.polyline(&[(-50.0, -50.0), (-20.0, -30.0)], 2.0, RED);
        canvas.disc(100.0, 100.0, 3.0, RED);
        canvas.fill_rect(-5, -5, 3, 3, RED);
        assert!(canvas.data.iter().all(|&b| b == 255));
    }
}

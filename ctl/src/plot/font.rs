//! An embedded 5x7 bitmap font for printable ASCII, drawn at integer scales, so chart text looks
//! the same on every machine and needs no font files.
//!
//! Each glyph is 5 pixels wide and 9 rows tall: rows 0-6 stand on the baseline (capitals and
//! digits fill all seven, lower case rows 2-6), rows 7-8 hold descenders. A character advances
//! 6 pixels (one column of spacing); a line is 11 pixels. Characters outside 32..=126 draw as `?`.

use super::canvas::{Canvas, Rgb};

/// Glyph width in pixels at scale 1.
const GLYPH_W: u32 = 5;
/// Glyph rows (7 above the baseline, 2 below).
const GLYPH_ROWS: usize = 9;
/// Horizontal advance per character at scale 1.
pub(crate) const ADVANCE: u32 = GLYPH_W + 1;
/// Capital height at scale 1 (what a label needs above its baseline).
pub(crate) const CAP_HEIGHT: u32 = 7;
/// Line height at scale 1 (capitals, descenders and a row of spacing).
pub(crate) const LINE_HEIGHT: u32 = 11;

/// The glyphs of ASCII 32..=126 as pixel art: rows top to bottom separated by `|` (rows left out
/// at the end are blank), `#` = ink, `.` = paper. Parsed into bit rows at compile time.
const ART: [&str; 95] = [
    "", // space
    "..#..|..#..|..#..|..#..|..#..|.....|..#..",
    ".#.#.|.#.#.",
    ".#.#.|.#.#.|#####|.#.#.|#####|.#.#.|.#.#.",
    "..#..|.####|#.#..|.###.|..#.#|####.|..#..",
    "##...|##..#|...#.|..#..|.#...|#..##|...##",
    ".##..|#..#.|#.#..|.#...|#.#.#|#..#.|.##.#",
    "..#..|..#..|.#...",
    "...#.|..#..|.#...|.#...|.#...|..#..|...#.",
    ".#...|..#..|...#.|...#.|...#.|..#..|.#...",
    ".....|..#..|#.#.#|.###.|#.#.#|..#..",
    ".....|..#..|..#..|#####|..#..|..#..",
    ".....|.....|.....|.....|.....|.##..|..#..|.#...",
    ".....|.....|.....|#####",
    ".....|.....|.....|.....|.....|.##..|.##..",
    ".....|....#|...#.|..#..|.#...|#....",
    ".###.|#...#|#..##|#.#.#|##..#|#...#|.###.", // 0
    "..#..|.##..|..#..|..#..|..#..|..#..|.###.",
    ".###.|#...#|....#|...#.|..#..|.#...|#####",
    "#####|...#.|..#..|...#.|....#|#...#|.###.",
    "...#.|..##.|.#.#.|#..#.|#####|...#.|...#.",
    "#####|#....|####.|....#|....#|#...#|.###.",
    "..##.|.#...|#....|####.|#...#|#...#|.###.",
    "#####|....#|...#.|..#..|.#...|.#...|.#...",
    ".###.|#...#|#...#|.###.|#...#|#...#|.###.",
    ".###.|#...#|#...#|.####|....#|...#.|.##..",
    ".....|.##..|.##..|.....|.##..|.##..", // :
    ".....|.##..|.##..|.....|.##..|..#..|.#...",
    "...#.|..#..|.#...|#....|.#...|..#..|...#.",
    ".....|.....|#####|.....|#####",
    ".#...|..#..|...#.|....#|...#.|..#..|.#...",
    ".###.|#...#|....#|...#.|..#..|.....|..#..",
    ".###.|#...#|....#|.##.#|#.#.#|#.#.#|.###.", // @
    ".###.|#...#|#...#|#####|#...#|#...#|#...#",
    "####.|#...#|#...#|####.|#...#|#...#|####.",
    ".###.|#...#|#....|#....|#....|#...#|.###.",
    "###..|#..#.|#...#|#...#|#...#|#..#.|###..",
    "#####|#....|#....|####.|#....|#....|#####",
    "#####|#....|#....|####.|#....|#....|#....",
    ".###.|#...#|#....|#.###|#...#|#...#|.####",
    "#...#|#...#|#...#|#####|#...#|#...#|#...#",
    ".###.|..#..|..#..|..#..|..#..|..#..|.###.",
    "..###|...#.|...#.|...#.|...#.|#..#.|.##..",
    "#...#|#..#.|#.#..|##...|#.#..|#..#.|#...#",
    "#....|#....|#....|#....|#....|#....|#####",
    "#...#|##.##|#.#.#|#.#.#|#...#|#...#|#...#",
    "#...#|#...#|##..#|#.#.#|#..##|#...#|#...#",
    ".###.|#...#|#...#|#...#|#...#|#...#|.###.",
    "####.|#...#|#...#|####.|#....|#....|#....",
    ".###.|#...#|#...#|#...#|#.#.#|#..#.|.##.#",
    "####.|#...#|#...#|####.|#.#..|#..#.|#...#",
    ".####|#....|#....|.###.|....#|....#|####.",
    "#####|..#..|..#..|..#..|..#..|..#..|..#..",
    "#...#|#...#|#...#|#...#|#...#|#...#|.###.",
    "#...#|#...#|#...#|#...#|#...#|.#.#.|..#..",
    "#...#|#...#|#...#|#.#.#|#.#.#|#.#.#|.#.#.",
    "#...#|#...#|.#.#.|..#..|.#.#.|#...#|#...#",
    "#...#|#...#|#...#|.#.#.|..#..|..#..|..#..",
    "#####|....#|...#.|..#..|.#...|#....|#####", // Z
    ".###.|.#...|.#...|.#...|.#...|.#...|.###.",
    ".....|#....|.#...|..#..|...#.|....#",
    ".###.|...#.|...#.|...#.|...#.|...#.|.###.",
    "..#..|.#.#.|#...#",
    ".....|.....|.....|.....|.....|.....|.....|#####",
    ".#...|..#..|...#.",
    ".....|.....|.###.|....#|.####|#...#|.####", // a
    "#....|#....|####.|#...#|#...#|#...#|####.",
    ".....|.....|.###.|#....|#....|#...#|.###.",
    "....#|....#|.####|#...#|#...#|#...#|.####",
    ".....|.....|.###.|#...#|#####|#....|.###.",
    "..##.|.#..#|.#...|###..|.#...|.#...|.#...",
    ".....|.....|.####|#...#|#...#|#...#|.####|....#|.###.",
    "#....|#....|#.##.|##..#|#...#|#...#|#...#",
    "..#..|.....|.##..|..#..|..#..|..#..|.###.",
    "...#.|.....|..##.|...#.|...#.|...#.|...#.|#..#.|.##..",
    "#....|#....|#..#.|#.#..|##...|#.#..|#..#.",
    ".##..|..#..|..#..|..#..|..#..|..#..|.###.",
    ".....|.....|##.#.|#.#.#|#.#.#|#.#.#|#.#.#",
    ".....|.....|#.##.|##..#|#...#|#...#|#...#",
    ".....|.....|.###.|#...#|#...#|#...#|.###.",
    ".....|.....|####.|#...#|#...#|#...#|####.|#....|#....",
    ".....|.....|.####|#...#|#...#|#...#|.####|....#|....#",
    ".....|.....|#.##.|##..#|#....|#....|#....",
    ".....|.....|.####|#....|.###.|....#|####.",
    ".#...|.#...|###..|.#...|.#...|.#..#|..##.",
    ".....|.....|#...#|#...#|#...#|#..##|.##.#",
    ".....|.....|#...#|#...#|#...#|.#.#.|..#..",
    ".....|.....|#...#|#...#|#.#.#|#.#.#|.#.#.",
    ".....|.....|#...#|.#.#.|..#..|.#.#.|#...#",
    ".....|.....|#...#|#...#|#...#|#...#|.####|....#|.###.",
    ".....|.....|#####|...#.|..#..|.#...|#####", // z
    "...#.|..#..|..#..|.#...|..#..|..#..|...#.",
    "..#..|..#..|..#..|..#..|..#..|..#..|..#..",
    ".#...|..#..|..#..|...#.|..#..|..#..|.#...",
    ".....|.....|.#...|#.#.#|...#.",
];

/// Bit rows of each glyph: bit 4 is the leftmost column.
const GLYPHS: [[u8; GLYPH_ROWS]; 95] = parse_all();

const fn parse_all() -> [[u8; GLYPH_ROWS]; 95] {
    let mut out = [[0u8; GLYPH_ROWS]; 95];
    let mut g = 0;
    while g < ART.len() {
        out[g] = parse_glyph(ART[g].as_bytes());
        g += 1;
    }
    out
}

/// Parses one glyph's art; a malformed glyph fails the build.
const fn parse_glyph(art: &[u8]) -> [u8; GLYPH_ROWS] {
    let mut rows = [0u8; GLYPH_ROWS];
    let (mut row, mut col, mut i) = (0, 0, 0);
    while i < art.len() {
        match art[i] {
            b'|' => {
                assert!(col == GLYPH_W as usize, "glyph row is not 5 wide");
                row += 1;
                col = 0;
            }
            c => {
                assert!(c == b'#' || c == b'.', "glyph art is '#' and '.'");
                assert!(row < GLYPH_ROWS && col < GLYPH_W as usize, "glyph too big");
                if c == b'#' {
                    rows[row] |= 1 << (GLYPH_W as usize - 1 - col);
                }
                col += 1;
            }
        }
        i += 1;
    }
    assert!(
        art.is_empty() || col == GLYPH_W as usize,
        "glyph row is not 5 wide"
    );
    rows
}

fn glyph(c: char) -> &'static [u8; GLYPH_ROWS] {
    let code = u32::from(c);
    let index = if (32..=126).contains(&code) {
        code - 32
    } else {
        u32::from('?') - 32
    };
    &GLYPHS[index as usize]
}

/// Width in pixels of `text` at `scale`: characters times the advance, less the spacing column
/// after the last one.
pub(crate) fn text_width(text: &str, scale: u32) -> u32 {
    let n = text.chars().count() as u32;
    (n * ADVANCE).saturating_sub(1) * scale
}

/// Draws `text` left to right with its top-left corner (the top of the capitals) at `(x, y)`.
pub(crate) fn draw_text(canvas: &mut Canvas, x: i64, y: i64, text: &str, scale: u32, color: Rgb) {
    let s = i64::from(scale);
    for (i, c) in text.chars().enumerate() {
        let left = x + i as i64 * i64::from(ADVANCE) * s;
        for (row, bits) in glyph(c).iter().enumerate() {
            for col in 0..GLYPH_W {
                if bits & (1 << (GLYPH_W - 1 - col)) != 0 {
                    let (px, py) = (left + i64::from(col) * s, y + row as i64 * s);
                    canvas.fill_rect(px, py, s, s, color);
                }
            }
        }
    }
}

/// Draws `text` turned 90 degrees counter-clockwise (read bottom to top), its capitals' top
/// edge on the left at `x` and its first character's bottom at `y`.
pub(crate) fn draw_text_up(
    canvas: &mut Canvas,
    x: i64,
    y: i64,
    text: &str,
    scale: u32,
    color: Rgb,
) {
    let s = i64::from(scale);
    for (i, c) in text.chars().enumerate() {
        let bottom = y - i as i64 * i64::from(ADVANCE) * s;
        for (row, bits) in glyph(c).iter().enumerate() {
            for col in 0..GLYPH_W {
                if bits & (1 << (GLYPH_W - 1 - col)) != 0 {
                    let (px, py) = (x + row as i64 * s, bottom - (i64::from(col) + 1) * s);
                    canvas.fill_rect(px, py, s, s, color);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_width_is_glyph_count_times_advance() {
        assert_eq!(text_width("", 1), 0);
        assert_eq!(text_width("A", 1), 5);
        assert_eq!(text_width("p90 TTFT", 1), 8 * ADVANCE - 1);
        assert_eq!(text_width("p90 TTFT", 2), (8 * ADVANCE - 1) * 2);
    }

    #[test]
    fn every_printable_glyph_has_ink_except_space() {
        for code in 33u8..=126 {
            assert!(
                glyph(char::from(code)).iter().any(|&r| r != 0),
                "{}",
                char::from(code)
            );
        }
        assert!(glyph(' ').iter().all(|&r| r == 0));
        assert_eq!(glyph('\u{e9}'), glyph('?'));
    }

    #[test]
    fn drawn_text_stays_inside_its_box() {
        let white = [255, 255, 255];
        let mut canvas = Canvas::new(60, 30, white);
        draw_text(&mut canvas, 3, 4, "Hg", 2, [0, 0, 0]);
        let (w, h) = (text_width("Hg", 2) as i64, (GLYPH_ROWS as i64) * 2);
        let mut inked = 0;
        for y in 0..30 {
            for x in 0..60 {
                let inside = (3..3 + w).contains(&x) && (4..4 + h).contains(&y);
                if canvas.pixel(x, y) != Some(white) {
                    assert!(inside, "ink at ({x}, {y})");
                    inked += 1;
                }
            }
        }
        assert!(inked > 40);
    }
}

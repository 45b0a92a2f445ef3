//! Whole charts: written files decode to the right size, show the series, and bad input errors.

use std::path::{Path, PathBuf};

use plotters::style::RGBColor;

use super::page::series_color;
use super::{HEIGHT, PlotError, Series, WIDTH, bar_chart, cdf_chart, line_chart};

/// Decodes the PNG at `path`: width, height and RGB bytes.
fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut reader = png::Decoder::new(file).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// How many pixels have exactly `color`.
fn count(rgb: &[u8], RGBColor(r, g, b): RGBColor) -> usize {
    rgb.chunks_exact(3).filter(|p| *p == [r, g, b]).count()
}

fn latencies(scale: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| scale * (1.0 + (i as f64 * 0.37).sin().abs() * i as f64 / n as f64))
        .collect()
}

fn chart_path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

#[test]
fn cdf_of_two_series_decodes_and_shows_both_colors() {
    let dir = tempfile::tempdir().unwrap();
    let path = chart_path(&dir, "ttft.png");
    let series = [
        Series::new("local prefill", latencies(120.0, 400)),
        Series::new("remote prefill", latencies(300.0, 400)),
    ];
    cdf_chart(&path, "TTFT", "TTFT (ms)", &series, false).unwrap();
    let (w, h, rgb) = decode(&path);
    assert_eq!((w, h), (WIDTH, HEIGHT));
    // The legend swatches alone are far fewer than 300 pixels; the curves add hundreds.
    for i in 0..2 {
        let n = count(&rgb, series_color(i));
        assert!(n > 300, "series {i}: {n} pixels of its color");
    }
    assert_eq!(count(&rgb, series_color(2)), 0);
}

#[test]
fn log_cdf_skips_non_positive_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = chart_path(&dir, "log.png");
    let values = vec![0.0, -3.0, 0.002, 0.5, 40.0, 9e4, f64::NAN];
    cdf_chart(&path, "wide range", "ms", &[Series::new("a", values)], true).unwrap();
    assert_eq!(decode(&path).0, WIDTH);
    let only_bad = [Series::new("a", vec![0.0, -1.0, f64::INFINITY])];
    let err = cdf_chart(&path, "t", "x", &only_bad, true).unwrap_err();
    assert!(matches!(err, PlotError::Empty(_)), "{err}");
}

#[test]
fn bar_and_line_charts_decode_with_series_colors() {
    let dir = tempfile::tempdir().unwrap();
    let categories: Vec<String> = (0..8).map(|c| format!("cluster {c}")).collect();
    let series = [
        Series::new(
            "learned",
            (0..8).map(|c| 0.6 + 0.05 * f64::from(c)).collect(),
        ),
        Series::new(
            "always local",
            vec![0.5, 0.4, f64::NAN, 0.9, 1.2, 0.3, 0.2, 0.1],
        ),
    ];
    let bars = chart_path(&dir, "bars.png");
    bar_chart(
        &bars,
        "attainment",
        "attainment",
        &categories,
        &series,
        true,
    )
    .unwrap();
    let lines = chart_path(&dir, "lines.png");
    line_chart(&lines, "learning", "round", "attainment", &series).unwrap();
    for path in [bars, lines] {
        let (w, h, rgb) = decode(&path);
        assert_eq!((w, h), (WIDTH, HEIGHT));
        for i in 0..2 {
            assert!(
                count(&rgb, series_color(i)) > 200,
                "{}: series {i}",
                path.display()
            );
        }
    }
}

#[test]
fn single_and_identical_values_still_render() {
    let dir = tempfile::tempdir().unwrap();
    let path = chart_path(&dir, "one.png");
    let one = [Series::new("one", vec![42.0])];
    let same = [
        Series::new("same", vec![7.0; 5]),
        Series::new("zero", vec![0.0; 3]),
    ];
    cdf_chart(&path, "one value", "ms", &one, false).unwrap();
    cdf_chart(&path, "one value, log", "ms", &one, true).unwrap();
    cdf_chart(&path, "identical", "ms", &same, false).unwrap();
    line_chart(&path, "one point", "round", "x", &one).unwrap();
    line_chart(&path, "flat", "round", "x", &same).unwrap();
    bar_chart(&path, "zeros", "x", &["a".to_string()], &same[1..], false).unwrap();
    let (w, h, rgb) = decode(&path);
    assert_eq!((w, h), (WIDTH, HEIGHT));
    assert!(count(&rgb, series_color(0)) > 100);
}

#[test]
fn empty_input_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = chart_path(&dir, "empty.png");
    let nan = [Series::new("nan", vec![f64::NAN, f64::NEG_INFINITY])];
    let empty = [Series::new("empty", Vec::new())];
    let results = [
        cdf_chart(&path, "t", "x", &[], false),
        cdf_chart(&path, "t", "x", &nan, false),
        cdf_chart(&path, "t", "x", &empty, true),
        line_chart(&path, "t", "x", "y", &nan),
        line_chart(&path, "t", "x", "y", &[]),
        bar_chart(&path, "t", "y", &[], &[Series::new("a", vec![1.0])], true),
        bar_chart(&path, "t", "y", &["a".to_string()], &[], true),
        bar_chart(&path, "t", "y", &["a".to_string()], &nan, false),
    ];
    for (i, result) in results.into_iter().enumerate() {
        assert!(
            matches!(result, Err(PlotError::Empty(_))),
            "case {i}: {result:?}"
        );
    }
    assert!(!path.exists());
}

#[test]
fn unwritable_path_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = chart_path(&dir, "file");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let path = blocker.join("chart.png");
    let err = cdf_chart(&path, "t", "x", &[Series::new("a", vec![1.0])], false).unwrap_err();
    assert!(
        matches!(&err, PlotError::Io { path: p, .. } if p == &path),
        "{err:?}"
    );
    assert!(err.to_string().contains("chart.png"));
}

/// Renders one chart of each kind into `$PLOT_EXAMPLES` (default /tmp/plot-examples) for a
/// person to look at: `cargo test -p dolphinctl chart::tests::render_examples -- --ignored`.
#[test]
#[ignore = "writes example charts for manual inspection"]
fn render_examples() {
    let dir = PathBuf::from(
        std::env::var("PLOT_EXAMPLES").unwrap_or_else(|_| "/tmp/plot-examples".to_string()),
    );
    let ttft = [
        Series::new("round robin", latencies(180.0, 2000)),
        Series::new("always remote prefill", latencies(260.0, 2000)),
        Series::new("learned table (k=8)", latencies(110.0, 2000)),
    ];
    cdf_chart(
        &dir.join("cdf.png"),
        "TTFT CDF, mooncake trace",
        "TTFT (ms)",
        &ttft,
        false,
    )
    .unwrap();
    let mut wide = latencies(0.05, 300);
    wide.extend(latencies(2000.0, 300));
    let wide = [
        Series::new("queue wait", wide),
        Series::new("transfer", latencies(3.0, 500)),
    ];
    cdf_chart(
        &dir.join("cdf-log.png"),
        "Waits (log x)",
        "wait (ms)",
        &wide,
        true,
    )
    .unwrap();
    let categories: Vec<String> = (0..8).map(|c| format!("cluster {c}")).collect();
    let bars = [
        Series::new("local", vec![0.91, 0.42, 0.88, 1.0, 0.12, 0.67, 0.75, 0.5]),
        Series::new("remote", vec![0.85, 0.93, 0.61, 0.97, 0.81, 0.0, 0.7, 0.55]),
        Series::new(
            "learned",
            vec![0.93, 0.94, 0.9, 1.0, 0.8, 0.66, 0.77, f64::NAN],
        ),
    ];
    bar_chart(
        &dir.join("bars.png"),
        "SLO attainment per cluster",
        "attainment",
        &categories,
        &bars,
        true,
    )
    .unwrap();
    let rounds: Vec<f64> = (0..40)
        .map(|r| 0.55 + 0.35 * (1.0 - (-f64::from(r) / 8.0).exp()))
        .collect();
    let best = rounds
        .iter()
        .scan(0.0f64, |b, &v| {
            *b = b.max(v);
            Some(*b)
        })
        .collect();
    let noisy = rounds
        .iter()
        .enumerate()
        .map(|(i, v)| v - 0.04 * (i as f64 * 1.3).sin().abs())
        .collect();
    let lines = [
        Series::new("attainment", noisy),
        Series::new("best so far", best),
    ];
    line_chart(
        &dir.join("lines.png"),
        "Learning: attainment by round",
        "round",
        "attainment",
        &lines,
    )
    .unwrap();
    let one = [
        Series::new("only", vec![42.0]),
        Series::new("same", vec![40.0; 3]),
    ];
    cdf_chart(
        &dir.join("cdf-single.png"),
        "Single values",
        "ms",
        &one,
        false,
    )
    .unwrap();
    let kinds: Vec<String> = [
        "mooncake conversation",
        "azure code",
        "arxiv summarization",
        "humaneval",
    ]
    .map(String::from)
    .into();
    let many: Vec<Series> = (0..10)
        .map(|i| {
            Series::new(
                format!("policy number {i}"),
                vec![120.0 * f64::from(i) - 300.0, 1e4, 3.0, -40.0],
            )
        })
        .collect();
    bar_chart(
        &dir.join("bars-signed.png"),
        "Change in p90 TTFT",
        "ms",
        &kinds,
        &many,
        false,
    )
    .unwrap();
}

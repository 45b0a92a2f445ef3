//! "Nice" tick positions (1, 2 or 5 x 10^n; decades on a log axis) and the text of tick and
//! value labels.

/// `10^e`, exact for the powers that are exactly representable (and correctly rounded below 1).
pub(crate) fn pow10(e: i32) -> f64 {
    if e >= 0 {
        10f64.powi(e)
    } else {
        1.0 / 10f64.powi(-e)
    }
}

/// A tick step of `mult x 10^exp` with `mult` 1, 2 or 5.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    mult: f64,
    exp: i32,
}

impl Step {
    /// The step for about `max_ticks` intervals over `span`.
    fn for_span(span: f64, max_ticks: usize) -> Self {
        let raw = span.abs() / max_ticks.max(1) as f64;
        let exp = raw.log10().floor() as i32;
        let normalized = raw / pow10(exp);
        match normalized {
            n if n <= 1.0 => Self { mult: 1.0, exp },
            n if n <= 2.0 => Self { mult: 2.0, exp },
            n if n <= 5.0 => Self { mult: 5.0, exp },
            _ => Self {
                mult: 1.0,
                exp: exp + 1,
            },
        }
    }

    /// `i` steps from zero, computed so that e.g. 3 x 0.2 is 0.6 and not 0.6000000000000001.
    fn times(self, i: i64) -> f64 {
        let units = i as f64 * self.mult;
        let v = if self.exp >= 0 {
            units * pow10(self.exp)
        } else {
            units / pow10(-self.exp)
        };
        v + 0.0 // no negative zero
    }

    fn size(self) -> f64 {
        self.times(1)
    }
}

/// The tick step for about `max_ticks` intervals over `span`: 1, 2 or 5 times a power of ten.
pub(crate) fn nice_step(span: f64, max_ticks: usize) -> f64 {
    Step::for_span(span, max_ticks).size()
}

/// Ticks at multiples of a nice step covering `lo..=hi` (the first at or below `lo`, the last
/// at or above `hi`), at most about `max_ticks + 1` of them.
pub(crate) fn linear_ticks(lo: f64, hi: f64, max_ticks: usize) -> Vec<f64> {
    let step = Step::for_span(hi - lo, max_ticks);
    let first = (lo / step.size() + 1e-9).floor() as i64;
    let last = (hi / step.size() - 1e-9).ceil() as i64;
    (first..=last).map(|i| step.times(i)).collect()
}

/// Decade ticks (10^k) covering `lo..=hi` (both > 0), every `n`th decade when there are more
/// than `max_ticks` of them; also 2 x and 5 x 10^k when the range spans at most two decades.
pub(crate) fn log_ticks(lo: f64, hi: f64, max_ticks: usize) -> Vec<f64> {
    let first = (lo.log10() + 1e-9).floor() as i32;
    let mut last = (hi.log10() - 1e-9).ceil() as i32;
    if last <= first {
        last = first + 1;
    }
    let decades = (last - first) as usize;
    let every = decades.div_ceil(max_ticks.max(1)).max(1) as i32;
    let last = first + (last - first + every - 1) / every * every;
    let mut ticks = Vec::new();
    for e in (first..=last).step_by(every as usize) {
        ticks.push(pow10(e));
        if decades <= 2 && e < last {
            ticks.extend([2.0, 5.0].map(|m| m * pow10(e)));
        }
    }
    ticks
}

/// Labels for linear ticks `step` apart: just enough decimals to tell them apart, scientific
/// notation for very large or very small values.
pub(crate) fn linear_labels(ticks: &[f64], step: f64) -> Vec<String> {
    let biggest = ticks.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    ticks
        .iter()
        .map(|&v| {
            if v == 0.0 {
                "0".to_string()
            } else if biggest >= 1e6 || step < 1e-4 {
                scientific(v)
            } else {
                let decimals = (-step.log10()).ceil().max(0.0) as usize;
                format!("{v:.decimals$}")
            }
        })
        .collect()
}

/// A label for a log-axis tick: plain from 0.001 to 10000, `1e5` style beyond.
pub(crate) fn log_label(v: f64) -> String {
    let e = v.log10().round() as i32;
    if (-3..=4).contains(&e) {
        let decimals = (-v.log10()).ceil().max(0.0) as usize;
        format!("{v:.decimals$}")
    } else {
        scientific(v)
    }
}

/// A value as text: 3 significant digits, trailing zeros dropped, scientific beyond 1e6.
pub(crate) fn value_label(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        return scientific(v);
    }
    let decimals = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else {
        2
    };
    trim_zeros(format!("{v:.decimals$}"))
}

fn scientific(v: f64) -> String {
    let e = v.abs().log10().floor() as i32;
    let mantissa = trim_zeros(format!("{:.2}", v / pow10(e)));
    format!("{mantissa}e{e}")
}

fn trim_zeros(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_ticks_are_nice_numbers() {
        assert_eq!(linear_ticks(0.0, 1.0, 5), [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(
            linear_ticks(3.0, 97.0, 5),
            [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
        );
        assert_eq!(linear_ticks(-0.3, 0.25, 5), [-0.4, -0.2, 0.0, 0.2, 0.4]);
        assert_eq!(
            linear_ticks(0.0, 0.7, 7),
            [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
        );
        assert_eq!(
            linear_ticks(1200.0, 4800.0, 4),
            [1000.0, 2000.0, 3000.0, 4000.0, 5000.0]
        );
        assert_eq!(nice_step(0.07, 10), 0.01);
        assert_eq!(nice_step(940.0, 5), 200.0);
        assert_eq!(nice_step(30.0, 10), 5.0);
    }

    #[test]
    fn log_ticks_are_decades() {
        let ticks = log_ticks(0.001, 1e5, 10);
        assert_eq!(ticks.len(), 9);
        for (t, e) in ticks.iter().zip(-3..) {
            assert_eq!(*t, pow10(e));
        }
        let labels: Vec<String> = ticks.iter().map(|&t| log_label(t)).collect();
        assert_eq!(labels[0], "0.001");
        assert_eq!(labels[3], "1");
        assert_eq!(labels[7], "10000");
        assert_eq!(labels[8], "1e5");
        // Too many decades for the room: every other one, still covering the range.
        let sparse = log_ticks(0.001, 1e5, 4);
        assert_eq!(sparse.len(), 5);
        assert!(sparse[0] <= 0.001 && sparse[4] >= 1e5);
        // Within one decade: 1, 2, 5, 10.
        assert_eq!(log_ticks(3.0, 9.0, 10), [1.0, 2.0, 5.0, 10.0]);
    }

    #[test]
    fn labels_have_just_enough_decimals() {
        assert_eq!(linear_labels(&[0.0, 0.2, 0.4], 0.2), ["0", "0.2", "0.4"]);
        assert_eq!(linear_labels(&[0.05, 0.1], 0.05), ["0.05", "0.10"]);
        assert_eq!(linear_labels(&[20.0, 40.0], 20.0), ["20", "40"]);
        assert_eq!(linear_labels(&[0.0, 2e6], 2e6), ["0", "2e6"]);
        assert_eq!(value_label(0.934), "0.93");
        assert_eq!(value_label(1.0), "1");
        assert_eq!(value_label(1234.6), "1235");
        assert_eq!(value_label(2.5e7), "2.5e7");
    }
}

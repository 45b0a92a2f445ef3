//! The live replay's progress on stderr: a bar redrawn in place (at most ten times a second)
//! on a terminal, a plain line every few seconds otherwise (logs, pipes, CI).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use dolphin_workload::RequestOutcome;

/// Redraw period on a terminal.
const TTY_PERIOD: Duration = Duration::from_millis(100);
/// Line period when stderr is not a terminal.
const PLAIN_PERIOD: Duration = Duration::from_secs(5);
/// Width of the bar in characters.
const BAR: usize = 24;

/// Counts so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests in the replay.
    pub total: usize,
    /// Completed (successfully or not).
    pub done: usize,
    /// In flight now.
    pub in_flight: usize,
    /// Met their end-to-end SLO.
    pub met: usize,
    /// Failed.
    pub failed: usize,
}

impl Stats {
    /// Counts one finished request.
    pub fn record(&mut self, o: &RequestOutcome) {
        self.done += 1;
        self.met += usize::from(o.met);
        self.failed += usize::from(!o.ok);
    }
}

/// One progress line: bar, done/total, in flight, attainment so far, failures, elapsed, ETA.
pub fn render(s: &Stats, elapsed: Duration, bar: bool) -> String {
    let frac = if s.total > 0 {
        s.done as f64 / s.total as f64
    } else {
        1.0
    };
    let mut line = String::new();
    if bar {
        let filled = ((frac * BAR as f64).round() as usize).min(BAR);
        line.push('[');
        line.push_str(&"#".repeat(filled));
        line.push_str(&".".repeat(BAR - filled));
        line.push_str("] ");
    } else {
        line.push_str("replay: ");
    }
    line.push_str(&format!(
        "{}/{} done, {} in flight",
        s.done, s.total, s.in_flight
    ));
    if s.done > 0 {
        line.push_str(&format!(
            ", attainment {:.1}%",
            100.0 * s.met as f64 / s.done as f64
        ));
    }
    if s.failed > 0 {
        line.push_str(&format!(", {} failed", s.failed));
    }
    line.push_str(&format!(", {}", clock(elapsed)));
    if s.done > 0 && s.done < s.total {
        let eta = elapsed.mul_f64((s.total - s.done) as f64 / s.done as f64);
        line.push_str(&format!(", ETA {}", clock(eta)));
    }
    line
}

/// "12.3s", "4m05s".
fn clock(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let whole = d.as_secs();
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

/// Draws [`render`]ed lines on stderr.
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    tty: bool,
    drawn: bool,
}

impl Progress {
    /// A progress display (silent unless `enabled`); a bar if stderr is a terminal.
    pub fn new(enabled: bool) -> Self {
        Progress {
            enabled,
            tty: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    /// How often [`draw`](Self::draw) should be called.
    pub fn period(&self) -> Duration {
        if self.tty { TTY_PERIOD } else { PLAIN_PERIOD }
    }

    /// Redraws the bar, or prints a line.
    pub fn draw(&mut self, s: &Stats, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let mut err = std::io::stderr().lock();
        // Progress output is best effort: a closed stderr must not stop the replay.
        let _ = if self.tty {
            write!(err, "\r\x1b[2K{}", render(s, elapsed, true))
        } else {
            writeln!(err, "{}", render(s, elapsed, false))
        };
        let _ = err.flush();
        self.drawn = true;
    }

    /// The final state, ending the bar's line.
    pub fn finish(&mut self, s: &Stats, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        self.draw(s, elapsed);
        if self.tty && self.drawn {
            let _ = writeln!(std::io::stderr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_shows_counts_attainment_and_eta() {
        let s = Stats {
            total: 40,
            done: 10,
            in_flight: 4,
            met: 9,
            failed: 1,
        };
        let line = render(&s, Duration::from_secs(5), true);
        assert!(
            line.starts_with("[######..................] 10/40 done"),
            "{line}"
        );
        assert!(line.contains("4 in flight"), "{line}");
        assert!(line.contains("attainment 90.0%"), "{line}");
        assert!(line.contains("1 failed"), "{line}");
        assert!(line.contains("5.0s, ETA 15.0s"), "{line}");
        let plain = render(&s, Duration::from_secs(125), false);
        assert!(plain.starts_with("replay: 10/40 done"), "{plain}");
        assert!(plain.contains("2m05s, ETA 6m15s"), "{plain}");
    }

    #[test]
    fn nothing_done_has_no_attainment_or_eta() {
        let s = Stats {
            total: 3,
            ..Stats::default()
        };
        let line = render(&s, Duration::ZERO, false);
        assert_eq!(line, "replay: 0/3 done, 0 in flight, 0.0s");
    }
}

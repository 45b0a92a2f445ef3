//! The live replay's progress on stderr: an `indicatif` bar redrawn in place (at most ten times
//! a second) on a terminal, a plain line every few seconds otherwise (logs, pipes, CI).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use dolphin_workload::RequestOutcome;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Redraw period on a terminal.
const TTY_PERIOD: Duration = Duration::from_millis(100);
/// Line period when stderr is not a terminal.
const PLAIN_PERIOD: Duration = Duration::from_secs(5);
/// The bar: position, counts, what [`details`] says, elapsed time and ETA.
const BAR_TEMPLATE: &str = "[{bar:24}] {pos}/{len} done, {msg}, {elapsed_precise}, ETA {eta}";

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

/// In flight, attainment so far, failures: the part of a line the bar does not show itself.
pub fn details(s: &Stats) -> String {
    let mut line = format!("{} in flight", s.in_flight);
    if s.done > 0 {
        line.push_str(&format!(
            ", attainment {:.1}%",
            100.0 * s.met as f64 / s.done as f64
        ));
    }
    if s.failed > 0 {
        line.push_str(&format!(", {} failed", s.failed));
    }
    line
}

/// One plain progress line: done/total, [`details`], elapsed, ETA.
pub fn render(s: &Stats, elapsed: Duration) -> String {
    let mut line = format!("replay: {}/{} done, {}", s.done, s.total, details(s));
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

/// The progress display on stderr.
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    /// The bar, when stderr is a terminal.
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A progress display for `total` requests (silent unless `enabled`); a bar if stderr is a
    /// terminal.
    pub fn new(enabled: bool, total: usize) -> Self {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            // A constant template; the unit tests build it.
            let style = ProgressStyle::with_template(BAR_TEMPLATE)
                .expect("the bar template parses")
                .progress_chars("#>.");
            ProgressBar::with_draw_target(
                Some(total as u64),
                ProgressDrawTarget::stderr_with_hz(10),
            )
            .with_style(style)
        });
        Progress { enabled, bar }
    }

    /// How often [`draw`](Self::draw) should be called.
    pub fn period(&self) -> Duration {
        if self.bar.is_some() {
            TTY_PERIOD
        } else {
            PLAIN_PERIOD
        }
    }

    /// Updates the bar, or prints a line.
    pub fn draw(&mut self, s: &Stats, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        match &self.bar {
            Some(bar) => {
                bar.set_position(s.done as u64);
                bar.set_message(details(s));
            }
            None => {
                // Progress output is best effort: a closed stderr must not stop the replay.
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "{}", render(s, elapsed));
                let _ = err.flush();
            }
        }
    }

    /// The final state; the bar stays on screen.
    pub fn finish(&mut self, s: &Stats, elapsed: Duration) {
        self.draw(s, elapsed);
        if let Some(bar) = &self.bar {
            bar.finish();
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
        assert_eq!(details(&s), "4 in flight, attainment 90.0%, 1 failed");
        let plain = render(&s, Duration::from_secs(125));
        assert!(
            plain.starts_with("replay: 10/40 done, 4 in flight"),
            "{plain}"
        );
        assert!(plain.contains("2m05s, ETA 6m15s"), "{plain}");
        assert!(render(&s, Duration::from_secs(5)).contains("5.0s, ETA 15.0s"));
    }

    #[test]
    fn nothing_done_has_no_attainment_or_eta() {
        let s = Stats {
            total: 3,
            ..Stats::default()
        };
        assert_eq!(
            render(&s, Duration::ZERO),
            "replay: 0/3 done, 0 in flight, 0.0s"
        );
    }

    #[test]
    fn the_bar_template_parses() {
        ProgressStyle::with_template(BAR_TEMPLATE).expect("parses");
        // Not a terminal under the test harness: plain lines, every few seconds.
        assert_eq!(Progress::new(true, 5).period(), PLAIN_PERIOD);
    }
}

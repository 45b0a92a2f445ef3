//! When requests are sent: the trace's own times (scaled), a Poisson process, or closed loop.

use std::fmt;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::WorkloadError;
use crate::request::Workload;

/// An arrival process, applied to a workload by [`Arrivals::apply`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// The workload's own times, multiplied by `time_scale` (0.5: twice as fast).
    Trace {
        /// Factor on every arrival time (positive).
        time_scale: f64,
    },
    /// A Poisson process: exponential gaps of mean `1 / rate_per_s`, in request order.
    Poisson {
        /// Requests per second (positive).
        rate_per_s: f64,
        /// Seed of the gaps.
        seed: u64,
    },
    /// Closed loop: every arrival 0; drivers keep `concurrency` requests in flight, sending the
    /// next one as each completes.
    ClosedLoop {
        /// Requests in flight (at least 1).
        concurrency: u32,
    },
}

fn spec(s: &str, why: &str) -> WorkloadError {
    WorkloadError::Spec(format!(
        "arrivals {s:?}: {why} (expected trace, trace:SCALE, poisson:RATE, poisson:RATE:SEED or closed:CONCURRENCY)"
    ))
}

impl Arrivals {
    /// Seed of `poisson:RATE` when none is given.
    pub const DEFAULT_POISSON_SEED: u64 = 0;

    /// Parses `trace`, `trace:0.5`, `poisson:2.5` (requests/s), `poisson:2.5:7` (with a seed;
    /// [`Arrivals::DEFAULT_POISSON_SEED`] otherwise) or `closed:16`.
    pub fn parse(s: &str) -> Result<Self, WorkloadError> {
        let parts: Vec<&str> = s.trim().split(':').collect();
        let positive = |x: &str, what: &str| match x.parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
            _ => Err(spec(s, &format!("{what} {x:?} is not a positive number"))),
        };
        match parts.as_slice() {
            ["trace"] => Ok(Arrivals::Trace { time_scale: 1.0 }),
            ["trace", scale] => Ok(Arrivals::Trace {
                time_scale: positive(scale, "time scale")?,
            }),
            ["poisson", rate] | ["poisson", rate, _] => {
                let seed = match parts.get(2) {
                    Some(x) => x
                        .parse()
                        .map_err(|_| spec(s, &format!("seed {x:?} is not a whole number")))?,
                    None => Arrivals::DEFAULT_POISSON_SEED,
                };
                Ok(Arrivals::Poisson {
                    rate_per_s: positive(rate, "rate")?,
                    seed,
                })
            }
            ["closed", c] => match c.parse::<u32>() {
                Ok(concurrency) if concurrency > 0 => Ok(Arrivals::ClosedLoop { concurrency }),
                _ => Err(spec(
                    s,
                    &format!("concurrency {c:?} is not a whole number above 0"),
                )),
            },
            _ => Err(spec(s, "unknown form")),
        }
    }

    /// Rewrites every `arrival_ms` of `w` (then sorts the requests by it, stably). Poisson
    /// sends the first request at 0 and each next one an exponential gap later, in the
    /// workload's order.
    pub fn apply(&self, w: &mut Workload) {
        match *self {
            Arrivals::Trace { time_scale } => {
                for r in &mut w.requests {
                    r.arrival_ms *= time_scale;
                }
            }
            Arrivals::Poisson { rate_per_s, seed } => {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut t = 0.0;
                for (i, r) in w.requests.iter_mut().enumerate() {
                    if i > 0 {
                        // Inverse CDF; 1 - u is in (0, 1], so the log is finite.
                        t += -(1.0 - rng.random::<f64>()).ln() / rate_per_s * 1e3;
                    }
                    r.arrival_ms = t;
                }
            }
            Arrivals::ClosedLoop { .. } => {
                for r in &mut w.requests {
                    r.arrival_ms = 0.0;
                }
            }
        }
        w.requests
            .sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    }

    /// The closed loop's concurrency (`None` for open-loop arrivals).
    pub fn concurrency(&self) -> Option<u32> {
        match *self {
            Arrivals::ClosedLoop { concurrency } => Some(concurrency),
            _ => None,
        }
    }
}

impl FromStr for Arrivals {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Arrivals::parse(s)
    }
}

/// The form [`Arrivals::parse`] reads.
impl fmt::Display for Arrivals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Arrivals::Trace { time_scale: 1.0 } => write!(f, "trace"),
            Arrivals::Trace { time_scale } => write!(f, "trace:{time_scale}"),
            Arrivals::Poisson { rate_per_s, seed } => write!(f, "poisson:{rate_per_s}:{seed}"),
            Arrivals::ClosedLoop { concurrency } => write!(f, "closed:{concurrency}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::WorkloadRequest;
    use crate::synthetic;

    #[test]
    fn good_strings_parse_and_print_back() {
        let cases = [
            ("trace", Arrivals::Trace { time_scale: 1.0 }),
            ("trace:0.5", Arrivals::Trace { time_scale: 0.5 }),
            (
                " poisson:2.5 ",
                Arrivals::Poisson {
                    rate_per_s: 2.5,
                    seed: Arrivals::DEFAULT_POISSON_SEED,
                },
            ),
            (
                "poisson:2.5:7",
                Arrivals::Poisson {
                    rate_per_s: 2.5,
                    seed: 7,
                },
            ),
            ("closed:16", Arrivals::ClosedLoop { concurrency: 16 }),
        ];
        for (s, want) in cases {
            let got: Arrivals = s.parse().expect(s);
            assert_eq!(got, want, "{s}");
            assert_eq!(Arrivals::parse(&got.to_string()).expect("round trip"), got);
        }
        assert_eq!(
            Arrivals::parse("closed:16").unwrap().concurrency(),
            Some(16)
        );
        assert_eq!(Arrivals::parse("trace").unwrap().concurrency(), None);
    }

    #[test]
    fn bad_strings_are_refused_with_the_reason() {
        for (s, needle) in [
            ("", "unknown form"),
            ("poisson", "unknown form"),
            ("uniform:3", "unknown form"),
            ("trace:0", "not a positive number"),
            ("trace:-1", "not a positive number"),
            ("trace:fast", "not a positive number"),
            ("poisson:NaN", "not a positive number"),
            ("poisson:inf", "not a positive number"),
            ("poisson:2:x", "seed \"x\""),
            ("poisson:2:3:4", "unknown form"),
            ("closed:0", "above 0"),
            ("closed:2.5", "above 0"),
            ("closed:", "above 0"),
        ] {
            let err = Arrivals::parse(s).expect_err(s);
            assert!(matches!(err, WorkloadError::Spec(_)));
            assert!(err.to_string().contains(needle), "{s}: {err}");
        }
    }

    #[test]
    fn poisson_gaps_average_one_over_the_rate() {
        let mut w = synthetic::humaneval(20_000, 1);
        let order: Vec<_> = w.requests.iter().map(|r| r.hash_ids.clone()).collect();
        Arrivals::parse("poisson:4").unwrap().apply(&mut w);
        let t: Vec<f64> = w.requests.iter().map(|r| r.arrival_ms).collect();
        assert_eq!(t[0], 0.0);
        assert!(t.windows(2).all(|p| p[0] <= p[1]));
        let mean_gap = t[t.len() - 1] / (t.len() - 1) as f64;
        assert!(
            (mean_gap - 250.0).abs() < 250.0 * 0.03,
            "mean gap {mean_gap} ms"
        );
        // Gaps are exponential: about e^-1 of them exceed the mean.
        let long = t.windows(2).filter(|p| p[1] - p[0] > 250.0).count() as f64 / t.len() as f64;
        assert!((long - (-1.0f64).exp()).abs() < 0.02, "{long}");
        // Request order is kept; the seed decides the gaps.
        assert!(
            w.requests
                .iter()
                .zip(&order)
                .all(|(r, ids)| &r.hash_ids == ids)
        );
        let mut again = synthetic::humaneval(20_000, 1);
        Arrivals::parse("poisson:4:0").unwrap().apply(&mut again);
        assert_eq!(again, w);
        Arrivals::parse("poisson:4:1").unwrap().apply(&mut again);
        assert_ne!(again, w);
    }

    #[test]
    fn trace_times_scale_and_closed_loop_zeroes_them() {
        let mut w = synthetic::arxiv(4, 1);
        for (i, r) in w.requests.iter_mut().enumerate() {
            r.arrival_ms = [300.0, 0.0, 100.0, 100.0][i];
        }
        let third = w.requests[2].clone();
        let mut fast = w.clone();
        Arrivals::parse("trace:0.5").unwrap().apply(&mut fast);
        let t: Vec<f64> = fast.requests.iter().map(|r| r.arrival_ms).collect();
        assert_eq!(t, [0.0, 50.0, 50.0, 150.0]);
        // Sorted stably: equal times keep their order.
        assert_eq!(
            fast.requests[1],
            WorkloadRequest {
                arrival_ms: 50.0,
                ..third
            }
        );
        let mut same = w.clone();
        Arrivals::parse("trace").unwrap().apply(&mut same);
        assert_eq!(same.requests[3].arrival_ms, 300.0);
        Arrivals::parse("closed:2").unwrap().apply(&mut w);
        assert!(w.requests.iter().all(|r| r.arrival_ms == 0.0));
    }
}

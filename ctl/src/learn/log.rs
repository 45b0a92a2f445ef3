//! The round log of `dolphinctl learn --log`: a header line (what is being learned, and the
//! fitted table whose clusters every round uses), then one [`Round`] per line. Learning appends
//! each round as it is measured, so an interrupted run resumes from the file: the same
//! clusters, the rounds already measured, and the same random choices after them.
//!
//! A resumed run keeps the log's lines byte for byte (it never writes them again): serde_json
//! reads floats to within a unit in the last place, not always exactly, so a table written
//! again after being read could drift from the one the logged rounds measured. For the same
//! reason a fresh run measures the table as its header line reads back ([`Header::line`],
//! [`Header::from_line`]), so a resumed run uses exactly the clusters the first one did, and
//! the search sees each period's figures as its round line reads back ([`json_stable`]), so a
//! resumed search computes exactly what the interrupted one did.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use dolphin_learn::search::{Evaluator, Period, Round};
use dolphin_router::dolphin::RoutingTable;
use serde::{Deserialize, Serialize};

use super::LearnCmdError as LearnError;

/// The first line of a round log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// What the log is for: split, K, method, workload, SLO, target, search settings. A
    /// resumed run must have the same.
    pub settings: String,
    /// The fitted table (initial bits) whose clusters the rounds measure.
    pub table: RoutingTable,
}

impl Header {
    /// The header as the log's first line, newline included.
    pub fn line(&self) -> Result<String, LearnError> {
        Ok(format!("{}\n", json(self)?))
    }

    /// Reads a header line back (a fresh run measures the table as read back from its line).
    pub fn from_line(line: &str) -> Result<Header, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// What an existing log holds.
#[derive(Debug)]
pub struct Resumed {
    /// Its header.
    pub header: Header,
    /// Its rounds, in order.
    pub rounds: Vec<Round>,
    /// The log's text up to its last whole round, every line ending in a newline: what a
    /// resumed run writes back before appending (a torn last line is dropped).
    pub kept: String,
}

/// Reads `path` if it exists (`None` when it does not, or is empty).
pub fn read(path: &Path) -> Result<Option<Resumed>, LearnError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io(path, source)),
    };
    let bad = |line: usize, reason: String| LearnError::Log {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut lines = text.split_inclusive('\n');
    let Some(first) = lines.next() else {
        return Ok(None);
    };
    let header = Header::from_line(first).map_err(|e| bad(1, format!("header: {e}")))?;
    let mut kept = whole(first);
    let mut rounds = Vec::new();
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            kept.push_str(&whole(line));
            continue;
        }
        match serde_json::from_str::<Round>(line) {
            Ok(r) => {
                rounds.push(r);
                kept.push_str(&whole(line));
            }
            // A line cut short by an interruption ends the log: one without its newline (the
            // file's last), or one whose JSON ends early.
            Err(e) if e.is_eof() || !line.ends_with('\n') => break,
            Err(e) => return Err(bad(i + 2, e.to_string())),
        }
    }
    Ok(Some(Resumed {
        header,
        rounds,
        kept,
    }))
}

/// `line` ending in exactly one newline.
fn whole(line: &str) -> String {
    format!("{}\n", line.strip_suffix('\n').unwrap_or(line))
}

/// Appends lines to a round log.
#[derive(Debug)]
pub struct Writer {
    path: PathBuf,
    file: File,
}

impl Writer {
    /// (Re)writes the log at `path` as `text` (a new log's header line, or what
    /// [`Resumed::kept`] holds) and returns a writer appending after it.
    pub fn create(path: &Path, text: &str) -> Result<Self, LearnError> {
        let mut file = File::create(path).map_err(|e| io(path, e))?;
        file.write_all(text.as_bytes()).map_err(|e| io(path, e))?;
        Ok(Writer {
            path: path.to_owned(),
            file,
        })
    }

    /// Appends `round` as one line, in one write (an interruption leaves at most a torn last
    /// line, which [`read`] drops).
    pub fn append(&mut self, round: &Round) -> Result<(), LearnError> {
        self.file
            .write_all(format!("{}\n", json(round)?).as_bytes())
            .map_err(|e| io(&self.path, e))
    }
}

/// Measures with the inner evaluator, handing the search each period's figures as its round
/// line reads them back, so a search resumed from the log computes what this one did.
pub struct AsLogged<'a>(pub &'a mut dyn Evaluator);

impl Evaluator for AsLogged<'_> {
    fn evaluate(&mut self, bits: &[u8]) -> Result<Period, dolphin_learn::LearnError> {
        let mut p = self.0.evaluate(bits)?;
        for x in [&mut p.attainment, &mut p.p90_ttft_ms, &mut p.p90_tpot_ms] {
            *x = json_stable(*x);
        }
        Ok(p)
    }
}

/// `x`, or a float a few units in the last place from it, that reads back from JSON exactly.
/// Non-finite values are returned as they are (JSON has none).
pub fn json_stable(mut x: f64) -> f64 {
    for _ in 0..32 {
        let back = serde_json::to_string(&x)
            .ok()
            .and_then(|s| serde_json::from_str::<f64>(&s).ok());
        match back {
            Some(b) if b.to_bits() != x.to_bits() => x = b,
            _ => break,
        }
    }
    x
}

fn json<T: Serialize>(v: &T) -> Result<String, LearnError> {
    serde_json::to_string(v)
        .map_err(|e| LearnError::Learn(dolphin_learn::LearnError::Invalid(e.to_string())))
}

fn io(path: &Path, source: std::io::Error) -> LearnError {
    LearnError::Io {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_floats_read_back_exactly() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut values = vec![0.9833333333333333, 26.836459823999576, 0.0, 1.0];
        for n in 1..200u32 {
            for m in 0..=n {
                values.push(f64::from(m) / f64::from(n));
            }
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            values.push(f64::from_bits(state >> 12 | 0x3ff0_0000_0000_0000) * f64::from(n));
        }
        for v in values {
            let s = json_stable(v);
            let back: f64 = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
            assert_eq!(back.to_bits(), s.to_bits(), "{v} -> {s}");
            assert!((s - v).abs() <= 1e-12 * v.abs(), "{v} -> {s}");
        }
        assert!(json_stable(f64::NAN).is_nan());
    }
}

//! Reading the router's request log (written by `dolphin_router::request_log`).

use std::io::BufRead;
use std::path::Path;

use dolphin_router::dolphin::admission::AdmissionRecord;
use dolphin_router::policy::{Decision, Features, PrefillPath};
use serde::{Deserialize, Serialize};

use crate::error::LearnError;

/// The fields of a request-log line that learning uses (others are ignored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    /// The four routing features.
    pub features: Features,
    /// The admission sketch (absent in logs written before the classifier existed).
    #[serde(default)]
    pub admission: Option<AdmissionRecord>,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// How it ended ("ok", "cancelled", "error_...").
    pub outcome: String,
    /// The router's decision.
    #[serde(default)]
    pub decision: Option<Decision>,
    /// The prefill path the decode worker really took (absent in logs written before it was
    /// reported: then the decision's).
    #[serde(default)]
    pub path: Option<PrefillPath>,
    /// Whether it met its SLO.
    #[serde(default)]
    pub slo_met: Option<bool>,
}

impl LogRecord {
    /// Whether the request finished normally (its output length is its real length).
    pub fn ok(&self) -> bool {
        self.outcome == "ok"
    }

    /// The prefill path really taken: as reported, else the decision's (`None`: neither known).
    pub fn path_taken(&self) -> Option<PrefillPath> {
        self.path.or(self.decision.map(PrefillPath::of))
    }
}

/// A parsed log.
#[derive(Clone, Debug, Default)]
pub struct RequestLog {
    /// Parsed records, in file order.
    pub records: Vec<LogRecord>,
    /// Lines that did not parse (skipped).
    pub bad_lines: usize,
}

/// Parses JSON lines; blank lines are skipped, unparsable ones counted.
pub fn parse(reader: impl BufRead) -> std::io::Result<RequestLog> {
    let mut log = RequestLog::default();
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<LogRecord>(&line) {
            Ok(r) => log.records.push(r),
            Err(_) => log.bad_lines += 1,
        }
    }
    Ok(log)
}

/// Reads a log file.
pub fn read(path: &Path) -> Result<RequestLog, LearnError> {
    let io = |source| LearnError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    parse(std::io::BufReader::new(file)).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_router_lines_and_skips_garbage() {
        let line = r#"{"ts_ms":1,"request_id":"r","api":"http","policy":"dolphin","features":{"isl":10,"eff_isl_prefill":10,"eff_isl_decode":4,"output_len_hint":8},"decision":"local","cluster":2,"table_version":"v1","output_class":"short","admission":{"max_tokens":8,"prefix_hash":42,"head_hashes":[1,2]},"decode_worker":"d","prefill_worker":null,"fell_back":false,"retries":0,"ttft_ms":1.0,"tpot_ms":0.5,"e2e_ms":5.0,"prompt_tokens":10,"completion_tokens":8,"cached_tokens":6,"outcome":"ok","slo_met":true}"#;
        let text = format!("{line}\n\nnot json\n{line}\n");
        let log = parse(text.as_bytes()).expect("parse");
        assert_eq!((log.records.len(), log.bad_lines), (2, 1));
        let r = &log.records[0];
        assert!(r.ok());
        // A log written before paths were reported: the decision's.
        assert_eq!(r.path_taken(), Some(PrefillPath::Local));
        assert_eq!(
            r.admission.as_ref().expect("admission").head_hashes,
            vec![1, 2]
        );
        assert_eq!(r.decision, Some(Decision::Local));
        assert_eq!(r.features.eff_isl_decode, 4);
        assert!(read(Path::new("/nonexistent/log.jsonl")).is_err());
    }
}

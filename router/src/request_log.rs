//! The request log: one JSON line per finished request, for learning and analysis.
//!
//! Requests hand their record to a bounded channel and move on; a background task writes the
//! lines. When the writer falls behind, records are dropped and counted rather than slowing a
//! request down.

use std::path::{Path, PathBuf};

use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::dolphin::admission::AdmissionRecord;
use crate::metrics as m;
use crate::policy::{Decision, Features, PrefillPath};

/// Records waiting for the writer before new ones are dropped.
const CHANNEL_CAPACITY: usize = 8192;

/// One finished request.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RequestRecord {
    /// Unix time the request arrived, in milliseconds.
    pub ts_ms: u64,
    /// The request id.
    pub request_id: String,
    /// "http" or "grpc".
    pub api: &'static str,
    /// Name of the policy that decided (or "forced" when the client forced the path).
    pub policy: &'static str,
    /// The request's features.
    pub features: Features,
    /// The router's decision.
    pub decision: Decision,
    /// The prefill path the decode worker really took (differs from `decision` when it held
    /// the prompt or a remote prefill failed).
    pub path: PrefillPath,
    /// Routing-table cluster of the request (-1: the policy uses no table).
    pub cluster: i32,
    /// Version of the routing table that decided (`None`: no table decided).
    pub table_version: Option<String>,
    /// The output class the classifier predicted ("short", "medium", "long").
    pub output_class: &'static str,
    /// What was known at admission: the output classifier's training input.
    pub admission: AdmissionRecord,
    /// The decode worker that served it (empty when none was reached).
    pub decode_worker: String,
    /// The prefill worker of a remote request.
    pub prefill_worker: Option<String>,
    /// The decode worker fell back to local prefill.
    pub fell_back: bool,
    /// Decode calls retried on another worker.
    pub retries: u32,
    /// Moves to another decode worker after the streaming one failed mid-stream.
    #[serde(skip_serializing_if = "is_zero")]
    pub migrations: u32,
    /// Time to first token, in milliseconds.
    pub ttft_ms: Option<f64>,
    /// Mean time per output token after the first, in milliseconds.
    pub tpot_ms: Option<f64>,
    /// End-to-end time, in milliseconds.
    pub e2e_ms: f64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Tokens streamed back.
    pub completion_tokens: u32,
    /// Prompt tokens served from a prefix cache, as the worker reported.
    pub cached_tokens: u32,
    /// On a model group: completion tokens by model, as the decode worker reported them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_model: Vec<ModelTokensRecord>,
    /// On a model group: handoffs between models.
    #[serde(skip_serializing_if = "is_zero")]
    pub handoffs: u32,
    /// On a model group: the handoff algorithm the request ran.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub handoff_algorithm: String,
    /// How it ended ("ok", "cancelled", "error_...").
    pub outcome: &'static str,
    /// Whether the request met its SLO (`None`: it carried none).
    pub slo_met: Option<bool>,
}

/// Tokens one model of a group wrote for a request.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ModelTokensRecord {
    /// The subserver.
    pub model: String,
    /// Completion tokens it wrote.
    pub tokens: u32,
}

impl From<&dolphin_proto::v1::ModelUsage> for ModelTokensRecord {
    fn from(m: &dolphin_proto::v1::ModelUsage) -> Self {
        Self {
            model: m.model.clone(),
            tokens: m.completion_tokens,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Handle for writing records; cheap to clone.
#[derive(Clone, Debug)]
pub struct RequestLog {
    tx: Option<mpsc::Sender<RequestRecord>>,
}

/// The log file could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot open request log {path}")]
pub struct RequestLogError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

impl RequestLog {
    /// A log that records nothing.
    pub fn disabled() -> Self {
        Self { tx: None }
    }

    /// Opens (appends to) `path` and spawns the writer task, which ends once every handle is gone.
    pub async fn open(path: &Path) -> Result<Self, RequestLogError> {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await
            .map_err(|source| RequestLogError {
                path: path.to_path_buf(),
                source,
            })?;
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        tokio::spawn(write_loop(file, rx, path.to_path_buf()));
        Ok(Self { tx: Some(tx) })
    }

    /// Whether records go anywhere.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a record; never waits.
    pub fn record(&self, rec: RequestRecord) {
        if let Some(tx) = &self.tx
            && tx.try_send(rec).is_err()
        {
            metrics::counter!(m::REQUEST_LOG_DROPPED_TOTAL).increment(1);
        }
    }
}

async fn write_loop(file: tokio::fs::File, mut rx: mpsc::Receiver<RequestRecord>, path: PathBuf) {
    let mut out = tokio::io::BufWriter::new(file);
    let mut line = Vec::with_capacity(512);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        // Write everything queued, then flush once: lines reach the file within one batch.
        while let Some(rec) = next {
            line.clear();
            if serde_json::to_writer(&mut line, &rec).is_ok() {
                line.push(b'\n');
                if let Err(e) = out.write_all(&line).await {
                    tracing::error!(path = %path.display(), error = %e, "request log write failed");
                }
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = out.flush().await {
            tracing::error!(path = %path.display(), error = %e, "request log flush failed");
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The current time as RFC 3339 (UTC, seconds).
pub fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Unix seconds as RFC 3339 (UTC), by the days-to-civil algorithm (no date crate needed).
pub fn rfc3339(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str) -> RequestRecord {
        RequestRecord {
            ts_ms: 1,
            request_id: id.into(),
            api: "http",
            policy: "threshold",
            features: Features {
                isl: 10,
                eff_isl_prefill: 10,
                eff_isl_decode: 4,
                output_len_hint: 8,
            },
            decision: Decision::Local,
            cluster: -1,
            table_version: None,
            output_class: "short",
            admission: AdmissionRecord {
                max_tokens: 8,
                prefix_hash: 42,
                head_hashes: vec![1, 2],
            },
            decode_worker: "decode-1".into(),
            prefill_worker: None,
            fell_back: false,
            path: PrefillPath::Local,
            retries: 0,
            migrations: 0,
            ttft_ms: Some(1.5),
            tpot_ms: Some(0.5),
            e2e_ms: 5.0,
            prompt_tokens: 10,
            completion_tokens: 8,
            cached_tokens: 6,
            by_model: Vec::new(),
            handoffs: 0,
            handoff_algorithm: String::new(),
            outcome: "ok",
            slo_met: None,
        }
    }

    #[tokio::test]
    async fn writes_json_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log.jsonl");
        let log = RequestLog::open(&path).await.expect("open");
        log.record(rec("a"));
        log.record(rec("b"));
        drop(log);
        // The writer flushes after each batch; poll until both lines are there.
        let mut lines = Vec::new();
        for _ in 0..500 {
            let text = tokio::fs::read_to_string(&path).await.unwrap_or_default();
            lines = text.lines().map(str::to_owned).collect::<Vec<_>>();
            if lines.len() == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(lines.len(), 2);
        let v: serde_json::Value = serde_json::from_str(&lines[0]).expect("json");
        assert_eq!(v["request_id"], "a");
        assert_eq!(v["cluster"], -1);
        assert_eq!(v["decision"], "local");
        assert_eq!(v["path"], "local");
        assert_eq!(v["features"]["eff_isl_decode"], 4);
        assert_eq!(v["prefill_worker"], serde_json::Value::Null);
        assert_eq!(v["table_version"], serde_json::Value::Null);
        assert_eq!(v["admission"]["head_hashes"][1], 2);
        assert_eq!(v["output_class"], "short");
    }

    #[tokio::test]
    async fn open_failure_names_the_path() {
        let err = RequestLog::open(Path::new("/nonexistent-dir/x.jsonl"))
            .await
            .expect_err("must fail");
        assert!(err.to_string().contains("/nonexistent-dir/x.jsonl"));
    }
}

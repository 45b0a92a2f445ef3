//! The `DOLPHIN_READY {json}` line every Dolphin process prints on stdout once it has bound its
//! sockets (see `docs/dev/contracts.md`). Parsing it is how dolphinctl and the end-to-end tests
//! learn the addresses of processes started with port 0.

use serde::{Deserialize, Serialize};

/// The prefix of the readiness line, followed by one space and a JSON object.
pub const READY_PREFIX: &str = "DOLPHIN_READY";

/// What a process announces when it is ready. Fields a role does not have are `None`; unknown
/// fields are kept in `other`, so processes may announce more without breaking readers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyInfo {
    /// "prefill", "decode", "router" (or "cluster" for `dolphinctl up` itself).
    pub role: String,
    /// Worker id (workers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// gRPC listen address, "127.0.0.1:port" without a scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_addr: Option<String>,
    /// KV transfer listener (decode workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_addr: Option<String>,
    /// OpenAI-compatible HTTP listener (router).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_addr: Option<String>,
    /// `RouterAdmin` listener (router).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_addr: Option<String>,
    /// Prometheus listener, when the process serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
    /// Every other field, as announced (`dolphinctl up`'s `processes`, a future field).
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// Why a line that starts with [`READY_PREFIX`] could not be read.
#[derive(Debug, thiserror::Error)]
#[error("malformed {READY_PREFIX} line {line:?}")]
pub struct ReadyParseError {
    /// The offending line.
    pub line: String,
    /// The JSON error.
    #[source]
    pub source: serde_json::Error,
}

/// Parses one stdout line: `Ok(None)` when it is not a readiness line (ordinary output),
/// `Ok(Some(info))` when it is, and an error when it claims to be one but its JSON is bad.
pub fn parse_ready_line(line: &str) -> Result<Option<ReadyInfo>, ReadyParseError> {
    let line = line.trim_end();
    let Some(rest) = line.strip_prefix(READY_PREFIX) else {
        return Ok(None);
    };
    // "DOLPHIN_READYX" is not the marker: the prefix must end at whitespace.
    if !rest.starts_with(char::is_whitespace) {
        return Ok(None);
    }
    serde_json::from_str(rest.trim_start())
        .map(Some)
        .map_err(|source| ReadyParseError {
            line: line.to_owned(),
            source,
        })
}

/// Formats a readiness line (used by `dolphinctl up` to announce the whole cluster).
pub fn format_ready_line(json: &serde_json::Value) -> String {
    format!("{READY_PREFIX} {json}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_decode_worker_line() {
        let line = r#"DOLPHIN_READY {"role":"decode","id":"decode-ab12cd34","grpc_addr":"127.0.0.1:41234","kv_addr":"127.0.0.1:41235"}"#;
        let info = parse_ready_line(line).unwrap().unwrap();
        assert_eq!(info.role, "decode");
        assert_eq!(info.id.as_deref(), Some("decode-ab12cd34"));
        assert_eq!(info.grpc_addr.as_deref(), Some("127.0.0.1:41234"));
        assert_eq!(info.kv_addr.as_deref(), Some("127.0.0.1:41235"));
        assert_eq!(info.http_addr, None);
    }

    #[test]
    fn parses_a_router_line_with_unknown_fields_and_crlf() {
        let line = "DOLPHIN_READY {\"role\":\"router\",\"http_addr\":\"127.0.0.1:8000\",\"grpc_addr\":\"127.0.0.1:50051\",\"future\":1}\r\n";
        let info = parse_ready_line(line).unwrap().unwrap();
        assert_eq!(info.role, "router");
        assert_eq!(info.http_addr.as_deref(), Some("127.0.0.1:8000"));
        assert_eq!(info.other.get("future"), Some(&serde_json::json!(1)));
    }

    #[test]
    fn other_lines_are_not_ready_lines() {
        assert_eq!(parse_ready_line("2025-01-01 INFO starting").unwrap(), None);
        assert_eq!(parse_ready_line("DOLPHIN_READYNESS {}").unwrap(), None);
        assert_eq!(parse_ready_line("").unwrap(), None);
    }

    #[test]
    fn bad_json_is_an_error() {
        let err = parse_ready_line("DOLPHIN_READY {role:").unwrap_err();
        assert!(err.to_string().contains("malformed"));
    }

    #[test]
    fn format_round_trips() {
        let line = format_ready_line(&serde_json::json!({"role": "cluster", "grpc_addr": "a:1"}));
        let info = parse_ready_line(&line).unwrap().unwrap();
        assert_eq!(info.role, "cluster");
        assert_eq!(info.grpc_addr.as_deref(), Some("a:1"));
    }
}

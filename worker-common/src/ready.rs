//! The `DOLPHIN_READY` line a worker prints on stdout once it serves: tests and dolphinctl parse
//! it to learn the addresses the process bound (ports may be 0 on the command line).

use std::io::Write;

use dolphin_cluster::{Role, WorkerId};
use serde::Serialize;

/// Prefix of the ready line; the rest of the line is one JSON object.
pub const READY_PREFIX: &str = "DOLPHIN_READY";

/// The JSON object after [`READY_PREFIX`], in the field order the contract shows.
#[derive(Debug, Serialize)]
struct ReadyFields<'a> {
    role: &'a str,
    id: &'a str,
    grpc_addr: &'a str,
    /// Only decode workers have a KV transfer listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_addr: Option<&'a str>,
}

/// Formats the ready line (without a trailing newline).
pub fn ready_line(role: Role, id: &WorkerId, grpc_addr: &str, kv_addr: Option<&str>) -> String {
    let fields = ReadyFields {
        role: role.as_str(),
        id: &id.0,
        grpc_addr,
        kv_addr,
    };
    // Serializing a struct of strings cannot fail.
    let json = serde_json::to_string(&fields).unwrap_or_default();
    format!("{READY_PREFIX} {json}")
}

/// Prints the ready line on stdout and flushes it at once: the reader waits for it, and stdout is
/// block-buffered when it is a pipe. The addresses are the published ones (advertise addresses
/// where given), so the reader connects where the cluster does.
pub fn print_ready(
    role: Role,
    id: &WorkerId,
    grpc_addr: &str,
    kv_addr: Option<&str>,
) -> std::io::Result<()> {
    let line = ready_line(role, id, grpc_addr, kv_addr);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_line_matches_the_contract() {
        let line = ready_line(
            Role::Decode,
            &WorkerId("decode-ab12cd34".into()),
            "127.0.0.1:41234",
            Some("127.0.0.1:41235"),
        );
        assert_eq!(
            line,
            r#"DOLPHIN_READY {"role":"decode","id":"decode-ab12cd34","grpc_addr":"127.0.0.1:41234","kv_addr":"127.0.0.1:41235"}"#
        );
    }

    #[test]
    fn prefill_line_has_no_kv_addr() {
        let line = ready_line(
            Role::Prefill,
            &WorkerId("prefill-00000001".into()),
            "127.0.0.1:5000",
            None,
        );
        let json = line.strip_prefix("DOLPHIN_READY ").expect("prefix");
        let value: serde_json::Value = serde_json::from_str(json).expect("json");
        assert_eq!(value["role"], "prefill");
        assert_eq!(value["id"], "prefill-00000001");
        assert_eq!(value["grpc_addr"], "127.0.0.1:5000");
        assert!(value.get("kv_addr").is_none());
    }
}

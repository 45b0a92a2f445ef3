//! What `dolphinctl up` prints once the cluster is ready: a human summary (endpoints, processes,
//! logs, ready-to-run commands) and one machine-readable `DOLPHIN_READY` line for scripts and
//! tests.

use std::path::PathBuf;

use serde::Serialize;

use crate::ready::format_ready_line;

/// One process of the local cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberSummary {
    /// dolphinctl's name for it ("router", "prefill-0", "decode-1").
    pub name: String,
    /// "router", "prefill" or "decode".
    pub role: String,
    /// Worker id, when it has one.
    pub id: Option<String>,
    /// Its pid (also its process group id).
    pub pid: u32,
    /// gRPC address.
    pub grpc_addr: Option<String>,
    /// KV transfer address (decode workers).
    pub kv_addr: Option<String>,
    /// HTTP address (router).
    pub http_addr: Option<String>,
    /// Admin gRPC address (router).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_addr: Option<String>,
    /// `/metrics` and `/health` (router).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
    /// Its log file.
    pub log: Option<PathBuf>,
}

/// The whole local cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClusterSummary {
    /// Router's OpenAI-compatible HTTP address.
    pub http_addr: String,
    /// Router's gRPC address.
    pub grpc_addr: String,
    /// Router's admin gRPC address (`RouterAdmin`).
    pub admin_addr: String,
    /// Router's `/metrics` and `/health` address.
    pub metrics_addr: String,
    /// The model served.
    pub model: String,
    /// "static" or "etcd <url>".
    pub discovery: String,
    /// Where the logs are.
    pub log_dir: PathBuf,
    /// Every process, router first.
    pub processes: Vec<MemberSummary>,
}

impl ClusterSummary {
    /// The human-readable summary, ending with a newline.
    pub fn render(&self) -> String {
        let prefill = self.count("prefill");
        let decode = self.count("decode");
        let mut out = format!(
            "Dolphin local cluster is up: {prefill} prefill + {decode} decode worker(s), {} discovery, model {:?}\n\n",
            self.discovery, self.model
        );
        out.push_str(&format!(
            "  OpenAI HTTP  http://{}/v1  (completions, chat/completions, models)\n  gRPC         {}  (dolphin.v1.Inference)\n  admin gRPC   {}  (RouterAdmin: dolphinctl --router-admin)\n  metrics      http://{}/metrics  (and /health)\n\n",
            self.http_addr, self.grpc_addr, self.admin_addr, self.metrics_addr
        ));
        for p in &self.processes {
            let mut addrs = Vec::new();
            if let Some(a) = &p.grpc_addr {
                addrs.push(format!("grpc {a}"));
            }
            if let Some(a) = &p.kv_addr {
                addrs.push(format!("kv {a}"));
            }
            if let Some(a) = &p.http_addr {
                addrs.push(format!("http {a}"));
            }
            out.push_str(&format!(
                "  {:<10} {:<18} pid {:<7} {}\n",
                p.name,
                p.id.as_deref().unwrap_or("-"),
                p.pid,
                addrs.join("  ")
            ));
        }
        out.push_str(&format!("\nLogs: {}\n\nTry:\n", self.log_dir.display()));
        out.push_str(&format!(
            "  curl -sN http://{}/v1/completions -H 'content-type: application/json' \\\n    -d '{{\"model\": \"{}\", \"prompt\": \"Hello, Dolphin!\", \"max_tokens\": 32, \"stream\": true}}'\n",
            self.http_addr, self.model
        ));
        out.push_str(&format!(
            "  dolphinctl request --router-grpc http://{} --prompt 'Hello, Dolphin!'\n",
            self.grpc_addr
        ));
        out.push_str(&format!(
            "  dolphinctl workers --router-admin http://{}\n\nCtrl-C stops the cluster.\n",
            self.admin_addr
        ));
        out
    }

    /// The `DOLPHIN_READY {"role":"cluster",...}` line.
    pub fn ready_line(&self) -> String {
        let mut json = serde_json::to_value(self).unwrap_or_default();
        if let Some(obj) = json.as_object_mut() {
            obj.insert("role".to_owned(), "cluster".into());
        }
        format_ready_line(&json)
    }

    fn count(&self, role: &str) -> usize {
        self.processes.iter().filter(|p| p.role == role).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ready::parse_ready_line;

    fn summary() -> ClusterSummary {
        ClusterSummary {
            http_addr: "127.0.0.1:8000".to_owned(),
            grpc_addr: "127.0.0.1:50051".to_owned(),
            admin_addr: "127.0.0.1:50052".to_owned(),
            metrics_addr: "127.0.0.1:9091".to_owned(),
            model: "sim-model".to_owned(),
            discovery: "static".to_owned(),
            log_dir: PathBuf::from("/tmp/logs"),
            processes: vec![
                MemberSummary {
                    name: "router".to_owned(),
                    role: "router".to_owned(),
                    id: None,
                    pid: 10,
                    grpc_addr: Some("127.0.0.1:50051".to_owned()),
                    kv_addr: None,
                    http_addr: Some("127.0.0.1:8000".to_owned()),
                    admin_addr: Some("127.0.0.1:50052".to_owned()),
                    metrics_addr: Some("127.0.0.1:9091".to_owned()),
                    log: Some(PathBuf::from("/tmp/logs/router.log")),
                },
                MemberSummary {
                    name: "decode-0".to_owned(),
                    role: "decode".to_owned(),
                    id: Some("decode-ab12cd34".to_owned()),
                    pid: 11,
                    grpc_addr: Some("127.0.0.1:4000".to_owned()),
                    kv_addr: Some("127.0.0.1:4001".to_owned()),
                    http_addr: None,
                    admin_addr: None,
                    metrics_addr: None,
                    log: None,
                },
            ],
        }
    }

    #[test]
    fn render_shows_endpoints_processes_and_a_curl() {
        let text = summary().render();
        assert!(text.contains("0 prefill + 1 decode"), "{text}");
        assert!(text.contains("http://127.0.0.1:8000/v1"));
        assert!(text.contains("decode-ab12cd34"));
        assert!(text.contains("kv 127.0.0.1:4001"));
        assert!(text.contains("curl -sN http://127.0.0.1:8000/v1/completions"));
        assert!(text.contains("\"model\": \"sim-model\""));
    }

    #[test]
    fn ready_line_parses_and_lists_pids() {
        let line = summary().ready_line();
        let info = parse_ready_line(&line).unwrap().unwrap();
        assert_eq!(info.role, "cluster");
        assert_eq!(info.http_addr.as_deref(), Some("127.0.0.1:8000"));
        let json: serde_json::Value =
            serde_json::from_str(line.strip_prefix("DOLPHIN_READY ").unwrap()).unwrap();
        let pids: Vec<u64> = json["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(pids, [10, 11]);
    }
}

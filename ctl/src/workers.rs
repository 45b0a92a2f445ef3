//! `dolphinctl workers`: the router's view of the cluster (RouterAdmin.ListWorkers).

use dolphin_proto::v1::{ListWorkersRequest, Role, WorkerStatus};
use serde::Serialize;

use crate::client;
use crate::error::CtlError;

/// One worker as printed (table row or JSON object).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerRow {
    /// Worker id.
    pub id: String,
    /// "prefill", "decode" or "unspecified".
    pub role: String,
    /// gRPC address.
    pub address: String,
    /// KV transfer address (decode workers).
    pub kv_address: String,
    /// Requests running.
    pub running: u32,
    /// Requests waiting.
    pub waiting: u32,
    /// Free KV blocks.
    pub free_blocks: u32,
    /// Total KV blocks.
    pub total_blocks: u32,
    /// Blocks the router's prefix index holds for this worker.
    pub indexed_blocks: u64,
    /// Whether the worker's event stream is live.
    pub events_live: bool,
    /// Whether the worker is draining.
    pub draining: bool,
    /// Build version the worker published.
    pub version: String,
    /// KV layout the worker published (prefill and decode pair only when equal).
    pub kv_layout: String,
}

impl From<&WorkerStatus> for WorkerRow {
    fn from(w: &WorkerStatus) -> Self {
        Self {
            id: w.worker_id.clone(),
            role: role_name(w.role).to_owned(),
            address: w.grpc_addr.clone(),
            kv_address: w.kv_addr.clone(),
            running: w.running,
            waiting: w.waiting,
            free_blocks: w.free_blocks,
            total_blocks: w.total_blocks,
            indexed_blocks: w.indexed_blocks,
            events_live: w.events_live,
            draining: w.draining,
            version: w.version.clone(),
            kv_layout: w.kv_layout.clone(),
        }
    }
}

/// The short name of a wire role.
pub fn role_name(role: i32) -> &'static str {
    match Role::try_from(role) {
        Ok(Role::Prefill) => "prefill",
        Ok(Role::Decode) => "decode",
        _ => "unspecified",
    }
}

/// Asks the router at `url` for its workers, sorted by role then id.
pub async fn list_workers(url: &str) -> Result<Vec<WorkerRow>, CtlError> {
    let mut admin = client::admin(url).await?;
    let resp = admin
        .list_workers(ListWorkersRequest {})
        .await
        .map_err(|s| CtlError::rpc("ListWorkers", s))?
        .into_inner();
    let mut rows: Vec<WorkerRow> = resp.workers.iter().map(WorkerRow::from).collect();
    rows.sort_by(|a, b| (&a.role, &a.id).cmp(&(&b.role, &b.id)));
    Ok(rows)
}

/// Renders rows as an aligned text table with a header.
pub fn render_table(rows: &[WorkerRow]) -> String {
    const HEADER: [&str; 10] = [
        "ID",
        "ROLE",
        "ADDRESS",
        "RUNNING",
        "WAITING",
        "FREE/TOTAL",
        "INDEXED",
        "EVENTS",
        "DRAINING",
        "VERSION",
    ];
    let cells: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            [
                r.id.clone(),
                r.role.clone(),
                r.address.clone(),
                r.running.to_string(),
                r.waiting.to_string(),
                format!("{}/{}", r.free_blocks, r.total_blocks),
                r.indexed_blocks.to_string(),
                if r.events_live { "live" } else { "stale" }.to_owned(),
                if r.draining { "yes" } else { "no" }.to_owned(),
                r.version.clone(),
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut push_row = |row: &[&str]| {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    };
    push_row(&HEADER);
    for row in &cells {
        push_row(&row.each_ref().map(String::as_str));
    }
    if rows.is_empty() {
        out.push_str("(no workers)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: &str, role: Role) -> WorkerStatus {
        WorkerStatus {
            worker_id: id.to_owned(),
            role: role as i32,
            grpc_addr: "127.0.0.1:4000".to_owned(),
            kv_addr: String::new(),
            running: 3,
            waiting: 1,
            free_blocks: 90,
            total_blocks: 128,
            indexed_blocks: 38,
            events_live: true,
            draining: false,
            version: "0.1.0".to_owned(),
            kv_layout: "sim/bytes_per_token=128".to_owned(),
        }
    }

    #[test]
    fn table_has_a_header_and_aligned_rows() {
        let rows: Vec<WorkerRow> = [
            status("decode-0000aaaa", Role::Decode),
            status("prefill-1", Role::Prefill),
        ]
        .iter()
        .map(WorkerRow::from)
        .collect();
        let table = render_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("ID "));
        assert!(lines[1].contains("decode") && lines[1].contains("90/128"));
        assert!(lines[2].contains("prefill") && lines[2].contains("live"));
        // Columns line up: ROLE starts at the same offset on every line.
        let col = lines[0].find("ROLE").unwrap();
        assert_eq!(&lines[1][col..col + 6], "decode");
        assert_eq!(&lines[2][col..col + 7], "prefill");
    }

    #[test]
    fn empty_table_says_so() {
        assert!(render_table(&[]).contains("(no workers)"));
    }

    #[test]
    fn rows_serialize_with_readable_roles() {
        let row = WorkerRow::from(&status("d", Role::Decode));
        let json = serde_json::to_value(&row).unwrap();
        assert_eq!(json["role"], "decode");
        assert_eq!(json["free_blocks"], 90);
        assert_eq!(role_name(99), "unspecified");
    }
}

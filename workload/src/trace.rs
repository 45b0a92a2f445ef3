//! The two production traces (see `shared/traces/README.md`): Mooncake's conversation trace
//! (JSON lines with hash ids, so prefix sharing is known) and Azure's 2023 conversation trace
//! (CSV with wall-clock timestamps and lengths only).

use std::path::Path;

use serde::Deserialize;

use crate::error::WorkloadError;
use crate::request::{RequestKind, Workload, WorkloadRequest};

mod timestamp;

/// Tokens each Mooncake hash id stands for.
pub const MOONCAKE_TOKENS_PER_ID: u32 = 512;

/// One row of the Mooncake trace (other fields are ignored).
#[derive(Deserialize)]
struct MooncakeRow {
    /// ms from the start of the trace.
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

fn read(path: &Path) -> Result<String, WorkloadError> {
    std::fs::read_to_string(path).map_err(|error| WorkloadError::Io {
        path: path.to_path_buf(),
        error,
    })
}

/// The workload's name: the file's stem (`mooncake-conversation`).
fn name_of(path: &Path, fallback: &str) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .map_or_else(|| fallback.to_string(), str::to_string)
}

fn finish(
    path: &Path,
    name: String,
    mut requests: Vec<WorkloadRequest>,
) -> Result<Workload, WorkloadError> {
    if requests.is_empty() {
        return Err(WorkloadError::Empty(format!(
            "{} has no rows",
            path.display()
        )));
    }
    // Stable: rows with the same time keep the file's order.
    requests.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    Ok(Workload {
        name,
        tokens_per_id: MOONCAKE_TOKENS_PER_ID,
        requests,
    })
}

/// Loads a Mooncake trace: one JSON object a line, `{timestamp (ms), input_length,
/// output_length, hash_ids}`, ids of [`MOONCAKE_TOKENS_PER_ID`] tokens. Kind
/// [`RequestKind::Mooncake`]; an `output_length` of 0 becomes 1 (replay generates at least one
/// token). Blank lines are skipped; a row that is not such an object, has an empty prompt, a
/// negative time, or more ids than its prompt needs is an error naming the file and line.
pub fn mooncake(path: &Path) -> Result<Workload, WorkloadError> {
    let text = read(path)?;
    let mut requests = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| WorkloadError::Parse {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        };
        let row: MooncakeRow = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        if row.input_length == 0 {
            return Err(bad("input_length is 0".into()));
        }
        if !(row.timestamp.is_finite() && row.timestamp >= 0.0) {
            return Err(bad(format!("timestamp {} is not a time", row.timestamp)));
        }
        let needed = row.input_length.div_ceil(MOONCAKE_TOKENS_PER_ID) as usize;
        if row.hash_ids.len() > needed {
            return Err(bad(format!(
                "{} hash ids for {} tokens: at most {needed} ids of {MOONCAKE_TOKENS_PER_ID} tokens",
                row.hash_ids.len(),
                row.input_length
            )));
        }
        requests.push(WorkloadRequest {
            arrival_ms: row.timestamp,
            hash_ids: row.hash_ids,
            prompt_len: row.input_length,
            output_len: row.output_length.max(1),
            kind: RequestKind::Mooncake,
        });
    }
    finish(path, name_of(path, "mooncake"), requests)
}

/// Loads an Azure LLM inference trace: CSV with a header naming `TIMESTAMP`, `ContextTokens`
/// and `GeneratedTokens` (in any order), timestamps `YYYY-MM-DD HH:MM:SS.fffffff`. Arrival is
/// ms since the earliest row (the first, in the published traces). The trace says nothing of
/// content, so every prompt gets ids of its own (`ceil(len / 512)` fresh ids: no sharing).
/// Kind [`RequestKind::Azure`]; 0 generated tokens become 1. Bad rows are errors naming the file
/// and line.
pub fn azure(path: &Path) -> Result<Workload, WorkloadError> {
    let text = read(path)?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let bad = |line: usize, reason: String| WorkloadError::Parse {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let Some((h, header)) = lines.next() else {
        return Err(WorkloadError::Empty(format!("{} is empty", path.display())));
    };
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let column = |name: &str| {
        columns
            .iter()
            .position(|c| c.eq_ignore_ascii_case(name))
            .ok_or_else(|| bad(h + 1, format!("header {header:?} has no {name} column")))
    };
    let (c_time, c_in, c_out) = (
        column("TIMESTAMP")?,
        column("ContextTokens")?,
        column("GeneratedTokens")?,
    );
    let mut rows: Vec<(i64, u32, u32)> = Vec::new();
    for (i, line) in lines {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != columns.len() {
            return Err(bad(
                i + 1,
                format!("{} fields, the header has {}", fields.len(), columns.len()),
            ));
        }
        let count = |c: usize, what: &str| {
            fields[c]
                .parse::<u32>()
                .map_err(|e| bad(i + 1, format!("{what} {:?}: {e}", fields[c])))
        };
        let t = timestamp::parse_ns(fields[c_time]).map_err(|e| bad(i + 1, e))?;
        let input = count(c_in, "ContextTokens")?;
        if input == 0 {
            return Err(bad(i + 1, "ContextTokens is 0".into()));
        }
        rows.push((t, input, count(c_out, "GeneratedTokens")?));
    }
    let start = rows.iter().map(|r| r.0).min().unwrap_or(0);
    let mut next_id = 0u64;
    let requests = rows
        .into_iter()
        .map(|(t, input, output)| {
            let n = u64::from(input.div_ceil(MOONCAKE_TOKENS_PER_ID));
            let hash_ids = (next_id..next_id + n).collect();
            next_id += n;
            WorkloadRequest {
                arrival_ms: (t - start) as f64 / 1e6,
                hash_ids,
                prompt_len: input,
                output_len: output.max(1),
                kind: RequestKind::Azure,
            }
        })
        .collect();
    finish(path, name_of(path, "azure"), requests)
}

#[cfg(test)]
mod tests;

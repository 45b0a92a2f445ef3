//! Production traces: the Mooncake family of JSON-lines traces (Mooncake's FAST'25 release:
//! conversation, tool-agent and synthetic traces; Alibaba's Qwen-Bailian traces), with hash ids
//! so prefix sharing is known; and CSV traces with lengths only: Azure's LLM inference traces
//! (2023 and 2024, wall-clock timestamps) and BurstGPT (seconds). See
//! `shared/traces/README.md`.
//!
//! Files are read a line at a time, and a limit stops the reading: the first N rows of a
//! week-long trace (Azure 2024 has tens of millions) load without the rest.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::Deserialize;

use crate::error::WorkloadError;
use crate::request::{RequestKind, Workload, WorkloadRequest};

mod timestamp;

/// Tokens each Mooncake hash id stands for.
pub const MOONCAKE_TOKENS_PER_ID: u32 = 512;

/// A JSON-lines trace of the Mooncake family: one object a line with `timestamp`,
/// `input_length`, `output_length` and `hash_ids` (other fields are ignored). The formats
/// differ in how many tokens an id stands for and in the unit of `timestamp`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct JsonlFormat {
    /// Tokens each hash id stands for.
    pub tokens_per_id: u32,
    /// Milliseconds per unit of `timestamp`.
    pub ms_per_time_unit: f64,
    /// The kind every row becomes.
    pub kind: RequestKind,
}

/// Mooncake's traces: ids of 512 tokens, `timestamp` in ms from the start.
pub const MOONCAKE: JsonlFormat = JsonlFormat {
    tokens_per_id: MOONCAKE_TOKENS_PER_ID,
    ms_per_time_unit: 1.0,
    kind: RequestKind::Mooncake,
};

/// Alibaba's Qwen-Bailian traces (`qwen_*_blksz_16.jsonl`, the KVCache-in-the-wild paper,
/// ATC'25): ids of 16 tokens, `timestamp` in seconds from the start.
pub const BAILIAN: JsonlFormat = JsonlFormat {
    tokens_per_id: 16,
    ms_per_time_unit: 1000.0,
    kind: RequestKind::Bailian,
};

/// One row of a Mooncake-family trace (other fields are ignored).
#[derive(Deserialize)]
struct JsonlRow {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    /// Absent: nothing is known of the content, and the prompt is its own.
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// The file's non-blank lines with their 1-based numbers, a UTF-8 byte order mark dropped.
fn lines(
    path: &Path,
) -> Result<impl Iterator<Item = Result<(usize, String), WorkloadError>>, WorkloadError> {
    let io = |error| WorkloadError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = File::open(path).map_err(io)?;
    let path = path.to_path_buf();
    Ok(BufReader::with_capacity(1 << 20, file)
        .lines()
        .enumerate()
        .map(move |(i, line)| match line {
            Ok(mut line) => {
                if i == 0 && line.starts_with('\u{feff}') {
                    line.drain(..'\u{feff}'.len_utf8());
                }
                Ok((i + 1, line))
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Err(WorkloadError::Parse {
                path: path.clone(),
                line: i + 1,
                reason: "not UTF-8 text".into(),
            }),
            Err(error) => Err(WorkloadError::Io {
                path: path.clone(),
                error,
            }),
        })
        .filter(|l| !matches!(l, Ok((_, text)) if text.trim().is_empty())))
}

/// The next `ceil(prompt_len / tokens_per_id)` ids from `next`: content no other prompt has.
fn fresh_ids(next: &mut u64, prompt_len: u32, tokens_per_id: u32) -> Vec<u64> {
    let first = *next;
    *next = next.saturating_add(u64::from(prompt_len.div_ceil(tokens_per_id)));
    (first..*next).collect()
}

/// The workload of `requests` read from `path`, named by the file's stem
/// (`mooncake-conversation`; `kind`'s name for a path without one), in arrival order.
fn finish(
    path: &Path,
    kind: RequestKind,
    tokens_per_id: u32,
    mut requests: Vec<WorkloadRequest>,
    skipped_rows: usize,
) -> Result<Workload, WorkloadError> {
    if requests.is_empty() {
        let why = match skipped_rows {
            0 => "has no rows".to_string(),
            n => format!("has no rows with a prompt ({n} with an empty one)"),
        };
        return Err(WorkloadError::Empty(format!("{} {why}", path.display())));
    }
    // Stable: rows with the same time keep the file's order.
    requests.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(kind.name())
        .to_string();
    Ok(Workload {
        name,
        tokens_per_id,
        requests,
        skipped_rows,
    })
}

/// Loads a Mooncake trace ([`MOONCAKE`], every row): see [`jsonl`].
pub fn mooncake(path: &Path) -> Result<Workload, WorkloadError> {
    jsonl(path, &MOONCAKE, None)
}

/// Loads a Mooncake-family trace: one JSON object a line, `{timestamp, input_length,
/// output_length, hash_ids}` as `format` reads them, the first `limit` rows (all when `None`).
/// A row without `hash_ids` shares nothing with any other (it gets ids of its own, numbered past
/// the trace's); an `output_length` of 0 becomes 1 (replay generates at least one token). Blank
/// lines are skipped, and so are rows with an empty prompt (counted in
/// [`Workload::skipped_rows`]). A row that is not such an object, has a negative time, or more
/// ids than its prompt needs is an error naming the file and line.
pub fn jsonl(
    path: &Path,
    format: &JsonlFormat,
    limit: Option<usize>,
) -> Result<Workload, WorkloadError> {
    let mut requests = Vec::new();
    let mut skipped = 0;
    for line in lines(path)?.take(limit.unwrap_or(usize::MAX)) {
        let (n, line) = line?;
        let bad = |reason: String| WorkloadError::Parse {
            path: path.to_path_buf(),
            line: n,
            reason,
        };
        let row: JsonlRow = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        if !(row.timestamp.is_finite() && row.timestamp >= 0.0) {
            return Err(bad(format!("timestamp {} is not a time", row.timestamp)));
        }
        if row.input_length == 0 {
            skipped += 1;
            continue;
        }
        let needed = row.input_length.div_ceil(format.tokens_per_id) as usize;
        if row.hash_ids.len() > needed {
            return Err(bad(format!(
                "{} hash ids for {} tokens: at most {needed} ids of {} tokens",
                row.hash_ids.len(),
                row.input_length,
                format.tokens_per_id
            )));
        }
        requests.push(WorkloadRequest {
            arrival_ms: row.timestamp * format.ms_per_time_unit,
            hash_ids: row.hash_ids,
            prompt_len: row.input_length,
            output_len: row.output_length.max(1),
            kind: format.kind,
        });
    }
    // Rows without ids get fresh ones, past every id the trace names, so they share nothing
    // (live replay and the simulator both read sharing from the ids alone).
    let mut next_id = requests
        .iter()
        .flat_map(|r| r.hash_ids.iter().map(|&id| id.saturating_add(1)))
        .max()
        .unwrap_or(0);
    for r in requests.iter_mut().filter(|r| r.hash_ids.is_empty()) {
        r.hash_ids = fresh_ids(&mut next_id, r.prompt_len, format.tokens_per_id);
    }
    finish(path, format.kind, format.tokens_per_id, requests, skipped)
}

/// A CSV trace with lengths only: which columns hold the arrival time and the prompt and
/// output lengths (found by name in the header, in any order; other columns are ignored), and
/// how times are written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CsvFormat {
    /// The arrival time's column.
    pub time: &'static str,
    /// The prompt length's column (tokens).
    pub input: &'static str,
    /// The output length's column (tokens).
    pub output: &'static str,
    /// How the time column is written.
    pub clock: Clock,
    /// The kind every row becomes.
    pub kind: RequestKind,
}

/// How a CSV trace writes arrival times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Wall-clock timestamps, as [`timestamp`] reads them.
    WallClock,
    /// Seconds (a decimal number) from any origin.
    Seconds,
}

/// Azure's LLM inference traces (2023: `AzureLLMInferenceTrace_{conv,code}.csv`; 2024:
/// `..._1week.csv`): `TIMESTAMP`, `ContextTokens`, `GeneratedTokens`.
pub const AZURE: CsvFormat = CsvFormat {
    time: "TIMESTAMP",
    input: "ContextTokens",
    output: "GeneratedTokens",
    clock: Clock::WallClock,
    kind: RequestKind::Azure,
};

/// BurstGPT (`BurstGPT_*.csv`, ChatGPT and GPT-4 usage in Azure OpenAI): `Timestamp` in seconds,
/// `Request tokens`, `Response tokens` (0 for a failed request).
pub const BURSTGPT: CsvFormat = CsvFormat {
    time: "Timestamp",
    input: "Request tokens",
    output: "Response tokens",
    clock: Clock::Seconds,
    kind: RequestKind::Burstgpt,
};

/// Loads an Azure LLM inference trace ([`AZURE`], every row): see [`csv`].
pub fn azure(path: &Path) -> Result<Workload, WorkloadError> {
    csv(path, &AZURE, None)
}

/// Loads the first `limit` rows (all when `None`) of a CSV trace in `format`: a header naming
/// the format's columns, then a row a request, fields optionally quoted. Arrival is ms since
/// the earliest row read. The trace says nothing of content, so every prompt gets ids of its
/// own (`ceil(len / 512)` fresh ids: no sharing). An output of 0 tokens becomes 1; token counts
/// written as whole floats (`374.0`) are read. Rows with an empty prompt (0 tokens) are left
/// out and counted in [`Workload::skipped_rows`]; bad rows are errors naming the file and line.
pub fn csv(
    path: &Path,
    format: &CsvFormat,
    limit: Option<usize>,
) -> Result<Workload, WorkloadError> {
    let bad = |line: usize, reason: String| WorkloadError::Parse {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut lines = lines(path)?;
    let Some(header) = lines.next() else {
        return Err(WorkloadError::Empty(format!("{} is empty", path.display())));
    };
    let (h, header) = header?;
    let columns: Vec<String> = csv_fields(&header)
        .map_err(|e| bad(h, e))?
        .into_iter()
        .map(Cow::into_owned)
        .collect();
    let column = |name: &str| {
        columns
            .iter()
            .position(|c| c.eq_ignore_ascii_case(name))
            .ok_or_else(|| bad(h, format!("header {header:?} has no {name} column")))
    };
    let (c_time, c_in, c_out) = (
        column(format.time)?,
        column(format.input)?,
        column(format.output)?,
    );
    let mut rows: Vec<(i64, u32, u32)> = Vec::new();
    let mut skipped = 0;
    for line in lines.take(limit.unwrap_or(usize::MAX)) {
        let (i, line) = line?;
        let fields = csv_fields(&line).map_err(|e| bad(i, e))?;
        if fields.len() != columns.len() {
            return Err(bad(
                i,
                format!("{} fields, the header has {}", fields.len(), columns.len()),
            ));
        }
        let count = |c: usize, what: &str| {
            token_count(&fields[c]).map_err(|e| bad(i, format!("{what} {:?}: {e}", fields[c])))
        };
        let t = match format.clock {
            Clock::WallClock => timestamp::parse_ns(&fields[c_time]),
            Clock::Seconds => seconds_ns(&fields[c_time]),
        }
        .map_err(|e| bad(i, e))?;
        let input = count(c_in, format.input)?;
        let output = count(c_out, format.output)?;
        if input == 0 {
            skipped += 1;
            continue;
        }
        rows.push((t, input, output));
    }
    let start = rows.iter().map(|r| r.0).min().unwrap_or(0);
    let mut next_id = 0u64;
    let requests = rows
        .into_iter()
        .map(|(t, input, output)| WorkloadRequest {
            arrival_ms: (t - start) as f64 / 1e6,
            hash_ids: fresh_ids(&mut next_id, input, MOONCAKE_TOKENS_PER_ID),
            prompt_len: input,
            output_len: output.max(1),
            kind: format.kind,
        })
        .collect();
    finish(path, format.kind, MOONCAKE_TOKENS_PER_ID, requests, skipped)
}

/// A time in seconds (a decimal number, at least 0) as nanoseconds.
fn seconds_ns(s: &str) -> Result<i64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && (0.0..9.2e9).contains(&x) => Ok((x * 1e9).round() as i64),
        _ => Err(format!("timestamp {s:?} is not a number of seconds")),
    }
}

/// A CSV line's fields, trimmed; a field in double quotes may hold commas and `""` for a quote.
fn csv_fields(line: &str) -> Result<Vec<Cow<'_, str>>, String> {
    let mut fields = Vec::new();
    let mut rest = line;
    loop {
        let field = rest.trim_start();
        let Some(quoted) = field.strip_prefix('"') else {
            let (f, next) = match field.split_once(',') {
                Some((f, next)) => (f, Some(next)),
                None => (field, None),
            };
            fields.push(Cow::Borrowed(f.trim()));
            match next {
                Some(next) => rest = next,
                None => return Ok(fields),
            }
            continue;
        };
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let mut end = None;
        while let Some((at, c)) = chars.next() {
            if c != '"' {
                value.push(c);
            } else if quoted[at + 1..].starts_with('"') {
                value.push('"');
                chars.next();
            } else {
                end = Some(at + 1);
                break;
            }
        }
        let end = end.ok_or("a quoted field is not closed")?;
        fields.push(Cow::Owned(value.trim().to_string()));
        let after = quoted[end..].trim_start();
        match after.strip_prefix(',') {
            Some(next) => rest = next,
            None if after.is_empty() => return Ok(fields),
            None => return Err("text after a quoted field".into()),
        }
    }
}

/// A token count: a whole number, also as a float with no fraction (`374.0`, as tables that
/// once held a missing value write integers).
fn token_count(s: &str) -> Result<u32, String> {
    s.parse::<u32>().or_else(|e| {
        let x: f64 = s.parse().map_err(|_| e.to_string())?;
        if x.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&x) {
            Ok(x as u32)
        } else {
            Err("not a token count".into())
        }
    })
}

#[cfg(test)]
mod tests;

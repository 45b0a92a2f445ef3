use std::io::Write;
use std::path::PathBuf;

use super::*;

fn file(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .expect("write");
    (dir, path)
}

/// The real traces, or `None` (with a note) where this checkout has no `../shared`.
fn real(name: &str) -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces")
        .join(name);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipping: {} is absent", path.display());
        None
    }
}

fn parse_error(err: WorkloadError) -> (usize, String) {
    match err {
        WorkloadError::Parse { line, reason, .. } => (line, reason),
        other => panic!("expected a parse error, got {other}"),
    }
}

#[test]
fn mooncake_rows_become_requests() {
    let (_d, path) = file(
        "mc.jsonl",
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\
         \n\
         {\"timestamp\": 30, \"input_length\": 600, \"output_length\": 0, \"hash_ids\": [0, 2], \"extra\": 1}\n",
    );
    let w = mooncake(&path).expect("loads");
    assert_eq!(w.name, "mc");
    assert_eq!(w.tokens_per_id, 512);
    assert_eq!(w.requests.len(), 2);
    let r = &w.requests[1];
    assert_eq!((r.arrival_ms, r.prompt_len, r.output_len), (30.0, 600, 1));
    assert_eq!(r.hash_ids, vec![0, 2]);
    assert_eq!(r.kind, RequestKind::Mooncake);
    // Without hash ids a prompt shares nothing: all of it is its own content.
    let (_d, path) = file(
        "plain.jsonl",
        "{\"timestamp\": 5, \"input_length\": 700, \"output_length\": 3}\n\
         {\"timestamp\": 6, \"input_length\": 700, \"output_length\": 3, \"hash_ids\": [4]}\n\
         {\"timestamp\": 7, \"input_length\": 700, \"output_length\": 3}\n",
    );
    let w = mooncake(&path).expect("loads");
    let ids: Vec<_> = w.requests.iter().map(|r| r.hash_ids.clone()).collect();
    assert_eq!(ids, [vec![5, 6], vec![4], vec![7, 8]]);
}

#[test]
fn mooncake_errors_name_file_and_line() {
    let good =
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [0]}\n";
    for (row, needle) in [
        ("{\"timestamp\": 0, \"input_length\": 10}", "missing field"),
        ("not json", "expected"),
        (
            "{\"timestamp\": -1, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [0]}",
            "not a time",
        ),
        (
            "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [0, 1]}",
            "2 hash ids",
        ),
        (
            "{\"timestamp\": 0, \"input_length\": -3, \"output_length\": 5, \"hash_ids\": [0]}",
            "invalid value",
        ),
    ] {
        let (_d, path) = file("bad.jsonl", &format!("{good}{good}{row}\n"));
        let err = mooncake(&path).expect_err(row);
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("{}:3: ", path.display())),
            "{text}"
        );
        let (line, reason) = parse_error(err);
        assert_eq!(line, 3);
        assert!(reason.contains(needle), "{row}: {reason}");
    }
}

#[test]
fn missing_and_empty_files_are_errors() {
    let err = mooncake(Path::new("/nonexistent/trace.jsonl")).expect_err("absent");
    assert!(matches!(err, WorkloadError::Io { .. }));
    assert!(
        err.to_string()
            .starts_with("reading /nonexistent/trace.jsonl: "),
        "{err}"
    );
    let (_d, path) = file("empty.jsonl", "\n\n");
    assert!(matches!(mooncake(&path), Err(WorkloadError::Empty(_))));
    let (_d, path) = file("empty.csv", "");
    assert!(matches!(azure(&path), Err(WorkloadError::Empty(_))));
    let (_d, path) = file("header.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n");
    assert!(matches!(azure(&path), Err(WorkloadError::Empty(_))));
}

#[test]
fn azure_rows_become_requests_with_own_ids() {
    let (_d, path) = file(
        "az.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 23:59:59.9000000,1000,44\n\
         2023-11-17 00:00:01.2345000,374,0\n\
         2023-11-16 23:59:59.9000000,512,7\n",
    );
    let w = azure(&path).expect("loads");
    assert_eq!(w.name, "az");
    let r: Vec<_> = w
        .requests
        .iter()
        .map(|r| (r.arrival_ms, r.prompt_len, r.output_len))
        .collect();
    assert_eq!(r[0], (0.0, 1000, 44));
    assert_eq!(r[1], (0.0, 512, 7));
    assert!((r[2].0 - 1334.5).abs() < 1e-9, "{}", r[2].0);
    assert_eq!(r[2].2, 1);
    // No sharing: ids are fresh per prompt, one per 512 tokens.
    assert_eq!(w.requests[0].hash_ids, vec![0, 1]);
    assert_eq!(w.requests[2].hash_ids, vec![2]);
    assert_eq!(w.requests[1].hash_ids, vec![3]);
    assert!(w.requests.iter().all(|r| r.kind == RequestKind::Azure));
    // Columns are found by name.
    let (_d, path) = file(
        "b.csv",
        "GeneratedTokens,TIMESTAMP,ContextTokens\n9,2023-11-16 18:15:46,30\n",
    );
    let w = azure(&path).expect("loads");
    assert_eq!(
        (w.requests[0].prompt_len, w.requests[0].output_len),
        (30, 9)
    );
}

#[test]
fn azure_errors_name_file_and_line() {
    let head = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n";
    for (row, needle) in [
        ("2023-11-16 18:15:46,374", "2 fields"),
        ("2023-11-16 18:75:46,374,44", "no such time"),
        ("yesterday,374,44", "not YYYY-MM-DD"),
        ("2023-11-16 18:15:46,x,44", "ContextTokens \"x\""),
        ("2023-11-16 18:15:46,374,-1", "GeneratedTokens \"-1\""),
    ] {
        let (_d, path) = file("bad.csv", &format!("{head}{row}\n"));
        let err = azure(&path).expect_err(row);
        assert!(
            err.to_string()
                .starts_with(&format!("{}:3: ", path.display())),
            "{err}"
        );
        let (line, reason) = parse_error(err);
        assert_eq!(line, 3);
        assert!(reason.contains(needle), "{row}: {reason}");
    }
    let (_d, path) = file("bad.csv", "TIMESTAMP,Context,GeneratedTokens\n");
    let (line, reason) = parse_error(azure(&path).expect_err("bad header"));
    assert_eq!(line, 1);
    assert!(reason.contains("ContextTokens"), "{reason}");
}

#[test]
fn the_real_mooncake_trace_loads() {
    let Some(path) = real("mooncake-conversation.jsonl") else {
        return;
    };
    let w = mooncake(&path).expect("loads");
    assert_eq!(w.name, "mooncake-conversation");
    assert_eq!(w.requests.len(), 12_031);
    let (input, output) = w.mean_lengths();
    // Release notes: input 12,035 tokens, output 343 on average.
    assert!((input - 12_035.0).abs() < 150.0, "mean input {input}");
    assert!((output - 343.0).abs() < 10.0, "mean output {output}");
    assert!(
        w.requests
            .windows(2)
            .all(|p| p[0].arrival_ms <= p[1].arrival_ms)
    );
    assert_eq!(w.requests[0].hash_ids[..3], [0, 1, 2]);
    // Conversations share prefixes: many prompts start with an id seen before.
    let mut seen = std::collections::HashSet::new();
    let shared = w
        .requests
        .iter()
        .filter(|r| !seen.insert(r.hash_ids[0]))
        .count();
    assert!(shared > 6_000, "{shared} prompts share a first id");
}

#[test]
fn the_real_azure_trace_loads() {
    let Some(path) = real("azure-conv-2023.csv") else {
        return;
    };
    let w = azure(&path).expect("loads");
    assert_eq!(w.requests.len(), 19_366);
    let (input, output) = w.mean_lengths();
    // README: mean input about 1,155 tokens, output about 211.
    assert!((input - 1155.0).abs() < 30.0, "mean input {input}");
    assert!((output - 211.0).abs() < 10.0, "mean output {output}");
    assert_eq!(w.requests[0].arrival_ms, 0.0);
    // 18:15:46.6805900 to 18:15:50.9951690.
    assert!((w.requests[1].arrival_ms - 4314.579).abs() < 1e-6);
    // 18:15:46.68 to 19:14:08.40: just under an hour.
    let last = w.requests.last().expect("rows").arrival_ms;
    assert!((last - 3_501_721.937).abs() < 1e-3, "{last}");
}

#[test]
fn bailian_rows_have_ids_of_16_tokens_and_times_in_seconds() {
    let (_d, path) = file(
        "qwen_traceA_blksz_16.jsonl",
        "{\"chat_id\": 159, \"parent_chat_id\": -1, \"timestamp\": 61.114, \"input_length\": 40, \
          \"output_length\": 132, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [7, 8, 9]}\n\
         {\"chat_id\": 160, \"parent_chat_id\": 159, \"timestamp\": 0.5, \"input_length\": 33, \
          \"output_length\": 0, \"type\": \"search\", \"turn\": 2, \"hash_ids\": [7, 8]}\n",
    );
    let w = jsonl(&path, &BAILIAN, None).expect("loads");
    assert_eq!(w.name, "qwen_traceA_blksz_16");
    assert_eq!(w.tokens_per_id, 16);
    let r: Vec<_> = w
        .requests
        .iter()
        .map(|r| (r.arrival_ms, r.prompt_len, r.output_len, r.kind))
        .collect();
    assert_eq!(r[0], (500.0, 33, 1, RequestKind::Bailian));
    assert!((r[1].0 - 61_114.0).abs() < 1e-6, "{}", r[1].0);
    assert_eq!(w.requests[1].hash_ids, [7, 8, 9]);
    // Ids are of 16 tokens: 40 tokens take at most 3.
    let (_d, path) = file(
        "b.jsonl",
        "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 1, \"hash_ids\": [1, 2, 3, 4]}\n",
    );
    let (line, reason) = parse_error(jsonl(&path, &BAILIAN, None).expect_err("4 ids"));
    assert_eq!(line, 1);
    assert!(reason.contains("at most 3 ids of 16 tokens"), "{reason}");
}

#[test]
fn azure_2024_rows_with_offsets_quotes_and_float_counts_load() {
    // A byte order mark, an extra column, quoted fields, counts written as floats, the 2024
    // traces' `+00:00` offset and a row in another zone.
    let (_d, path) = file(
        "AzureLLMInferenceTrace_code_1week.csv",
        "\u{feff}TIMESTAMP,ContextTokens,GeneratedTokens,Note\n\
         2024-05-10 00:00:00.009930+00:00,2162,5,a\n\
         \"2024-05-10 00:00:01+00:00\",\"300.0\",7,\"b, with a comma and \"\"quotes\"\"\"\n\
         2024-05-10T02:00:00.5+02:00,17,1,\n",
    );
    let w = azure(&path).expect("loads");
    let r: Vec<_> = w
        .requests
        .iter()
        .map(|r| (r.arrival_ms, r.prompt_len, r.output_len))
        .collect();
    assert_eq!(r.len(), 3);
    assert_eq!(r[0], (0.0, 2162, 5));
    assert!((r[1].0 - 490.07).abs() < 1e-6, "{}", r[1].0);
    assert_eq!((r[1].1, r[1].2), (17, 1));
    assert!((r[2].0 - 990.07).abs() < 1e-6, "{}", r[2].0);
    assert_eq!((r[2].1, r[2].2), (300, 7));
    for (row, needle) in [
        ("2024-05-10 00:00:00+00:00,1.5,4,x", "not a token count"),
        ("\"2024-05-10 00:00:00,1,4,x", "not closed"),
        ("\"2024-05-10 00:00:00\"x,1,4,x", "after a quoted field"),
        ("2024-05-10 00:00:00+25:00,1,4,x", "not YYYY-MM-DD"),
    ] {
        let (_d, path) = file(
            "bad.csv",
            &format!("TIMESTAMP,ContextTokens,GeneratedTokens,Note\n{row}\n"),
        );
        let (line, reason) = parse_error(azure(&path).expect_err(row));
        assert_eq!(line, 2);
        assert!(reason.contains(needle), "{row}: {reason}");
    }
}

#[test]
fn a_row_limit_stops_the_reading() {
    // Rows past the limit are never read: a broken row there does not fail the load.
    let row = |t: u32| {
        format!(
            "{{\"timestamp\": {t}, \"input_length\": 9, \"output_length\": 2, \"hash_ids\": [{t}]}}\n"
        )
    };
    let (_d, path) = file(
        "mc.jsonl",
        &format!("{}\n{}{}not json\n", row(0), row(1), row(2)),
    );
    assert_eq!(
        jsonl(&path, &MOONCAKE, Some(3))
            .expect("loads")
            .requests
            .len(),
        3
    );
    let (line, _) = parse_error(jsonl(&path, &MOONCAKE, Some(4)).expect_err("row 4"));
    assert_eq!(line, 5);
    let (_d, path) = file(
        "az.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:15:46,1,1\n\
         2023-11-16 18:15:47,2,1\n\
         broken\n",
    );
    assert_eq!(
        csv(&path, &AZURE, Some(2)).expect("loads").requests.len(),
        2
    );
    assert!(csv(&path, &AZURE, None).is_err());
}

#[test]
fn text_that_is_not_utf8_names_its_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bin.jsonl");
    std::fs::write(
        &path,
        b"{\"timestamp\": 0, \"input_length\": 9, \"output_length\": 2, \"hash_ids\": []}\n\xff\xfe\n",
    )
    .expect("write");
    let (line, reason) = parse_error(mooncake(&path).expect_err("binary"));
    assert_eq!(line, 2);
    assert!(reason.contains("UTF-8"), "{reason}");
}

#[test]
fn burstgpt_rows_have_times_in_seconds() {
    let (_d, path) = file(
        "BurstGPT_1.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
         5,ChatGPT,472,18,490,Conversation log\n\
         45.25,GPT-4,1087,0,1087,API log\n\
         4.5,ChatGPT,30,12,42,Conversation log\n",
    );
    let w = csv(&path, &BURSTGPT, None).expect("loads");
    assert_eq!(w.name, "BurstGPT_1");
    let r: Vec<_> = w
        .requests
        .iter()
        .map(|r| (r.arrival_ms, r.prompt_len, r.output_len, r.kind))
        .collect();
    assert_eq!(
        r,
        [
            (0.0, 30, 12, RequestKind::Burstgpt),
            (500.0, 472, 18, RequestKind::Burstgpt),
            // A failed request (0 response tokens) still asks for one.
            (40_750.0, 1087, 1, RequestKind::Burstgpt),
        ]
    );
    for (row, needle) in [
        ("-1,ChatGPT,4,1,5,x", "not a number of seconds"),
        ("soon,ChatGPT,4,1,5,x", "not a number of seconds"),
    ] {
        let (_d, path) = file(
            "bad.csv",
            &format!(
                "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n{row}\n"
            ),
        );
        let (line, reason) = parse_error(csv(&path, &BURSTGPT, None).expect_err(row));
        assert_eq!(line, 2);
        assert!(reason.contains(needle), "{row}: {reason}");
    }
}

#[test]
fn rows_with_an_empty_prompt_are_left_out_and_counted() {
    let (_d, path) = file(
        "mc.jsonl",
        "{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 5, \"hash_ids\": []}\n\
         {\"timestamp\": 1, \"input_length\": 9, \"output_length\": 5, \"hash_ids\": [3]}\n",
    );
    let w = mooncake(&path).expect("loads");
    assert_eq!((w.requests.len(), w.skipped_rows), (1, 1));
    let (_d, path) = file(
        "az.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:15:46,0,4\n\
         2023-11-16 18:15:47,0,4\n\
         2023-11-16 18:15:48,7,4\n",
    );
    let w = azure(&path).expect("loads");
    assert_eq!((w.requests.len(), w.skipped_rows), (1, 2));
    // The first kept row sets the start.
    assert_eq!(w.requests[0].arrival_ms, 0.0);
    // Nothing but empty prompts: no workload, and the error says why.
    let (_d, path) = file(
        "b.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,ChatGPT,0,1,1,x\n",
    );
    let err = csv(&path, &BURSTGPT, None).expect_err("all empty");
    assert!(matches!(err, WorkloadError::Empty(_)), "{err}");
    assert!(err.to_string().contains("1 with an empty one"), "{err}");
}

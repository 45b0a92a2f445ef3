//! What structured output costs (`dolphin-grammar` over llguidance), on SmolLM2's 49,152-token
//! vocabulary:
//! - building the model's token space (once per engine, at load);
//! - the router's check of a JSON Schema before routing (a byte-level vocabulary), and of the
//!   formats a forced tool call is drawn under (`tool_choice` "required" over 8 tools, and a
//!   named function), which run on the blocking pool with the tokenizing;
//! - one mask and one consumed token per generated token, following a fixed JSON document
//!   token by token under its schema (the grammar's share of each draw, without the model);
//! - the candle engine's time per generated token with and without a format, in the same run
//!   (greedy, one sequence; the texts differ, so this is per token, not per answer).
//!
//! `cargo run --release -p dolphin-bench --bin structured_output [-- --out PATH]`

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use dolphin_engine::candle::{CandleConfig, candle_scheduler, token_space_of};
use dolphin_engine::{Engine, Format, Sampling, SeqOutput, SeqRequest};
use dolphin_tokenizer::{ChatMessage, ModelTokenizer, SMOLLM2_FILE, find_model};
use serde::Serialize;

#[derive(Debug, Parser)]
#[command(about = "Structured output's cost: token space, check, mask per token, engine per token")]
struct Args {
    /// Times the document is followed (mask and consume per token).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Tokens each engine answer may have.
    #[arg(long, default_value_t = 48)]
    max_tokens: u32,
    /// Answers per engine case (alternated).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Where the JSON goes.
    #[arg(long, default_value = "bench/results/structured_output.json")]
    out: PathBuf,
}

const SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","maxLength":60},"tags":{"type":"array","items":{"type":"string","maxLength":20},"maxItems":8},"address":{"type":"object","properties":{"city":{"type":"string","maxLength":30},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city","zip"],"additionalProperties":false}},"required":["name","age","email","tags","address"],"additionalProperties":false}"#;

const DOCUMENT: &str = r#"{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["mathematics", "engines", "poetry"], "address": {"city": "London", "zip": "12345"}}"#;

#[derive(Debug, Serialize)]
struct Percentiles {
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
}

fn percentiles(mut xs: Vec<f64>) -> Percentiles {
    xs.sort_by(f64::total_cmp);
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    Percentiles {
        mean_us: xs.iter().sum::<f64>() / xs.len() as f64,
        p50_us: at(0.5),
        p99_us: at(0.99),
    }
}

#[derive(Debug, Serialize)]
struct EngineCase {
    format: &'static str,
    /// Decode time per token after the first, per answer.
    ms_per_token: Vec<f64>,
    tokens: Vec<usize>,
    text: String,
}

#[derive(Debug, Serialize)]
struct Report {
    cpu: String,
    cpu_flags: Vec<&'static str>,
    vocab: u32,
    token_space_build_ms: f64,
    router_check_us: Percentiles,
    /// The router's check of a forced tool call's format, by `tool_choice`.
    tool_check_us: std::collections::BTreeMap<&'static str, Percentiles>,
    document_tokens: usize,
    mask_and_consume_per_token: Percentiles,
    engine: Vec<EngineCase>,
    notes: &'static str,
}

/// The router's check of `format` (its compilation), timed `rounds` times.
fn check_times(format: &Format, rounds: usize) -> anyhow::Result<Percentiles> {
    let mut checks = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        format.check()?;
        checks.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(percentiles(checks))
}

/// The format the router draws a forced tool call under, for `tool_choice` over 8 tools as an
/// agent offers them (three parameters each: text, a bounded integer, one of three options).
fn tool_format(tool_choice: serde_json::Value) -> anyhow::Result<Format> {
    use dolphin_router::{http::types::OtherFields, tools};
    let tools: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            serde_json::json!({"type": "function", "function": {
                "name": format!("tool_{i}"),
                "description": "Looks something up",
                "parameters": {"type": "object", "properties": {
                    "query": {"type": "string", "maxLength": 80},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                    "mode": {"enum": ["fast", "exact", "fuzzy"]},
                }, "required": ["query"], "additionalProperties": false},
            }})
        })
        .collect();
    let mut fields: OtherFields =
        serde_json::from_value(serde_json::json!({"tools": tools, "tool_choice": tool_choice}))?;
    let request =
        tools::take(&mut fields, None).map_err(|(field, e)| anyhow::anyhow!("{field}: {e}"))?;
    request.format().context("a forced call has a format")
}

/// Per-token decode times (ms) of one greedy answer, and its tokens.
async fn answer(
    engine: &dyn Engine,
    id: String,
    prompt: &[u32],
    sampling: Sampling,
) -> anyhow::Result<(f64, Vec<u32>)> {
    let mut out = engine
        .generate(SeqRequest {
            request_id: id,
            prompt: prompt.to_vec(),
            sampling,
        })
        .await?;
    let mut tokens = Vec::new();
    let mut first = None;
    let mut last = Instant::now();
    while let Some(ev) = out.recv().await {
        match ev {
            SeqOutput::Token(t) => {
                last = Instant::now();
                first.get_or_insert(last);
                tokens.push(t.id);
            }
            SeqOutput::Finished { .. } => break,
            SeqOutput::Error(e) => anyhow::bail!("{e}"),
        }
    }
    let first = first.context("no token")?;
    let per = last.duration_since(first).as_secs_f64() * 1e3 / (tokens.len().max(2) - 1) as f64;
    Ok((per, tokens))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let model = find_model(SMOLLM2_FILE).context("the SmolLM2 GGUF: run scripts/fetch-model.sh")?;
    let tok = ModelTokenizer::from_file(&model)?;
    let vocab = tok.vocab_size();

    let t0 = Instant::now();
    let space = token_space_of(&tok, vocab, tok.stop_token_ids())?;
    let token_space_build_ms = t0.elapsed().as_secs_f64() * 1e3;
    println!("token space of {vocab} tokens: {token_space_build_ms:.1} ms");

    let schema = Format::JsonSchema(SCHEMA.into());
    let router_check_us = check_times(&schema, args.rounds.max(5))?;
    println!(
        "router check of the schema: p50 {:.0} us",
        router_check_us.p50_us
    );

    let mut tool_check_us = std::collections::BTreeMap::new();
    for (choice, tool_choice) in [
        ("required_8_tools", serde_json::json!("required")),
        (
            "named",
            serde_json::json!({"type": "function", "function": {"name": "tool_3"}}),
        ),
    ] {
        let p = check_times(&tool_format(tool_choice)?, args.rounds.max(5))?;
        println!(
            "router check of a {choice} tool call's format: p50 {:.0} us",
            p.p50_us
        );
        tool_check_us.insert(choice, p);
    }

    let doc = tok.encode(DOCUMENT)?;
    let mut per_token = Vec::new();
    let mut logits = vec![0.0f32; vocab as usize];
    for _ in 0..args.rounds {
        let mut c = space.constrain(&schema)?;
        for &t in &doc {
            let started = Instant::now();
            c.mask(&mut logits)?;
            c.consume(t)?;
            per_token.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    let mask = percentiles(per_token);
    println!(
        "mask and consume, {} tokens x {} rounds: mean {:.0} us, p50 {:.0}, p99 {:.0}",
        doc.len(),
        args.rounds,
        mask.mean_us,
        mask.p50_us,
        mask.p99_us
    );

    let engine = candle_scheduler(CandleConfig::new(&model))?;
    let prompt = tok.encode(&tok.render_chat(&[ChatMessage::new(
        "user",
        "Describe a famous mathematician as a JSON object with name, age, email, tags and address.",
    )])?)?;
    let mut cases = vec![
        EngineCase {
            format: "none",
            ms_per_token: vec![],
            tokens: vec![],
            text: String::new(),
        },
        EngineCase {
            format: "json_schema",
            ms_per_token: vec![],
            tokens: vec![],
            text: String::new(),
        },
    ];
    for rep in 0..args.reps {
        for (i, case) in cases.iter_mut().enumerate() {
            let sampling = Sampling {
                max_tokens: args.max_tokens,
                stop_token_ids: tok.stop_token_ids().to_vec(),
                format: (i == 1).then(|| schema.clone()),
                ..Sampling::default()
            };
            let (ms, tokens) = answer(&*engine, format!("{i}-{rep}"), &prompt, sampling).await?;
            case.ms_per_token.push(ms);
            case.tokens.push(tokens.len());
            case.text = tok.decode(&tokens);
        }
    }
    for c in &cases {
        println!(
            "engine, format {}: {:?} ms per token ({:?} tokens): {:?}",
            c.format, c.ms_per_token, c.tokens, c.text
        );
    }
    let report = Report {
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        vocab,
        token_space_build_ms,
        router_check_us,
        tool_check_us,
        document_tokens: doc.len(),
        mask_and_consume_per_token: mask,
        engine: cases,
        notes: "release build; one thread; llguidance 1.9 without rayon; the document follows its schema token by token (SmolLM2's own tokenization); engine: SmolLM2-135M-Instruct Q4_1 file on the candle engine, greedy, one sequence, per-token time after the first token",
    };
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("wrote {}", args.out.display());
    Ok(())
}

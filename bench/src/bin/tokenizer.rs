//! Tokenization time of SmolLM2's tokenizer (Hugging Face `tokenizers` built from the GGUF) on
//! a 1k-token and a 32k-token prompt, the sizes issue 13 names.
//!
//! The prompts are the first 1,024 and 32,768 tokens of a fixed text made of this repository's
//! documents and sources (English prose, Markdown, tables and Rust), cut at a character boundary.
//! Each prompt is encoded repeatedly for at least `--secs` seconds; the figure is the mean time
//! of one encode. `--write-texts DIR` also writes the two prompts as files, so another build (the
//! previous tokenizer's `tokenize --bench FILE` example) can time the same texts.
//!
//! `cargo run --release -p dolphin-bench --bin tokenizer [-- --out PATH]`

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use dolphin_tokenizer::{ModelTokenizer, SMOLLM2_FILE, find_model};
use serde::Serialize;

// The router's allocator (and the workers'), where prompts are tokenized in production.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The repository files the text is made of, in order.
const SOURCES: &[&str] = &[
    "docs/architecture.md",
    "docs/results.md",
    "README.md",
    "router/src/dispatch.rs",
    "router/src/stream.rs",
    "router/src/migration.rs",
    "engine/src/engine.rs",
    "kv-transfer/src/frame.rs",
];

#[derive(Debug, Parser)]
#[command(about = "SmolLM2 tokenization time on 1k- and 32k-token prompts")]
struct Args {
    /// Prompt sizes in tokens.
    #[arg(long, value_delimiter = ',', default_value = "1024,32768")]
    tokens: Vec<usize>,
    /// Seconds of encoding per prompt.
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Where the JSON goes.
    #[arg(long, default_value = "bench/results/tokenizer.json")]
    out: PathBuf,
    /// Also write each prompt to DIR/tokens_N.txt.
    #[arg(long)]
    write_texts: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Case {
    tokens: usize,
    bytes: usize,
    rounds: u32,
    mean_us: f64,
    tokens_per_s: f64,
    mb_per_s: f64,
    /// The same prompt through `tokenizers`' whole pipeline (`Tokenizer::encode_fast`), which
    /// `ModelTokenizer::encode` bypasses for its words; timed in the same run.
    tokenizers_encode_us: f64,
    /// `tokenizers_encode_us / mean_us`.
    speedup_over_tokenizers_encode: f64,
}

/// Mean seconds of one `encode()`, repeated for at least `secs`, and the rounds run.
fn time_encode(
    secs: f64,
    mut encode: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<(f64, u32)> {
    let started = Instant::now();
    let mut rounds = 0u32;
    while started.elapsed().as_secs_f64() < secs {
        encode()?;
        rounds += 1;
    }
    Ok((started.elapsed().as_secs_f64() / f64::from(rounds), rounds))
}

#[derive(Debug, Serialize)]
struct Report {
    cpu: String,
    cpu_flags: Vec<&'static str>,
    tokenizer: &'static str,
    load_ms: f64,
    cases: Vec<Case>,
    notes: &'static str,
}

/// The fixed text, from the repository root.
fn corpus(root: &Path) -> anyhow::Result<String> {
    let mut text = String::new();
    for f in SOURCES {
        let path = root.join(f);
        text.push_str(
            &std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?,
        );
        text.push('\n');
    }
    Ok(text)
}

/// The shortest prefix of `text` (at a character boundary) that encodes to at least `n` tokens.
fn prefix_of(tok: &ModelTokenizer, text: &str, n: usize) -> anyhow::Result<String> {
    anyhow::ensure!(
        tok.encode(text)?.len() >= n,
        "the text has fewer than {n} tokens: add sources"
    );
    let (mut lo, mut hi) = (0, text.len());
    while lo < hi {
        let mut mid = lo + (hi - lo) / 2;
        while !text.is_char_boundary(mid) {
            mid += 1;
        }
        if mid >= hi {
            break;
        }
        if tok.encode(&text[..mid])?.len() >= n {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(text[..hi].to_owned())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let model = find_model(SMOLLM2_FILE).context("the SmolLM2 GGUF: run scripts/fetch-model.sh")?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let t0 = Instant::now();
    let tok = ModelTokenizer::from_file(&model)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    // Repeat the sources until the largest prompt fits.
    let once = corpus(&root)?;
    let want = args.tokens.iter().copied().max().unwrap_or(0);
    let mut text = once.clone();
    while tok.encode(&text)?.len() < want {
        text.push_str(&once);
    }
    let mut cases = Vec::new();
    for &n in &args.tokens {
        let prompt = prefix_of(&tok, &text, n)?;
        if let Some(dir) = &args.write_texts {
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join(format!("tokens_{n}.txt")), &prompt)?;
        }
        let got = tok.encode(&prompt)?.len();
        let (mean, rounds) = time_encode(args.secs, || {
            std::hint::black_box(tok.encode(std::hint::black_box(&prompt))?);
            Ok(())
        })?;
        let (pipeline, _) = time_encode(args.secs / 2.0, || {
            let e = tok
                .hf()
                .encode_fast(std::hint::black_box(prompt.as_str()), false);
            std::hint::black_box(e.map_err(|e| anyhow::anyhow!("{e}"))?);
            Ok(())
        })?;
        let case = Case {
            tokens: got,
            bytes: prompt.len(),
            rounds,
            mean_us: mean * 1e6,
            tokens_per_s: got as f64 / mean,
            mb_per_s: prompt.len() as f64 / mean / 1e6,
            tokenizers_encode_us: pipeline * 1e6,
            speedup_over_tokenizers_encode: pipeline / mean,
        };
        println!(
            "{:>6} tokens ({:>7} bytes): {:>10.1} us per encode, {:>9.0} tokens/s, {:.1} MB/s ({} rounds); tokenizers' encode_fast {:.1} us ({:.2}x)",
            case.tokens,
            case.bytes,
            case.mean_us,
            case.tokens_per_s,
            case.mb_per_s,
            case.rounds,
            case.tokenizers_encode_us,
            case.speedup_over_tokenizers_encode
        );
        cases.push(case);
    }
    let report = Report {
        cpu: dolphin_bench::machine::cpu_name(),
        cpu_flags: dolphin_bench::machine::cpu_flags(),
        tokenizer: "dolphin_tokenizer::ModelTokenizer (Hugging Face tokenizers 0.23: added tokens and BPE; words cut by regex-automata) from SmolLM2-135M-Instruct.Q4_1.gguf",
        load_ms,
        cases,
        notes: "one thread, mimalloc (as the router); encode with special tokens parsed, ids only; mean of repeated encodes of the same prompt; tokenizers_encode_us is Tokenizer::encode_fast on the same prompt in the same run",
    };
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("wrote {}", args.out.display());
    Ok(())
}

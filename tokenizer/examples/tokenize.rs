//! Prints the token ids of a text with the SmolLM2 tokenizer, or measures encode speed.
//!
//! `cargo run --release -p dolphin-tokenizer --example tokenize -- "some text"`
//! `cargo run --release -p dolphin-tokenizer --example tokenize -- --bench FILE`

use std::time::Instant;

use dolphin_tokenizer::{ModelTokenizer, SMOLLM2_FILE, find_model};

fn main() -> anyhow::Result<()> {
    let path = find_model(SMOLLM2_FILE)
        .ok_or_else(|| anyhow::anyhow!("{SMOLLM2_FILE} not found: run scripts/fetch-model.sh"))?;
    let t0 = Instant::now();
    let tok = ModelTokenizer::from_file(&path)?;
    eprintln!("loaded {} in {:?}", path.display(), t0.elapsed());
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, file] if flag == "--bench" => {
            let text = std::fs::read_to_string(file)?;
            let mut tokens = 0usize;
            let t = Instant::now();
            let mut rounds = 0u32;
            // Repeat for at least a second so the figure is not dominated by timer noise.
            while t.elapsed().as_secs_f64() < 1.0 {
                tokens += tok.encode(&text)?.len();
                rounds += 1;
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{} bytes -> {} tokens; {rounds} rounds; {:.0} tokens/s, {:.1} MB/s",
                text.len(),
                tokens / rounds as usize,
                tokens as f64 / secs,
                text.len() as f64 * f64::from(rounds) / secs / 1e6
            );
        }
        _ => println!("{:?}", tok.encode(&args.join(" "))?),
    }
    Ok(())
}

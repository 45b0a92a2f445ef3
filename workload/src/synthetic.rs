//! Synthetic workloads modelled on the DolphinRouting paper's (DESIGN.md section 1): ArXiv
//! summarisation (long prompts, nothing shared), L-Eval long-document QA (several questions on
//! one long document: mostly shared prefixes), HumanEval code completion (short prompts) and a
//! Hybrid of the three.
//!
//! Every workload is a function of `(n, seed)` alone (a portable ChaCha generator). Arrivals are
//! all 0: apply an [`Arrivals`](crate::Arrivals) after. Hash ids stand for
//! [`TOKENS_PER_ID`] tokens each and are unique within a workload, except for the documents
//! L-Eval questions share on purpose.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::request::{RequestKind, Workload, WorkloadRequest};

/// Tokens each hash id stands for (as in the Mooncake trace).
pub const TOKENS_PER_ID: u32 = 512;

/// ArXiv-like prompts: uniform in this range (mean 8,192 tokens).
pub const ARXIV_PROMPT: std::ops::RangeInclusive<u32> = 6_144..=10_240;
/// L-Eval-like documents: this many whole ids (16k-19.5k tokens, mean 17,920).
pub const LEVAL_DOCUMENT_IDS: std::ops::RangeInclusive<u32> = 32..=38;
/// L-Eval-like questions after the document, tokens (mean 900: prompts about 18.8k).
pub const LEVAL_QUESTION: std::ops::RangeInclusive<u32> = 300..=1_500;
/// Questions asked about one document (mean 8).
pub const LEVAL_QUESTIONS_PER_DOCUMENT: std::ops::RangeInclusive<u32> = 6..=10;

/// Draws requests of each kind; hash ids come from one counter, so kinds mixed into one
/// workload never share ids by accident.
struct Generator {
    rng: StdRng,
    next_id: u64,
    /// The current L-Eval document's ids and the questions it has left.
    document: Vec<u64>,
    questions_left: u32,
}

impl Generator {
    fn new(seed: u64) -> Self {
        Generator {
            rng: StdRng::seed_from_u64(seed),
            next_id: 0,
            document: Vec::new(),
            questions_left: 0,
        }
    }

    /// `n` ids never handed out before.
    fn fresh(&mut self, n: u32) -> std::ops::Range<u64> {
        let first = self.next_id;
        self.next_id += u64::from(n);
        first..self.next_id
    }

    /// About 8k tokens to summarise, nothing shared; 128-384 tokens of summary.
    fn arxiv(&mut self) -> WorkloadRequest {
        let prompt = self.rng.random_range(ARXIV_PROMPT);
        let ids = self.fresh(prompt.div_ceil(TOKENS_PER_ID)).collect();
        let output = self.rng.random_range(128..=384);
        request(ids, prompt, output, RequestKind::Arxiv)
    }

    /// A question on the current document (a new one after its questions run out): the
    /// document's whole ids, then the question's own; 16-128 tokens of answer.
    fn leval(&mut self) -> WorkloadRequest {
        if self.questions_left == 0 {
            let ids = self.rng.random_range(LEVAL_DOCUMENT_IDS);
            self.document = self.fresh(ids).collect();
            self.questions_left = self.rng.random_range(LEVAL_QUESTIONS_PER_DOCUMENT);
        }
        self.questions_left -= 1;
        let question = self.rng.random_range(LEVAL_QUESTION);
        let mut ids = self.document.clone();
        ids.extend(self.fresh(question.div_ceil(TOKENS_PER_ID)));
        let prompt = self.document.len() as u32 * TOKENS_PER_ID + question;
        let output = self.rng.random_range(16..=128);
        request(ids, prompt, output, RequestKind::Leval)
    }

    /// A short code prompt, 100-400 tokens skewed short (mean 200): `100 + 300 u^2`; 64-512
    /// tokens of code.
    fn humaneval(&mut self) -> WorkloadRequest {
        let u: f64 = self.rng.random();
        let prompt = 100 + (300.0 * u * u).round() as u32;
        let ids = self.fresh(1).collect();
        let output = self.rng.random_range(64..=512);
        request(ids, prompt, output, RequestKind::Humaneval)
    }
}

fn request(
    hash_ids: Vec<u64>,
    prompt_len: u32,
    output_len: u32,
    kind: RequestKind,
) -> WorkloadRequest {
    WorkloadRequest {
        arrival_ms: 0.0,
        hash_ids,
        prompt_len,
        output_len,
        kind,
    }
}

fn workload(name: &str, requests: Vec<WorkloadRequest>) -> Workload {
    Workload {
        name: name.to_string(),
        tokens_per_id: TOKENS_PER_ID,
        requests,
        skipped_rows: 0,
    }
}

/// Draws one request of a kind.
type Draw = fn(&mut Generator) -> WorkloadRequest;

fn only(name: &str, draw: Draw, n: usize, seed: u64) -> Workload {
    let mut g = Generator::new(seed);
    workload(name, (0..n).map(|_| draw(&mut g)).collect())
}

/// `n` ArXiv-like summarisation requests: prompts of about 8k tokens ([`ARXIV_PROMPT`]),
/// nothing shared; outputs 128-384 tokens.
pub fn arxiv(n: usize, seed: u64) -> Workload {
    only("arxiv", Generator::arxiv, n, seed)
}

/// `n` L-Eval-like long-document questions: documents of about 18k tokens
/// ([`LEVAL_DOCUMENT_IDS`]), about 8 consecutive questions each, every prompt the whole
/// document (over 80% of it) then its question; prompts about 19k tokens; outputs 16-128.
pub fn leval(n: usize, seed: u64) -> Workload {
    only("leval", Generator::leval, n, seed)
}

/// `n` HumanEval-like code completions: prompts of about 200 tokens (100-400), outputs 64-512.
pub fn humaneval(n: usize, seed: u64) -> Workload {
    only("humaneval", Generator::humaneval, n, seed)
}

/// `n` requests, a third of each of [`arxiv`], [`leval`] and [`humaneval`] (the first
/// `n % 3` kinds in that order get one more), interleaved in random order. L-Eval questions
/// keep their order, so a document's questions are spread among the other kinds.
pub fn hybrid(n: usize, seed: u64) -> Workload {
    let mut g = Generator::new(seed);
    let kinds: [Draw; 3] = [Generator::arxiv, Generator::leval, Generator::humaneval];
    let mut order: Vec<Draw> = (0..n).map(|i| kinds[i % 3]).collect();
    order.shuffle(&mut g.rng);
    workload(
        "hybrid",
        order.into_iter().map(|draw| draw(&mut g)).collect(),
    )
}

#[cfg(test)]
mod tests;

//! A workload: requests with hash-id prompts, output lengths and arrival times.

use serde::{Deserialize, Serialize};

/// Where a request comes from; summaries break attainment down by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RequestKind {
    /// ArXiv-like summarisation: about 8k-token prompts, nothing shared.
    Arxiv,
    /// L-Eval-like long-document QA: about 19k-token prompts, most of it a shared document.
    Leval,
    /// HumanEval-like code completion: about 200-token prompts.
    Humaneval,
    /// A row of the Mooncake conversation trace.
    Mooncake,
    /// A row of an Azure LLM inference trace.
    Azure,
    /// A row of a Qwen-Bailian trace (Alibaba's, ids of 16 tokens).
    Bailian,
    /// A row of the BurstGPT trace.
    Burstgpt,
}

impl RequestKind {
    /// Every kind, in order.
    pub const ALL: [RequestKind; 7] = [
        RequestKind::Arxiv,
        RequestKind::Leval,
        RequestKind::Humaneval,
        RequestKind::Mooncake,
        RequestKind::Azure,
        RequestKind::Bailian,
        RequestKind::Burstgpt,
    ];

    /// The kind's name, as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Arxiv => "arxiv",
            RequestKind::Leval => "leval",
            RequestKind::Humaneval => "humaneval",
            RequestKind::Mooncake => "mooncake",
            RequestKind::Azure => "azure",
            RequestKind::Bailian => "bailian",
            RequestKind::Burstgpt => "burstgpt",
        }
    }

    /// The `max_tokens` a client of this kind sends: a fixed cap per workload, as real clients
    /// set one, never the answer's length. Each is at least the longest output the kind
    /// produces (synthetic generators: ArXiv 384, L-Eval 128, HumanEval 512; the shipped
    /// traces: Mooncake 2000, Azure 1000), rounded up to a usual setting. The Bailian and
    /// BurstGPT traces are not shipped: 8192 leaves room for Bailian's reasoning trace's long
    /// answers, 4096 for ChatGPT's (where a row asks for more, callers raise the cap to its
    /// output, as for every kind).
    pub fn max_tokens_cap(self) -> u32 {
        match self {
            RequestKind::Arxiv | RequestKind::Humaneval | RequestKind::Azure => 1024,
            RequestKind::Leval => 512,
            RequestKind::Mooncake => 2048,
            RequestKind::Bailian => 8192,
            RequestKind::Burstgpt => 4096,
        }
    }
}

/// One request of a workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadRequest {
    /// When it is sent, ms from the start (ignored by closed-loop replay).
    pub arrival_ms: f64,
    /// The prompt's content: id `i` stands for `tokens_per_id` tokens; prompts sharing a
    /// leading run of ids share that prefix. The last id may be partly used; ids may cover
    /// less than `prompt_len` (the rest is content of this request alone).
    pub hash_ids: Vec<u64>,
    /// Prompt length in tokens (at least 1).
    pub prompt_len: u32,
    /// Tokens to generate (at least 1); replay sends it as `max_tokens` with `ignore_eos`.
    pub output_len: u32,
    /// Where it comes from.
    pub kind: RequestKind,
}

/// A named list of requests, in arrival order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Name for reports and table provenance (e.g. `mooncake-conversation`, `hybrid`).
    pub name: String,
    /// Tokens each hash id stands for (512, as in the Mooncake trace).
    pub tokens_per_id: u32,
    /// The requests, sorted by `arrival_ms`.
    pub requests: Vec<WorkloadRequest>,
    /// Trace rows left out because their prompt is empty (0 tokens): nothing can replay them.
    #[serde(default)]
    pub skipped_rows: usize,
}

impl Workload {
    /// The token ids of request `index`'s prompt, expanded deterministically from its hash
    /// ids ([`crate::expand_prompt`]) into ids in `vocab` (e.g. `0..49152`).
    pub fn prompt_tokens(&self, index: usize, vocab: std::ops::Range<u32>) -> Vec<u32> {
        let r = &self.requests[index];
        crate::expand::expand_prompt(
            &r.hash_ids,
            self.tokens_per_id,
            r.prompt_len,
            index as u64,
            vocab,
        )
    }

    /// Keeps the first `n` requests.
    pub fn truncate(&mut self, n: usize) {
        self.requests.truncate(n);
    }

    /// Mean prompt and output lengths, tokens.
    pub fn mean_lengths(&self) -> (f64, f64) {
        let n = self.requests.len().max(1) as f64;
        let p: f64 = self.requests.iter().map(|r| f64::from(r.prompt_len)).sum();
        let o: f64 = self.requests.iter().map(|r| f64::from(r.output_len)).sum();
        (p / n, o / n)
    }
}

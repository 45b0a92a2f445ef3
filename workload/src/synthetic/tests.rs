use std::collections::{HashMap, HashSet};

use super::*;

const N: usize = 3_000;

fn within(x: f64, target: f64, tolerance: f64) -> bool {
    (x - target).abs() <= tolerance * target
}

/// Ids used by more than one request.
fn shared_ids(w: &Workload) -> HashSet<u64> {
    let mut uses: HashMap<u64, u32> = HashMap::new();
    for r in &w.requests {
        for &id in &r.hash_ids {
            *uses.entry(id).or_default() += 1;
        }
    }
    uses.into_iter()
        .filter(|&(_, n)| n > 1)
        .map(|(id, _)| id)
        .collect()
}

/// Checks what every synthetic workload promises.
fn well_formed(w: &Workload, n: usize) {
    assert_eq!(w.requests.len(), n);
    assert_eq!(w.tokens_per_id, TOKENS_PER_ID);
    for r in &w.requests {
        assert_eq!(r.arrival_ms, 0.0);
        assert!(r.prompt_len >= 1 && r.output_len >= 1);
        // Ids cover the prompt, and the last one is needed.
        assert_eq!(
            r.hash_ids.len() as u32,
            r.prompt_len.div_ceil(TOKENS_PER_ID),
            "{r:?}"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_workload() {
    for make in [arxiv, leval, humaneval, hybrid] {
        assert_eq!(make(200, 7), make(200, 7));
        assert_ne!(make(200, 7), make(200, 8));
        assert!(make(0, 7).requests.is_empty());
    }
}

#[test]
fn arxiv_is_about_8k_tokens_with_nothing_shared() {
    let w = arxiv(N, 1);
    well_formed(&w, N);
    let (prompt, output) = w.mean_lengths();
    assert!(within(prompt, 8_192.0, 0.03), "{prompt}");
    assert!(within(output, 256.0, 0.05), "{output}");
    assert!(
        w.requests
            .iter()
            .all(|r| ARXIV_PROMPT.contains(&r.prompt_len)
                && (128..=384).contains(&r.output_len)
                && r.kind == RequestKind::Arxiv)
    );
    assert!(shared_ids(&w).is_empty());
}

#[test]
fn leval_questions_share_most_of_their_prompt() {
    let w = leval(N, 2);
    well_formed(&w, N);
    let (prompt, output) = w.mean_lengths();
    assert!(within(prompt, 18_820.0, 0.03), "{prompt}");
    assert!(within(output, 72.0, 0.05), "{output}");
    assert!(
        w.requests
            .iter()
            .all(|r| r.kind == RequestKind::Leval && (16..=128).contains(&r.output_len))
    );
    // Group consecutive questions by their first id: one group per document.
    let mut groups: Vec<Vec<&WorkloadRequest>> = Vec::new();
    for r in &w.requests {
        match groups.last_mut() {
            Some(g) if g[0].hash_ids[0] == r.hash_ids[0] => g.push(r),
            _ => groups.push(vec![r]),
        }
    }
    let per_doc = N as f64 / groups.len() as f64;
    assert!(
        within(per_doc, 8.0, 0.08),
        "{per_doc} questions per document"
    );
    let shared = shared_ids(&w);
    for g in &groups[..groups.len() - 1] {
        assert!(g.len() >= 6, "{} questions", g.len());
        for r in g {
            // The document's ids are a common prefix of every question on it.
            let doc = &g[0].hash_ids[..r
                .hash_ids
                .iter()
                .take_while(|id| shared.contains(id))
                .count()];
            assert!(r.hash_ids.starts_with(doc));
            let doc_tokens = doc.len() as u32 * TOKENS_PER_ID;
            assert!(
                f64::from(doc_tokens) > 0.8 * f64::from(r.prompt_len),
                "{doc_tokens} of {}",
                r.prompt_len
            );
            assert!(r.prompt_len > doc_tokens, "a question follows the document");
        }
        // Question ids are the question's own.
        let own: HashSet<u64> = g.iter().map(|r| *r.hash_ids.last().expect("ids")).collect();
        assert_eq!(own.len(), g.len());
    }
    // Different documents share nothing.
    let firsts: HashSet<u64> = groups.iter().map(|g| g[0].hash_ids[0]).collect();
    assert_eq!(firsts.len(), groups.len());
}

#[test]
fn humaneval_prompts_are_about_200_tokens() {
    let w = humaneval(N, 3);
    well_formed(&w, N);
    let (prompt, output) = w.mean_lengths();
    assert!(within(prompt, 200.0, 0.05), "{prompt}");
    assert!(within(output, 288.0, 0.05), "{output}");
    assert!(
        w.requests
            .iter()
            .all(|r| (100..=400).contains(&r.prompt_len)
                && (64..=512).contains(&r.output_len)
                && r.kind == RequestKind::Humaneval)
    );
    assert!(shared_ids(&w).is_empty());
}

#[test]
fn hybrid_is_three_interleaved_thirds() {
    let n = 3_001;
    let w = hybrid(n, 4);
    well_formed(&w, n);
    let count = |k| w.requests.iter().filter(|r| r.kind == k).count();
    assert_eq!(count(RequestKind::Arxiv), 1_001);
    assert_eq!(count(RequestKind::Leval), 1_000);
    assert_eq!(count(RequestKind::Humaneval), 1_000);
    // Interleaved: every stretch of 30 requests holds all three kinds.
    for chunk in w.requests.chunks_exact(30) {
        let kinds: HashSet<RequestKind> = chunk.iter().map(|r| r.kind).collect();
        assert_eq!(kinds.len(), 3, "a stretch of one or two kinds");
    }
    // Only L-Eval documents are shared, and kinds never share ids.
    let shared = shared_ids(&w);
    assert!(!shared.is_empty());
    for r in &w.requests {
        if r.kind != RequestKind::Leval {
            assert!(r.hash_ids.iter().all(|id| !shared.contains(id)), "{r:?}");
        }
    }
    let (prompt, _) = w.mean_lengths();
    let expect = (8_192.0 + 18_820.0 + 200.0) / 3.0;
    assert!(within(prompt, expect, 0.03), "{prompt} vs {expect}");
}

#[test]
fn every_output_fits_its_kinds_max_tokens_cap() {
    for w in [
        arxiv(500, 1),
        leval(500, 2),
        humaneval(500, 3),
        hybrid(500, 4),
    ] {
        for r in &w.requests {
            assert!(r.output_len <= r.kind.max_tokens_cap(), "{r:?}");
        }
    }
}

//! Log probabilities in OpenAI's two shapes: the legacy one of `/v1/completions` (parallel
//! lists, alternatives as an object) and chat's (one entry per token). Token texts are each
//! token decoded alone, and their bytes that text's UTF-8, as vLLM reports them.

use dolphin_proto::v1;

use super::types::{
    ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs, TopLogprobs,
};
use crate::tokenizer::Tokenizer;

/// JSON has no infinity: a token the model gives no chance at all is reported at this, as vLLM
/// does.
const FLOOR: f32 = -9999.0;

fn finite(logprob: f32) -> f32 {
    if logprob.is_nan() {
        FLOOR
    } else {
        logprob.max(FLOOR)
    }
}

/// The alternatives of one step, most likely first.
fn alternatives(lp: &v1::TokenLogprobs) -> impl Iterator<Item = (u32, f32)> + '_ {
    lp.top_ids
        .iter()
        .zip(&lp.top_logprobs)
        .map(|(&id, &l)| (id, finite(l)))
}

/// vLLM's `prompt_logprobs` for `prompt` and its tokens' log probabilities `lps` (one for each
/// token after the first): null for the first token, then for each token an object from token
/// ids (as text) to `{logprob, rank, decoded_token}`, the prompt's token first, then its
/// alternatives not already listed, ranked by their place.
pub(crate) fn prompt(
    tok: &dyn Tokenizer,
    prompt: &[u32],
    lps: &[v1::TokenLogprobs],
) -> Vec<serde_json::Value> {
    use serde_json::{Map, Value, json};
    let entry = |id: u32, logprob: f32, rank: u32| json!({"logprob": finite(logprob), "rank": rank, "decoded_token": tok.decode(&[id])});
    let mut out = Vec::with_capacity(prompt.len());
    if prompt.is_empty() {
        return out;
    }
    out.push(Value::Null);
    for (&id, lp) in prompt[1..].iter().zip(lps) {
        let mut step = Map::with_capacity(1 + lp.top_ids.len());
        // Where the engine did not rank it, its place among the alternatives is its rank.
        let rank = match lp.rank {
            0 => lp
                .top_ids
                .iter()
                .position(|&t| t == id)
                .map_or(0, |i| i as u32 + 1),
            r => r,
        };
        step.insert(id.to_string(), entry(id, lp.logprob, rank));
        for ((alt, l), place) in alternatives(lp).zip(1..) {
            if alt != id {
                step.insert(alt.to_string(), entry(alt, l, place));
            }
        }
        out.push(Value::Object(step));
    }
    out
}

/// The completions shape of `ids` and their log probabilities (pairs past the shorter list are
/// left out). `offset` is where the first token's text starts in the choice's text, in
/// characters; it is moved past the tokens.
pub(crate) fn completion(
    tok: &dyn Tokenizer,
    ids: &[u32],
    lps: &[v1::TokenLogprobs],
    offset: &mut u32,
) -> CompletionLogprobs {
    let n = ids.len().min(lps.len());
    let mut out = CompletionLogprobs {
        tokens: Vec::with_capacity(n),
        token_logprobs: Vec::with_capacity(n),
        top_logprobs: Vec::with_capacity(n),
        text_offset: Vec::with_capacity(n),
    };
    completion_into(tok, ids, lps, offset, &mut out);
    out
}

/// The completions shape of an echoed prompt (`prompt`, whose first token has no log
/// probability, and `prompt_lps`, one for each token after the first), then of the generated
/// `ids` and their `lps`, from offset 0; `offset` ends past them.
pub(crate) fn completion_with_prompt(
    tok: &dyn Tokenizer,
    (prompt, prompt_lps): (&[u32], &[v1::TokenLogprobs]),
    ids: &[u32],
    lps: &[v1::TokenLogprobs],
    offset: &mut u32,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    *offset = 0;
    if let Some((&first, rest)) = prompt.split_first() {
        let text = tok.decode(&[first]);
        out.text_offset.push(0);
        *offset = text.chars().count() as u32;
        out.tokens.push(text);
        out.token_logprobs.push(None);
        out.top_logprobs.push(None);
        completion_into(tok, rest, prompt_lps, offset, &mut out);
    }
    completion_into(tok, ids, lps, offset, &mut out);
    out
}

/// Appends `ids` and their log probabilities to `out` in the completions shape.
fn completion_into(
    tok: &dyn Tokenizer,
    ids: &[u32],
    lps: &[v1::TokenLogprobs],
    offset: &mut u32,
    out: &mut CompletionLogprobs,
) {
    for (&id, lp) in ids.iter().zip(lps) {
        let text = tok.decode(&[id]);
        let logprob = finite(lp.logprob);
        let mut top = TopLogprobs(Vec::with_capacity(lp.top_ids.len() + 1));
        for (alt, l) in alternatives(lp) {
            let t = tok.decode(&[alt]);
            if !top.0.iter().any(|(s, _)| *s == t) {
                top.0.push((t, l));
            }
        }
        // The drawn token is always among them (so up to `logprobs` + 1 entries), as OpenAI's
        // legacy API lists it.
        if !top.0.iter().any(|(s, _)| *s == text) {
            top.0.push((text.clone(), logprob));
        }
        out.text_offset.push(*offset);
        *offset += text.chars().count() as u32;
        out.tokens.push(text);
        out.token_logprobs.push(Some(logprob));
        out.top_logprobs.push(Some(top));
    }
}

/// The chat shape of `ids` and their log probabilities (pairs past the shorter list are left
/// out).
pub(crate) fn chat(tok: &dyn Tokenizer, ids: &[u32], lps: &[v1::TokenLogprobs]) -> ChatLogprobs {
    let entry = |id: u32| {
        let token = tok.decode(&[id]);
        let bytes = token.as_bytes().to_vec();
        (token, bytes)
    };
    ChatLogprobs {
        content: ids
            .iter()
            .zip(lps)
            .map(|(&id, lp)| {
                let (token, bytes) = entry(id);
                ChatTokenLogprob {
                    token,
                    logprob: finite(lp.logprob),
                    bytes,
                    top_logprobs: alternatives(lp)
                        .map(|(alt, logprob)| {
                            let (token, bytes) = entry(alt);
                            ChatTopLogprob {
                                token,
                                logprob,
                                bytes,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::SimTokenizer;

    fn lp(logprob: f32, top: &[(u32, f32)]) -> v1::TokenLogprobs {
        v1::TokenLogprobs {
            logprob,
            top_ids: top.iter().map(|t| t.0).collect(),
            top_logprobs: top.iter().map(|t| t.1).collect(),
            rank: 0,
        }
    }

    #[test]
    fn prompt_scores_list_the_prompts_token_then_the_others() {
        let tok = SimTokenizer;
        let ids = tok.encode("abc");
        let [a, b, c] = ids[..] else {
            panic!("{ids:?}")
        };
        // The second token is the likeliest (ranked from its place), the third is not listed.
        let lps = [lp(-0.1, &[(b, -0.1), (c, -2.5)]), lp(-3.0, &[(a, -0.2)])];
        let out = prompt(&tok, &[a, b, c], &lps);
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object().expect("object").keys().cloned().collect()
        };
        assert!(out[0].is_null());
        assert_eq!(keys(&out[1]), [b.to_string(), c.to_string()]);
        assert_eq!(out[1][b.to_string()]["rank"], 1);
        assert_eq!(out[1][c.to_string()]["rank"], 2);
        assert_eq!(out[1][c.to_string()]["decoded_token"], "c");
        assert_eq!(keys(&out[2]), [c.to_string(), a.to_string()]);
        assert_eq!(out[2][c.to_string()]["rank"], 0);
        assert_eq!(out[2][c.to_string()]["logprob"], -3.0);
        assert!(prompt(&tok, &[], &[]).is_empty());
    }

    #[test]
    fn completions_list_the_drawn_token_among_the_alternatives_and_offsets() {
        let tok = SimTokenizer;
        let ids = tok.encode("ab");
        let steps = [
            lp(-0.5, &[(ids[0], -0.5), (ids[1], -1.5)]),
            // Drawn though not among the most likely; a token with no chance at all.
            lp(f32::NEG_INFINITY, &[(ids[0], -0.1)]),
        ];
        let mut offset = 3;
        let out = completion(&tok, &ids, &steps, &mut offset);
        assert_eq!(out.tokens, vec!["a", "b"]);
        assert_eq!(out.token_logprobs, vec![Some(-0.5), Some(FLOOR)]);
        assert_eq!(out.text_offset, vec![3, 4]);
        assert_eq!(offset, 5);
        assert_eq!(
            out.top_logprobs[0].as_ref().unwrap().0,
            vec![("a".to_string(), -0.5), ("b".to_string(), -1.5)]
        );
        assert_eq!(
            out.top_logprobs[1].as_ref().unwrap().0,
            vec![("a".to_string(), -0.1), ("b".to_string(), FLOOR)]
        );
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(
            json["top_logprobs"][0],
            serde_json::json!({"a": -0.5, "b": -1.5})
        );
    }

    #[test]
    fn an_echoed_prompt_starts_with_a_token_without_probability() {
        let tok = SimTokenizer;
        let ids = tok.encode("xyz");
        let steps = [lp(-1.0, &[(ids[1], -1.0)]), lp(-2.0, &[(ids[0], -0.5)])];
        let mut offset = 99;
        let out = completion_with_prompt(&tok, (&ids, &steps), &[], &[], &mut offset);
        assert_eq!(out.tokens, vec!["x", "y", "z"]);
        assert_eq!(out.text_offset, vec![0, 1, 2]);
        assert_eq!(offset, 3);
        assert_eq!(out.token_logprobs, vec![None, Some(-1.0), Some(-2.0)]);
        assert!(out.top_logprobs[0].is_none());
        let json = serde_json::to_value(&out).unwrap();
        assert!(json["token_logprobs"][0].is_null(), "{json}");
        assert_eq!(
            json["top_logprobs"][2],
            serde_json::json!({"x": -0.5, "z": -2.0})
        );
    }

    #[test]
    fn chat_lists_text_bytes_and_exactly_the_alternatives() {
        let tok = SimTokenizer;
        let ids = tok.encode("hi");
        let steps = [lp(-0.25, &[(ids[0], -0.25)]), lp(-2.0, &[])];
        let out = chat(&tok, &ids, &steps);
        assert_eq!(out.content.len(), 2);
        assert_eq!(out.content[0].token, "h");
        assert_eq!(out.content[0].bytes, b"h".to_vec());
        assert_eq!(out.content[0].top_logprobs.len(), 1);
        assert_eq!(out.content[1].logprob, -2.0);
        assert!(out.content[1].top_logprobs.is_empty());
        // A worker that sent fewer entries than tokens: only the pairs.
        assert_eq!(chat(&tok, &ids, &steps[..1]).content.len(), 1);
    }
}

//! Turning a request's wire fields into an engine request, refusing what the engine cannot serve
//! with a message that says which field is wrong.

use dolphin_engine::{EngineInfo, Format, HandoffChoice, LogitRules, Sampling, SeqRequest};
use dolphin_proto::v1;

/// A request field the worker refuses (INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

impl From<BadRequest> for tonic::Status {
    fn from(err: BadRequest) -> Self {
        tonic::Status::invalid_argument(err.0)
    }
}

/// Validates the fields shared by `Prefill` and `Decode` and builds the engine request.
///
/// Stop strings are not applied here: workers see token ids only, and the router, which holds
/// the tokenizer, matches stop strings on the text it streams (and cancels the request).
pub fn seq_request(
    request_id: String,
    token_ids: Vec<u32>,
    sampling: Option<v1::SamplingParams>,
    info: &EngineInfo,
) -> Result<SeqRequest, BadRequest> {
    if request_id.is_empty() {
        // The engine cancels by request id: an empty one would be ambiguous.
        return Err(BadRequest("request_id is required".into()));
    }
    if token_ids.is_empty() {
        return Err(BadRequest("token_ids is empty".into()));
    }
    if let Some((i, t)) = token_ids
        .iter()
        .enumerate()
        .find(|(_, t)| **t >= info.vocab_size)
    {
        return Err(BadRequest(format!(
            "token_ids[{i}] = {t} is outside the vocabulary (size {})",
            info.vocab_size
        )));
    }
    let params = sampling.unwrap_or_default();
    if let Err(e) = dolphin_proto::sampling::check_logit_rules(&params, info.vocab_size) {
        return Err(BadRequest(format!("sampling.{e}")));
    }
    if params.prompt_logprobs.is_some() && info.engine == "sim" {
        // A sim token is a function of the text before it: the prompt's own tokens have no
        // probability under it worth reporting.
        return Err(BadRequest(
            "sampling.prompt_logprobs: the sim engine computes no probabilities for given tokens"
                .into(),
        ));
    }
    if params.structured.is_some() && info.engine == "sim" {
        // A sim token is a function of the text before it: there is no distribution to mask.
        return Err(BadRequest(
            "sampling.structured: the sim engine cannot follow a format".into(),
        ));
    }
    if params.output_in_prompt as usize >= token_ids.len() {
        return Err(BadRequest(format!(
            "sampling.output_in_prompt ({}) must be less than the number of token_ids ({})",
            params.output_in_prompt,
            token_ids.len()
        )));
    }
    Ok(SeqRequest {
        request_id,
        prompt: token_ids,
        sampling: sampling_from(&params)?,
    })
}

/// The logit rules of `params` (checked by
/// [`check_logit_rules`](dolphin_proto::sampling::check_logit_rules)).
fn logits_rules(params: &v1::LogitRules) -> LogitRules {
    let mut bias: Vec<(u32, f32)> = params
        .logit_bias
        .iter()
        .filter(|(_, b)| **b != 0.0)
        .map(|(&t, &b)| (t, b))
        .collect();
    // The wire's map has no order; a sorted list keeps every run the same.
    bias.sort_unstable_by_key(|&(t, _)| t);
    let mut allowed = params.allowed_token_ids.clone();
    allowed.sort_unstable();
    allowed.dedup();
    LogitRules {
        bias,
        // 0 (unset on the wire) and 1 are no penalty.
        repetition_penalty: Some(params.repetition_penalty).filter(|&r| r != 0.0 && r != 1.0),
        presence_penalty: params.presence_penalty,
        frequency_penalty: params.frequency_penalty,
        min_p: Some(params.min_p).filter(|&p| p > 0.0),
        allowed,
        bad_words: params
            .bad_words
            .iter()
            .filter(|w| !w.ids.is_empty())
            .map(|w| w.ids.clone())
            .collect(),
    }
}

/// The engine's sampling settings for the wire's.
pub fn sampling_from(params: &v1::SamplingParams) -> Result<Sampling, BadRequest> {
    if params.max_tokens == 0 {
        return Err(BadRequest("sampling.max_tokens must be at least 1".into()));
    }
    if params.replay_output_tokens == Some(0) {
        return Err(BadRequest(
            "sampling.replay_output_tokens must be at least 1".into(),
        ));
    }
    if !params.temperature.is_finite() || params.temperature < 0.0 {
        return Err(BadRequest(format!(
            "sampling.temperature must be a finite number >= 0, got {}",
            params.temperature
        )));
    }
    // The wire (proto3) says 0 means unset; 1.0 keeps every token too: both are off.
    let top_p = match params.top_p {
        p if p == 0.0 || p == 1.0 => None,
        p if p > 0.0 && p < 1.0 => Some(p),
        p => {
            return Err(BadRequest(format!(
                "sampling.top_p must be in (0, 1], got {p}"
            )));
        }
    };
    let format = params
        .structured
        .as_deref()
        .map(Format::from_wire)
        .transpose()
        .map_err(|e| BadRequest(format!("sampling.structured.{e}")))?;
    if format.is_some() && params.ignore_eos {
        // A complete format ends the output; past it nothing may be drawn.
        return Err(BadRequest(
            "sampling.ignore_eos cannot be set with sampling.structured".into(),
        ));
    }
    let rules = params.logits.as_deref();
    let mut stop_token_ids = rules.map(|r| r.stop_token_ids.clone()).unwrap_or_default();
    stop_token_ids.sort_unstable();
    stop_token_ids.dedup();
    Ok(Sampling {
        temperature: params.temperature,
        // 0 on the wire: unset.
        top_k: std::num::NonZeroU32::new(params.top_k),
        top_p,
        seed: params.seed,
        max_tokens: params.max_tokens,
        ignore_eos: params.ignore_eos,
        stop_token_ids,
        handoff: params.handoff.as_ref().map(|h| HandoffChoice {
            algorithm: h.algorithm.clone(),
            threshold: h.threshold,
        }),
        end_after: params.replay_output_tokens,
        logits: rules.map(logits_rules).unwrap_or_default(),
        min_tokens: rules.map_or(0, |r| r.min_tokens),
        logprobs: params.logprobs,
        prompt_logprobs: params.prompt_logprobs,
        format,
        format_after: params
            .structured
            .as_deref()
            .map(|s| s.after_tokens.clone())
            .unwrap_or_default(),
        output_in_prompt: params.output_in_prompt,
        priority: params.priority,
        cache_root: (!params.cache_salt.is_empty())
            .then(|| dolphin_cluster::salted_root(&params.cache_salt)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> EngineInfo {
        EngineInfo {
            model: "m".into(),
            engine: "sim",
            block_size: 16,
            total_blocks: 64,
            kv_bytes_per_token: 8,
            kv_layout: "test".into(),
            context_length: 4096,
            vocab_size: 100,
            eos_token_id: None,
            step_limits: None,
        }
    }

    fn params(max_tokens: u32) -> v1::SamplingParams {
        v1::SamplingParams {
            max_tokens,
            ..Default::default()
        }
    }

    #[test]
    fn builds_an_engine_request() {
        let mut p = params(8);
        p.seed = Some(42);
        p.top_k = 5;
        p.ignore_eos = true;
        let req = seq_request("r1".into(), vec![3, 4, 99], Some(p), &info()).expect("valid");
        assert_eq!(req.request_id, "r1");
        assert_eq!(req.prompt, vec![3, 4, 99]);
        assert_eq!(req.sampling.max_tokens, 8);
        assert_eq!(req.sampling.seed, Some(42));
        assert_eq!(req.sampling.top_k, std::num::NonZeroU32::new(5));
        assert_eq!(req.sampling.top_p, None, "0 means unset");
        assert!(req.sampling.ignore_eos);
        let unset = seq_request("r2".into(), vec![3], Some(params(1)), &info()).expect("valid");
        assert_eq!((unset.sampling.top_k, unset.sampling.top_p), (None, None));
        let mut p = params(1);
        p.top_p = 0.9;
        let req = seq_request("r3".into(), vec![3], Some(p), &info()).expect("valid");
        assert_eq!(req.sampling.top_p, Some(0.9));
    }

    #[test]
    fn refuses_what_the_engine_cannot_serve() {
        let i = info();
        let bad = |id: &str, tokens: Vec<u32>, p: Option<v1::SamplingParams>| {
            seq_request(id.into(), tokens, p, &i)
                .expect_err("refused")
                .0
        };
        assert!(bad("", vec![1], Some(params(1))).contains("request_id"));
        assert!(bad("r", vec![], Some(params(1))).contains("empty"));
        assert!(bad("r", vec![1, 100], Some(params(1))).contains("token_ids[1] = 100"));
        assert!(bad("r", vec![1], None).contains("max_tokens"));
        let mut hot = params(1);
        hot.temperature = f32::NAN;
        assert!(bad("r", vec![1], Some(hot)).contains("temperature"));
        let mut wide = params(1);
        wide.top_p = 1.5;
        assert!(bad("r", vec![1], Some(wide)).contains("top_p"));
        let refused = |f: fn(&mut v1::LogitRules), needle: &str| {
            let mut p = params(4);
            let mut rules = v1::LogitRules::default();
            f(&mut rules);
            p.logits = Some(Box::new(rules));
            let msg = bad("r", vec![1], Some(p));
            assert!(msg.contains(needle), "{msg:?} should name {needle}");
        };
        refused(|p| p.repetition_penalty = -1.0, "repetition_penalty");
        refused(
            |p| p.repetition_penalty = f32::INFINITY,
            "repetition_penalty",
        );
        refused(|p| p.presence_penalty = 2.5, "presence_penalty");
        refused(|p| p.frequency_penalty = f32::NAN, "frequency_penalty");
        refused(|p| p.min_p = 1.5, "min_p");
        refused(|p| p.min_tokens = 5, "min_tokens");
        refused(
            |p| p.stop_token_ids = vec![3, 100],
            "stop_token_ids names token 100",
        );
        refused(
            |p| _ = p.logit_bias.insert(100, 1.0),
            "logit_bias names token 100",
        );
        refused(
            |p| _ = p.logit_bias.insert(7, -101.0),
            "logit_bias for token 7",
        );
    }

    #[test]
    fn a_format_reaches_the_engine_and_what_cannot_follow_one_is_refused() {
        use dolphin_engine::Format;
        let structured = |p: &mut v1::SamplingParams, f: Format| {
            p.structured = Some(Box::new(f.to_wire()));
        };
        let candle = EngineInfo {
            engine: "candle",
            ..info()
        };
        let mut p = params(4);
        structured(&mut p, Format::Regex("[0-9]+".into()));
        p.output_in_prompt = 2;
        let s = seq_request("r".into(), vec![1, 2, 3], Some(p.clone()), &candle)
            .expect("valid")
            .sampling;
        assert_eq!(s.format, Some(Format::Regex("[0-9]+".into())));
        assert_eq!(s.output_in_prompt, 2);
        assert!(s.format_after.is_empty());
        // After a reasoning model's thinking.
        let mut gated = p.clone();
        if let Some(f) = gated.structured.as_mut() {
            f.after_tokens = vec![7, 8];
        }
        let s = seq_request("r".into(), vec![1, 2, 3], Some(gated), &candle)
            .expect("valid")
            .sampling;
        assert_eq!(s.format_after, vec![7, 8]);
        let bad = |p: v1::SamplingParams, tokens: Vec<u32>, i: &EngineInfo| {
            seq_request("r".into(), tokens, Some(p), i)
                .expect_err("refused")
                .0
        };
        assert!(bad(p.clone(), vec![1, 2], &candle).contains("output_in_prompt (2)"));
        assert!(bad(p.clone(), vec![1, 2, 3], &info()).contains("sim engine cannot follow"));
        let mut forever = p.clone();
        forever.ignore_eos = true;
        assert!(bad(forever, vec![1, 2, 3], &candle).contains("ignore_eos"));
        let mut empty = p;
        empty.structured = Some(Box::default());
        assert!(bad(empty, vec![1, 2, 3], &candle).contains("sampling.structured"));
    }

    #[test]
    fn maps_the_logit_rules() {
        let mut p = params(4);
        p.logits = Some(Box::new(v1::LogitRules {
            repetition_penalty: 1.2,
            presence_penalty: -0.5,
            frequency_penalty: 2.0,
            min_p: 0.05,
            min_tokens: 4,
            stop_token_ids: vec![9, 3, 9],
            logit_bias: [(9, 1.5), (2, -100.0), (5, 0.0)].into_iter().collect(),
            allowed_token_ids: vec![7, 3, 7],
            bad_words: vec![
                v1::TokenIds { ids: vec![4, 5] },
                v1::TokenIds { ids: vec![6] },
            ],
        }));
        let s = seq_request("r".into(), vec![1], Some(p), &info())
            .expect("valid")
            .sampling;
        assert_eq!(s.stop_token_ids, vec![3, 9]);
        assert_eq!(s.min_tokens, 4);
        assert_eq!(
            s.logits,
            LogitRules {
                bias: vec![(2, -100.0), (9, 1.5)],
                repetition_penalty: Some(1.2),
                presence_penalty: -0.5,
                frequency_penalty: 2.0,
                min_p: Some(0.05),
                allowed: vec![3, 7],
                bad_words: vec![vec![4, 5], vec![6]],
            }
        );
        // 0 (unset on the wire) and 1 are no repetition penalty.
        let mut one = params(1);
        one.logits = Some(Box::new(v1::LogitRules {
            repetition_penalty: 1.0,
            ..Default::default()
        }));
        let s = seq_request("r".into(), vec![1], Some(one), &info()).expect("valid");
        assert!(s.sampling.logits.is_empty());
    }

    #[test]
    fn bad_request_is_invalid_argument() {
        let status = tonic::Status::from(BadRequest("x".into()));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "x");
    }
}

//! Turning a request's wire fields into an engine request, refusing what the engine cannot serve
//! with a message that says which field is wrong.

use dolphin_engine::{EngineInfo, HandoffChoice, Sampling, SeqRequest};
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
    Ok(SeqRequest {
        request_id,
        prompt: token_ids,
        sampling: sampling_from(&params)?,
    })
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
    Ok(Sampling {
        temperature: params.temperature,
        // 0 on the wire: unset.
        top_k: std::num::NonZeroU32::new(params.top_k),
        top_p,
        seed: params.seed,
        max_tokens: params.max_tokens,
        ignore_eos: params.ignore_eos,
        stop_token_ids: Vec::new(),
        handoff: params.handoff.as_ref().map(|h| HandoffChoice {
            algorithm: h.algorithm.clone(),
            threshold: h.threshold,
        }),
        end_after: params.replay_output_tokens,
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
    }

    #[test]
    fn bad_request_is_invalid_argument() {
        let status = tonic::Status::from(BadRequest("x".into()));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "x");
    }
}

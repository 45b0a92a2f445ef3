//! `dolphinctl request`: one streamed `Inference.Generate` call, text printed as it arrives.

use std::io::Write;

use dolphin_proto::v1::generate_request::Input;
use dolphin_proto::v1::inference_client::InferenceClient;
use dolphin_proto::v1::{
    FinishReason, GenerateRequest, PrefillMode, PrefillPath, RoutingInfo, SamplingParams, Timings,
    TokenLogprobs, Usage,
};

use crate::cli::{Mode, RequestArgs};
use crate::client;
use crate::error::CtlError;

/// What a finished request produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestOutcome {
    /// The id the router reported.
    pub request_id: String,
    /// The concatenated text.
    pub text: String,
    /// Every token id, in order.
    pub token_ids: Vec<u32>,
    /// The finish reason of the last message.
    pub finish_reason: Option<FinishReason>,
    /// Token counts (last message).
    pub usage: Option<Usage>,
    /// Where the time went (last message).
    pub timings: Option<Timings>,
    /// How the router served it (the latest message that carried it).
    pub routing: Option<RoutingInfo>,
    /// Each token's log probabilities, where the request asked for them.
    pub logprobs: Vec<TokenLogprobs>,
}

/// The wire request for the command's arguments.
pub fn build_request(args: &RequestArgs) -> GenerateRequest {
    GenerateRequest {
        model: args.model.clone().unwrap_or_default(),
        input: Some(Input::Text(args.prompt.clone())),
        sampling: Some(SamplingParams {
            temperature: args.temperature,
            max_tokens: args.max_tokens,
            ignore_eos: args.ignore_eos,
            logprobs: args.logprobs,
            ..SamplingParams::default()
        }),
        force_mode: match args.mode {
            None => PrefillMode::Unspecified,
            Some(Mode::Local) => PrefillMode::Local,
            Some(Mode::Remote) => PrefillMode::Remote,
        } as i32,
        ..GenerateRequest::default()
    }
}

/// Sends the request and writes each text delta to `out` as it arrives.
pub async fn run(args: &RequestArgs, out: &mut impl Write) -> Result<RequestOutcome, CtlError> {
    let mut inference = InferenceClient::new(client::connect(&args.router_grpc).await?);
    let mut stream = inference
        .generate(build_request(args))
        .await
        .map_err(|s| CtlError::rpc("Generate", s))?
        .into_inner();
    let mut outcome = RequestOutcome::default();
    while let Some(msg) = stream
        .message()
        .await
        .map_err(|s| CtlError::rpc("Generate", s))?
    {
        if outcome.request_id.is_empty() {
            outcome.request_id = msg.request_id.clone();
        }
        out.write_all(msg.text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(CtlError::Output)?;
        outcome.text.push_str(&msg.text);
        outcome.token_ids.extend_from_slice(&msg.token_ids);
        outcome.logprobs.extend(msg.logprobs);
        if let Ok(reason) = FinishReason::try_from(msg.finish_reason)
            && reason != FinishReason::Unspecified
        {
            outcome.finish_reason = Some(reason);
        }
        if msg.usage.is_some() {
            outcome.usage = msg.usage;
        }
        if msg.timings.is_some() {
            outcome.timings = msg.timings;
        }
        if msg.routing.is_some() {
            outcome.routing = msg.routing;
        }
    }
    Ok(outcome)
}

/// One line per token with its log probabilities: position, id, log probability, then the
/// alternatives as `id:logprob` (empty when the request asked for none).
pub fn logprob_lines(o: &RequestOutcome) -> Vec<String> {
    o.token_ids
        .iter()
        .zip(&o.logprobs)
        .enumerate()
        .map(|(i, (id, lp))| {
            let mut line = format!("{i}\t{id}\t{:.4}", lp.logprob);
            for (alt, l) in lp.top_ids.iter().zip(&lp.top_logprobs) {
                line.push_str(&format!("\t{alt}:{l:.4}"));
            }
            line
        })
        .collect()
}

/// One line about how the request went: finish reason, token counts, path, workers, timings.
pub fn describe(o: &RequestOutcome) -> String {
    let mut parts = vec![format!(
        "finish={}",
        o.finish_reason
            .map_or("none", |r| r
                .as_str_name()
                .trim_start_matches("FINISH_REASON_"))
            .to_lowercase()
    )];
    if let Some(u) = &o.usage {
        parts.push(format!(
            "prompt_tokens={} completion_tokens={} cached_tokens={}",
            u.prompt_tokens, u.completion_tokens, u.cached_tokens
        ));
    } else {
        parts.push(format!("tokens={}", o.token_ids.len()));
    }
    if let Some(r) = &o.routing {
        let mode = PrefillMode::try_from(r.mode).map_or("unknown", |m| match m {
            PrefillMode::Local => "local",
            PrefillMode::Remote => "remote",
            PrefillMode::Unspecified => "unspecified",
        });
        parts.push(format!("mode={mode} decode={}", r.decode_worker));
        if !r.prefill_worker.is_empty() {
            parts.push(format!("prefill={}", r.prefill_worker));
        }
        match PrefillPath::try_from(r.path) {
            Ok(PrefillPath::LocalHeld) => parts.push("path=local_held".to_owned()),
            Ok(PrefillPath::LocalFallback) => parts.push("path=local_fallback".to_owned()),
            _ if r.fell_back => parts.push("fell_back=true".to_owned()),
            _ => {}
        }
    }
    if let Some(t) = &o.timings {
        parts.push(format!(
            "ttft={:.1}ms tpot={:.2}ms e2e={:.1}ms",
            t.ttft_us as f64 / 1e3,
            t.tpot_us as f64 / 1e3,
            t.e2e_us as f64 / 1e3
        ));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(mode: Option<Mode>) -> RequestArgs {
        RequestArgs {
            prompt: "hello".to_owned(),
            max_tokens: 7,
            router_grpc: "127.0.0.1:1".to_owned(),
            mode,
            model: None,
            temperature: 0.0,
            ignore_eos: true,
            logprobs: Some(2),
        }
    }

    #[test]
    fn request_carries_prompt_limits_and_mode() {
        let req = build_request(&args(Some(Mode::Remote)));
        assert_eq!(req.input, Some(Input::Text("hello".to_owned())));
        let sampling = req.sampling.unwrap();
        assert_eq!(sampling.max_tokens, 7);
        assert!(sampling.ignore_eos);
        assert_eq!(sampling.logprobs, Some(2));
        assert_eq!(req.force_mode, PrefillMode::Remote as i32);
        assert_eq!(
            build_request(&args(None)).force_mode,
            PrefillMode::Unspecified as i32
        );
    }

    #[test]
    fn logprob_lines_list_each_token_and_its_alternatives() {
        let outcome = RequestOutcome {
            token_ids: vec![7, 9],
            logprobs: vec![
                TokenLogprobs {
                    logprob: -0.5,
                    top_ids: vec![7, 3],
                    top_logprobs: vec![-0.5, -1.25],
                    ..TokenLogprobs::default()
                },
                TokenLogprobs {
                    logprob: -2.0,
                    ..TokenLogprobs::default()
                },
            ],
            ..RequestOutcome::default()
        };
        assert_eq!(
            logprob_lines(&outcome),
            vec!["0\t7\t-0.5000\t7:-0.5000\t3:-1.2500", "1\t9\t-2.0000"]
        );
        assert!(logprob_lines(&RequestOutcome::default()).is_empty());
    }

    #[test]
    fn description_names_path_and_workers() {
        let outcome = RequestOutcome {
            finish_reason: Some(FinishReason::Length),
            usage: Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 7,
                cached_tokens: 0,
                ..Default::default()
            }),
            routing: Some(RoutingInfo {
                decode_worker: "decode-1".to_owned(),
                prefill_worker: "prefill-1".to_owned(),
                mode: PrefillMode::Remote as i32,
                fell_back: true,
                path: PrefillPath::LocalFallback as i32,
                ..RoutingInfo::default()
            }),
            ..RequestOutcome::default()
        };
        let line = describe(&outcome);
        assert!(line.starts_with("finish=length"), "{line}");
        assert!(line.contains("completion_tokens=7"), "{line}");
        assert!(line.contains("mode=remote decode=decode-1 prefill=prefill-1"));
        assert!(line.contains("path=local_fallback"), "{line}");
    }
}

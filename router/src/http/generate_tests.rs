//! SGLang's native `/generate` end to end over HTTP against a fake worker: one prompt or a
//! batch, text or token ids, whole or streamed (text and ids so far in every event),
//! SGLang's finish reasons and log-probability triples, its sampling fields, and refusals.

use super::*;

async fn generate(addr: SocketAddr, body: Value) -> (StatusCode, String) {
    let (status, _, body) = post(addr, "/generate", body).await;
    (status, body)
}

#[tokio::test]
async fn one_prompt_answers_text_ids_and_meta_info() {
    let (fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let (status, body) = generate(
        s.addr,
        json!({"text": "hi", "sampling_params": {"max_new_tokens": 3, "temperature": 0}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(v["text"], "abc", "{v}");
    assert_eq!(v["output_ids"], json!(SimTokenizer.encode("abc")), "{v}");
    let meta = &v["meta_info"];
    assert_eq!(
        meta["finish_reason"],
        json!({"type": "length", "length": 3})
    );
    assert_eq!(meta["prompt_tokens"], 2);
    assert_eq!(meta["completion_tokens"], 3);
    assert!(meta["id"].as_str().is_some_and(|id| !id.is_empty()), "{v}");
    assert!(meta["e2e_latency"].as_f64().is_some_and(|s| s > 0.0), "{v}");
    assert!(meta.get("output_token_logprobs").is_none(), "{v}");

    // SGLang's default answer length is 128 tokens (here the server's limit, 64), not
    // OpenAI's 16; its sampling fields reach the worker under their own meanings.
    let (status, body) = generate(
        s.addr,
        json!({"text": "hi", "sampling_params": {
            "min_new_tokens": 2, "stop_token_ids": [7], "top_k": 5, "sampling_seed": 9,
            "ignore_eos": true, "stream_interval": 4}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let calls = fake.state.calls.lock();
    let sampling = calls[1].sampling.as_ref().expect("sampling");
    assert_eq!(sampling.max_tokens, 64);
    assert_eq!(sampling.top_k, 5);
    assert_eq!(sampling.seed, Some(9));
    assert!(sampling.ignore_eos);
    let rules = sampling.logits.as_ref().expect("logit rules");
    assert_eq!(rules.min_tokens, 2);
    assert_eq!(rules.stop_token_ids, [7]);
}

#[tokio::test]
async fn a_batch_and_n_answer_a_list_in_order() {
    let (fake, _d, s) = with_worker(Behavior::Text("xyz".into())).await;
    let (status, body) = generate(
        s.addr,
        json!({"text": ["a", "bb"], "sampling_params": {"max_new_tokens": 2, "n": 2}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    let outs = v.as_array().expect("a list");
    assert_eq!(outs.len(), 4, "{v}");
    // Prompt `p`'s `i`th generation is answer `p * n + i`.
    let prompts: Vec<u64> = outs
        .iter()
        .map(|o| o["meta_info"]["prompt_tokens"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(prompts, [1, 1, 2, 2], "{v}");
    assert!(outs.iter().all(|o| o["text"] == "xy"), "{v}");
    assert_eq!(fake.state.calls.lock().len(), 4);

    // Token ids, one prompt or a batch; a sampling object per prompt.
    let (status, body) = generate(
        s.addr,
        json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert!(v.is_object(), "{v}");
    assert_eq!(v["meta_info"]["prompt_tokens"], 3);
    let (status, body) = generate(
        s.addr,
        json!({"input_ids": [[1, 2], [3]], "sampling_params": [
            {"max_new_tokens": 1}, {"max_new_tokens": 3}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(v[0]["text"], "x", "{v}");
    assert_eq!(v[1]["text"], "xyz", "{v}");
}

#[tokio::test]
async fn streams_carry_the_text_and_ids_so_far() {
    let (_fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let (status, body) = generate(
        s.addr,
        json!({"text": "hi", "sampling_params": {"max_new_tokens": 3}, "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let events: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
    // However the worker's messages were gathered, each event holds all before it.
    let (last, earlier) = events.split_last().expect("events");
    let mut seen = String::new();
    for e in &events {
        let text = e["text"].as_str().expect("text");
        assert!(text.starts_with(&seen) && text.len() > seen.len(), "{body}");
        let ids = e["output_ids"].as_array().map_or(0, Vec::len);
        assert_eq!(ids, text.len(), "{body}");
        seen = text.to_owned();
    }
    assert_eq!(last["text"], "abc", "{body}");
    assert!(
        earlier
            .iter()
            .all(|e| e["meta_info"]["finish_reason"].is_null())
    );
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
    assert_eq!(last["meta_info"]["completion_tokens"], 3);
    assert!(events.iter().all(|e| e.get("index").is_none()), "{body}");

    // A batch's events say whose they are.
    let (status, body) = generate(
        s.addr,
        json!({"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}, "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    let events: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
    for index in 0..2 {
        let last = events
            .iter()
            .rfind(|e| e["index"] == index)
            .expect("events of each");
        assert_eq!(last["text"], "ab", "{body}");
        assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
    }
}

#[tokio::test]
async fn stops_name_what_matched() {
    let ids = SimTokenizer.encode("ok");
    let (_fake, _d, s) = with_worker(Behavior::Tokens(ids.clone())).await;
    let (status, body) = generate(s.addr, json!({"text": "hey"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(
        v["meta_info"]["finish_reason"],
        json!({"type": "stop", "matched": ids[1]}),
        "{v}"
    );
    // A stop string is named by its text.
    let (status, body) = generate(
        s.addr,
        json!({"text": "hey", "sampling_params": {"stop": "k"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(v["text"], "o", "{v}");
    assert_eq!(
        v["meta_info"]["finish_reason"],
        json!({"type": "stop", "matched": "k"}),
        "{v}"
    );
}

#[tokio::test]
async fn logprobs_come_as_triples() {
    let ids = SimTokenizer.encode("ok");
    let (fake, _d, s) = with_worker(Behavior::Text("ok".into())).await;
    let (status, body) = generate(
        s.addr,
        json!({"text": "hey", "sampling_params": {"max_new_tokens": 2},
            "return_logprob": true, "top_logprobs_num": 2, "return_text_in_logprobs": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    let meta = &v["meta_info"];
    let lp = |id: u32| crate::testutil::fake_logprobs(id, 2);
    let out = &meta["output_token_logprobs"];
    assert_eq!(out[0], json!([lp(ids[0]).logprob, ids[0], "o"]), "{v}");
    assert_eq!(out.as_array().map(Vec::len), Some(2), "{v}");
    let top = &meta["output_top_logprobs"][1];
    assert_eq!(top.as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(top[0][1], lp(ids[1]).top_ids[0]);
    // By default the prompt's last token only, whose log probability SGLang does not report
    // (the first position reported never has one): the worker is not asked for the prompt's.
    let prompt = SimTokenizer.encode("hey");
    let input = meta["input_token_logprobs"].as_array().expect("input");
    assert_eq!(input, &[json!([null, prompt[2], "y"])], "{v}");
    assert_eq!(
        fake.state.calls.lock()[0]
            .sampling
            .as_ref()
            .and_then(|s| s.prompt_logprobs),
        None
    );

    // From the first token: its log probability is unknown (null), as SGLang writes it.
    let (_, body) = generate(
        s.addr,
        json!({"text": "hey", "return_logprob": true, "logprob_start_len": 0}),
    )
    .await;
    let v = parse(&body);
    let input = v["meta_info"]["input_token_logprobs"]
        .as_array()
        .expect("input");
    assert_eq!(input.len(), 3, "{v}");
    assert_eq!(input[0], json!([null, prompt[0], null]), "{v}");
    assert!(v["meta_info"].get("input_top_logprobs").is_none(), "{v}");

    // `max_new_tokens: 0` prefills only (how SGLang's frontend scores choices and caches a
    // prefix): the prompt's log probabilities, no output, whole or streamed.
    let score = json!({"text": "hey", "return_logprob": true, "logprob_start_len": 1,
        "sampling_params": {"max_new_tokens": 0}});
    let (status, body) = generate(s.addr, score.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    let meta = &v["meta_info"];
    assert_eq!(v["text"], "", "{v}");
    assert_eq!(v["output_ids"], json!([]), "{v}");
    assert_eq!(meta["completion_tokens"], 0, "{v}");
    assert_eq!(
        meta["finish_reason"],
        json!({"type": "length", "length": 0})
    );
    assert_eq!(meta["output_token_logprobs"], json!([]), "{v}");
    // From position 1: its log probability unknown, position 2's the model's.
    let input = meta["input_token_logprobs"].as_array().expect("input");
    assert_eq!(input.len(), 2, "{v}");
    assert_eq!(input[0], json!([null, prompt[1], null]), "{v}");
    let near = |v: &Value, want: f32| {
        v.as_f64()
            .is_some_and(|x| (x - f64::from(want)).abs() < 1e-6)
    };
    assert!(near(&input[1][0], lp(prompt[2]).logprob), "{v}");
    let mut streamed = score;
    streamed["stream"] = json!(true);
    let (status, body) = generate(s.addr, streamed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    let last = parse(&data[data.len() - 2]);
    assert_eq!(last["text"], "", "{body}");
    assert_eq!(last["meta_info"]["finish_reason"]["length"], 0, "{body}");
}

#[tokio::test]
async fn bad_requests_are_refused_by_name() {
    let (fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    for (body, needle) in [
        (json!({"sampling_params": {}}), "text or input_ids"),
        (json!({"text": "a", "input_ids": [1]}), "not both"),
        (json!({"text": ""}), "empty"),
        (json!({"text": []}), "empty"),
        (json!({"text": 5}), "text must be"),
        (json!({"input_ids": "a"}), "input_ids must be"),
        (
            json!({"text": "a", "sampling_params": {"max_new_token": 3}}),
            "max_new_token",
        ),
        (
            json!({"text": "a", "sampling_params": 3}),
            "sampling_params must be",
        ),
        (
            json!({"text": ["a", "b"], "sampling_params": [{}]}),
            "1 entries for 2",
        ),
        (json!({"text": "a", "lora_path": "adapter"}), "lora_path"),
        (json!({"text": "a", "image_data": ["x.png"]}), "image_data"),
        (json!({"text": "a", "frobnicate": 1}), "frobnicate"),
        (json!({"text": "a", "stream": "yes"}), "stream must be"),
        (
            json!({"text": "a", "sampling_params": {"temperature": -1}}),
            "temperature",
        ),
        (
            json!({"text": "a", "sampling_params": {"ebnf": "root ::= \"a\""}}),
            "ebnf",
        ),
        (
            json!({"text": "a", "sampling_params": {"json_schema": "{"}}),
            "json_schema",
        ),
        (
            json!({"text": "a", "sampling_params": {"n": 17}}),
            "at most 16",
        ),
    ] {
        let (status, text) = generate(s.addr, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {text}");
        let v = parse(&text);
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{body} -> {text}");
    }
    assert!(fake.state.calls.lock().is_empty(), "a refused request ran");

    // What asks for nothing is served: no adapter, no images, unknown fields left null.
    let (status, body) = generate(
        s.addr,
        json!({"text": "a", "lora_path": null, "image_data": null, "return_hidden_states": false,
            "custom_logit_processor": null, "later_field": null, "log_metrics": true,
            "sampling_params": {"max_new_tokens": 1, "json_schema": null}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, _, body) = call(s.addr, Method::GET, "/get_model_info", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(parse(&body)["is_generation"], true);
}

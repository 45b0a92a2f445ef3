//! Anthropic's Messages API end to end over HTTP against a fake worker: content blocks whole
//! and as Anthropic's events, stop reasons, token counting, `x-api-key` and errors in
//! Anthropic's shape.

use super::*;

const ANSWER: &str = "Hm.<tool_call>{\"name\": \"wx\", \"arguments\": {\"c\": 1}}</tool_call>";

fn request(stream: bool) -> Value {
    json!({
        "model": "sim-model",
        "max_tokens": ANSWER.len(),
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_0", "name": "wx", "input": {"c": 0}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_0", "content": "cold"},
                {"type": "text", "text": "And now?"}]},
        ],
        "tools": [{"name": "wx", "description": "Weather", "input_schema": {"type": "object"}}],
        "stream": stream,
    })
}

#[tokio::test]
async fn messages_answer_in_content_blocks() {
    let (fake, _d, s) = with_worker(Behavior::Text(ANSWER.into())).await;
    let (status, headers, body) = post(s.addr, "/v1/messages", request(false)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(headers.contains_key("x-request-id"));
    let v = parse(&body);
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
        "{v}"
    );
    assert_eq!(
        v["content"][0],
        json!({"type": "text", "text": "Hm."}),
        "{v}"
    );
    let call = &v["content"][1];
    assert_eq!(call["type"], "tool_use", "{v}");
    assert_eq!(call["name"], "wx");
    assert_eq!(call["input"], json!({"c": 1}));
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("toolu_")),
        "{v}"
    );
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let usage = &v["usage"];
    assert_eq!(usage["output_tokens"], ANSWER.len() as u64, "{v}");
    assert!(usage["input_tokens"].as_u64().is_some_and(|n| n > 0), "{v}");
    // The conversation the template saw: the system text, the earlier call and its result.
    let prompt = SimTokenizer.decode(&fake.state.calls.lock()[0].token_ids);
    assert!(prompt.contains("Be brief."), "{prompt}");
    assert!(prompt.contains(r#""arguments":{"c":0}"#), "{prompt}");
    assert!(prompt.contains("<|im_start|>tool\ncold"), "{prompt}");

    // Streamed: message_start, each block's start, deltas and stop, message_delta with the
    // stop reason and usage, message_stop; `event:` names each one's type.
    let (status, _, body) = post(s.addr, "/v1/messages", request(true)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (names, events): (Vec<&str>, Vec<Value>) = typed_events(&body).into_iter().unzip();
    let kinds: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| *n != "content_block_delta")
        .collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_stop",
            "content_block_start",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ],
        "{body}"
    );
    assert_eq!(events[0]["message"]["content"], json!([]));
    let text: String = events
        .iter()
        .filter(|e| e["delta"]["type"] == "text_delta")
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Hm.");
    let json: String = events
        .iter()
        .filter(|e| e["delta"]["type"] == "input_json_delta")
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&json).ok(),
        Some(json!({"c": 1}))
    );
    let end = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .expect("message_delta");
    assert_eq!(end["delta"]["stop_reason"], "tool_use");
    assert_eq!(end["usage"]["output_tokens"], ANSWER.len() as u64);

    // Cut off: max_tokens; a stop sequence: named.
    let short = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let v = parse(&post(s.addr, "/v1/messages", short).await.2);
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");
    *fake.state.behavior.lock() = Behavior::Text("abcdef".into());
    let stop = json!({"max_tokens": 6, "messages": [{"role": "user", "content": "hi"}],
        "stop_sequences": ["zz", "cd"]});
    let v = parse(&post(s.addr, "/v1/messages", stop).await.2);
    assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
    assert_eq!(v["stop_sequence"], "cd", "{v}");
    assert_eq!(v["content"][0]["text"], "ab", "{v}");

    // A forced call (`tool_choice` of type `tool`) ends in `tool_use` too, as Anthropic's own
    // API answers it (OpenAI's finish reason for a named call is `stop`); cut short, it is
    // still `max_tokens`.
    *fake.state.behavior.lock() = Behavior::Tokens(SimTokenizer.encode("{\"c\": 2}"));
    let mut forced = request(false);
    forced["tool_choice"] = json!({"type": "tool", "name": "wx"});
    forced["max_tokens"] = json!(64);
    let v = parse(&post(s.addr, "/v1/messages", forced.clone()).await.2);
    assert_eq!(v["content"][0]["type"], "tool_use", "{v}");
    assert_eq!(v["content"][0]["input"], json!({"c": 2}), "{v}");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    *fake.state.behavior.lock() = Behavior::Text("{\"c\": 2}".into());
    forced["max_tokens"] = json!(3);
    let v = parse(&post(s.addr, "/v1/messages", forced).await.2);
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");

    // Counting: the prompt's tokens, as the request would send them.
    let mut count = request(false);
    count.as_object_mut().expect("object").remove("max_tokens");
    let (status, _, body) = post(s.addr, "/v1/messages/count_tokens", count).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        parse(&body)["input_tokens"].as_u64(),
        Some(fake.state.calls.lock()[0].token_ids.len() as u64)
    );

    // Errors in Anthropic's shape, naming the field.
    for req in [
        json!({"messages": [{"role": "user", "content": "hi"}]}),
        json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
        json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "temperature": -1}),
    ] {
        let (status, _, body) = post(s.addr, "/v1/messages", req.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{req}: {body}");
        let v = parse(&body);
        assert_eq!(v["type"], "error", "{body}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}");
        assert!(v["error"]["message"].is_string(), "{body}");
    }
}

#[tokio::test]
async fn anthropic_clients_send_their_key_as_x_api_key() {
    let (_fake, d, _dir, keys) = keyed_worker("sk-one\n").await;
    let s = start_with_keys(d, Some(keys)).await;
    let body = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    for (key, want) in [
        (Some("sk-one"), StatusCode::OK),
        (Some("sk-two"), StatusCode::UNAUTHORIZED),
        (None, StatusCode::UNAUTHORIZED),
    ] {
        let mut headers = vec![
            ("content-type", "application/json"),
            ("anthropic-version", "2023-06-01"),
        ];
        headers.extend(key.map(|k| ("x-api-key", k)));
        let (status, _, text) = call_headers(
            s.addr,
            Method::POST,
            "/v1/messages",
            &headers,
            body.to_string(),
        )
        .await;
        assert_eq!(status, want, "{key:?}: {text}");
    }
}

//! HTTP handler tests over real sockets against fake workers.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use dolphin_cluster::Role;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use super::{AppState, ops_router, router, serve};
use crate::admission::InflightLimit;
use crate::dispatch::Dispatcher;
use crate::policy::Policy;
use crate::request_log::RequestLog;
use crate::testutil::{Behavior, FakeWorker, dispatcher, until_in_flight};
use crate::tokenizer::{ChatMessage, SimTokenizer, Tokenizer};

struct Server {
    addr: SocketAddr,
    /// `/metrics` and `/health`.
    ops: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(d: Arc<Dispatcher>) -> Server {
    start_with_keys(d, None).await
}

async fn start_with_keys(d: Arc<Dispatcher>, api_keys: Option<crate::auth::KeySet>) -> Server {
    start_with(d, api_keys, InflightLimit::new(16)).await
}

async fn start_with(
    d: Arc<Dispatcher>,
    api_keys: Option<crate::auth::KeySet>,
    limit: InflightLimit,
) -> Server {
    start_with_cors(d, api_keys, limit, None).await
}

async fn start_with_cors(
    d: Arc<Dispatcher>,
    api_keys: Option<crate::auth::KeySet>,
    limit: InflightLimit,
    cors: Option<super::cors::Cors>,
) -> Server {
    let state = AppState {
        dispatcher: d,
        metrics: Some(dolphin_cluster::init_metrics()),
        api_keys,
        limit,
        responses: super::response_store::ResponseStore::new(64),
    };
    serve_state(state, cors).await
}

/// Serves `state` on loopback (the public and the operators' listeners).
async fn serve_state(state: AppState, cors: Option<super::cors::Cors>) -> Server {
    let bind = || async {
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
    };
    let (listener, ops_listener) = (bind().await, bind().await);
    let addr = listener.local_addr().expect("addr");
    let ops = ops_listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    let mut shards = crate::shard::deal(listener, 1, None, stop.clone()).expect("deal");
    let app = router(state.clone()).with_cors(cors);
    tokio::spawn(serve(shards.remove(0), app, stop.clone()));
    tokio::spawn(async move { axum::serve(ops_listener, ops_router(state)).await });
    Server { addr, ops, stop }
}

#[path = "responses_etcd_tests.rs"]
mod responses_etcd;

#[path = "messages_tests.rs"]
mod messages;

#[path = "generate_tests.rs"]
mod generate;

/// One worker answering "abc..." and a server in front of it.
async fn with_worker(behavior: Behavior) -> (FakeWorker, Arc<Dispatcher>, Server) {
    let fake = FakeWorker::start("d1", Role::Decode, behavior).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let s = start(d.clone()).await;
    (fake, d, s)
}

async fn call(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: impl Into<Bytes>,
) -> (StatusCode, HeaderMap, String) {
    call_with(addr, method, path, body, None).await
}

async fn call_with(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: impl Into<Bytes>,
    authorization: Option<&str>,
) -> (StatusCode, HeaderMap, String) {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(authorization.map(|value| ("authorization", value)));
    call_headers(addr, method, path, &headers, body).await
}

/// POSTs `len` bytes in 64 KiB chunks (no Content-Length) over a raw connection; returns the
/// status code of the answer and whether the whole body could be sent.
async fn chunked_post(addr: SocketAddr, path: &str, len: usize) -> (u16, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!("POST {path} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n");
    conn.write_all(head.as_bytes()).await.expect("head");
    let chunk = vec![b'x'; 64 << 10];
    let mut sent = 0;
    while sent < len {
        let n = chunk.len().min(len - sent);
        let framed = [format!("{n:x}\r\n").as_bytes(), &chunk[..n], b"\r\n"].concat();
        // The server may answer and close before the whole body is sent.
        if conn.write_all(&framed).await.is_err() {
            break;
        }
        sent += n;
    }
    let whole = sent == len && conn.write_all(b"0\r\n\r\n").await.is_ok();
    let mut answer = vec![0; 64];
    let n = conn.read(&mut answer).await.expect("answer");
    (status_code(&String::from_utf8_lossy(&answer[..n])), whole)
}

/// The status code of a raw HTTP/1.1 answer.
fn status_code(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect(answer)
}

/// POSTs `body` with `headers` over a raw HTTP/1.1 connection that the server closes after
/// answering; returns the status code and the whole answer.
async fn raw_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(&[head.as_bytes(), body].concat())
        .await
        .expect("request");
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.expect("answer");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    (status_code(&answer), answer)
}

/// A request with these headers (and nothing else set).
async fn call_headers(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> (StatusCode, HeaderMap, String) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body.into())).expect("request");
    let resp = client.request(req).await.expect("response");
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (StatusCode, HeaderMap, String) {
    call(addr, Method::POST, path, body.to_string()).await
}

fn parse(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_owned)
        .collect()
}

/// The typed events of an SSE body (the Responses and Messages APIs'): each `event:` name with
/// its `data:` payload, whose `type` must be that name.
fn typed_events(body: &str) -> Vec<(&str, Value)> {
    let names: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    let events: Vec<Value> = sse_data(body).iter().map(|d| parse(d)).collect();
    assert_eq!(names.len(), events.len(), "{body}");
    for (name, e) in names.iter().zip(&events) {
        assert_eq!(e["type"], *name, "{body}");
    }
    names.into_iter().zip(events).collect()
}

fn assert_error(status: StatusCode, body: &str, want: StatusCode) -> Value {
    assert_eq!(status, want, "{body}");
    let v = parse(body);
    let e = &v["error"];
    assert!(e["message"].is_string(), "{body}");
    assert!(e["type"].is_string(), "{body}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{body}"
    );
    v
}

#[tokio::test]
async fn completion_whole() {
    let (fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let (status, headers, body) = post(
        s.addr,
        "/v1/completions",
        json!({"model": "sim-model", "prompt": "hello", "max_tokens": 5}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "abcab");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], 10);
    assert!(v["id"].as_str().expect("id").starts_with("cmpl-"));
    assert_eq!(headers["x-dolphin-decode-worker"], "d1");
    assert_eq!(headers["x-dolphin-prefill-mode"], "local");
    assert_eq!(headers["x-dolphin-prefill-path"], "local");
    let sent = fake.state.calls.lock()[0].clone();
    assert_eq!(sent.token_ids, SimTokenizer.encode("hello"));
    let sampling = sent.sampling.expect("sampling");
    assert_eq!(
        (sampling.max_tokens, sampling.temperature, sampling.top_p),
        (5, 1.0, 1.0)
    );
}

/// What clients of vLLM and SGLang send: nulls for fields they do not set, `top_k: -1` for
/// "off", and vLLM's sampling extensions at their defaults. All served, as those servers do.
#[tokio::test]
async fn nulls_and_vllm_defaults_are_served() {
    let (fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let req = json!({
        "model": null, "prompt": "hello", "max_tokens": 3, "stream": null, "ignore_eos": null,
        "stream_options": {"include_usage": null}, "top_k": -1, "n": null, "stop": null,
        "repetition_penalty": 1.0, "best_of": 1.0, "min_p": 0, "min_tokens": 0,
        "stop_token_ids": [], "include_stop_str_in_output": false, "guided_json": null,
        "length_penalty": 1, "seed": -1,
    });
    let (status, _, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(parse(&body)["choices"][0]["text"], "abc");
    let (status, _, body) = post(
        s.addr,
        "/v1/chat/completions",
        json!({"model": null, "messages": [{"role": "user", "content": "hi"}], "stream": null,
               "max_tokens": 2, "top_k": 5, "add_generation_prompt": true,
               "continue_final_message": false, "chat_template_kwargs": {},
               "seed": u64::MAX}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let calls = fake.state.calls.lock().clone();
    let top_k: Vec<u32> = calls
        .iter()
        .map(|c| c.sampling.as_ref().expect("sampling").top_k)
        .collect();
    assert_eq!(top_k, [0, 5], "-1 is off, as 0 is on the wire");
    let seeds: Vec<Option<u64>> = calls
        .iter()
        .map(|c| c.sampling.as_ref().expect("sampling").seed)
        .collect();
    assert_eq!(
        seeds,
        [Some(u64::MAX), Some(u64::MAX)],
        "a negative seed is its two's complement"
    );
}

/// Structured output in each dialect clients send (OpenAI's `response_format`, vLLM's
/// `structured_outputs` and `guided_*`, SGLang's `regex` and `json_schema`) reaches the worker as
/// one `structured` format; a malformed format, two at once, or one with `ignore_eos` is a 400
/// naming the field, before any worker is called.
#[tokio::test]
async fn formats_reach_the_worker_in_every_dialect() {
    use dolphin_grammar::Format;
    let (fake, _d, s) = with_worker(Behavior::Text("{}".into())).await;
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let served = [
        (json!({"response_format": {"type": "text"}}), None),
        (
            json!({"response_format": {"type": "json_object"}}),
            Some(Format::JsonObject),
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
            Some(Format::JsonSchema(schema.to_string())),
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "any"}}}),
            Some(Format::JsonSchema("true".into())),
        ),
        (
            json!({"structured_outputs": {"regex": "[a-z]+"}}),
            Some(Format::Regex("[a-z]+".into())),
        ),
        (
            json!({"structured_outputs": {"choice": ["yes", "no"], "json": null}}),
            Some(Format::Choice(vec!["yes".into(), "no".into()])),
        ),
        (
            json!({"structured_outputs": {"grammar": "start: \"a\"+"}}),
            Some(Format::Lark("start: \"a\"+".into())),
        ),
        (
            json!({"structured_outputs": {"json_object": true}}),
            Some(Format::JsonObject),
        ),
        (
            json!({"guided_json": schema.to_string()}),
            Some(Format::JsonSchema(schema.to_string())),
        ),
        (
            json!({"guided_regex": "\\d+"}),
            Some(Format::Regex("\\d+".into())),
        ),
        (
            json!({"guided_choice": ["a", "b"]}),
            Some(Format::Choice(vec!["a".into(), "b".into()])),
        ),
        (json!({"regex": "x|y"}), Some(Format::Regex("x|y".into()))),
        (
            json!({"json_schema": schema}),
            Some(Format::JsonSchema(schema.to_string())),
        ),
    ];
    for (i, (fields, want)) in served.iter().enumerate() {
        let mut req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        for (k, v) in fields.as_object().expect("object") {
            req[k] = v.clone();
        }
        let (status, _, body) = post(s.addr, "/v1/chat/completions", req).await;
        assert_eq!(status, StatusCode::OK, "{fields}: {body}");
        let calls = fake.state.calls.lock().clone();
        assert_eq!(calls.len(), i + 1);
        let got = calls[i]
            .sampling
            .as_ref()
            .and_then(|s| s.structured.as_deref())
            .map(|w| Format::from_wire(w).expect("a format"));
        assert_eq!(got.as_ref(), want.as_ref(), "{fields}");
    }
    let refused = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format",
        ),
        (
            json!({"structured_outputs": {"regex": "(open"}}),
            "structured_outputs",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
            "structured_outputs",
        ),
        (
            json!({"structured_outputs": {"structural_tag": "x"}}),
            "structured_outputs",
        ),
        (json!({"guided_choice": []}), "guided_choice"),
        (json!({"guided_choice": "yes"}), "guided_choice"),
        (
            json!({"guided_grammar": "start: missing"}),
            "guided_grammar",
        ),
        (
            json!({"guided_regex": "a", "response_format": {"type": "json_object"}}),
            "guided_regex",
        ),
        (json!({"regex": "a", "ignore_eos": true}), "ignore_eos"),
        (json!({"ebnf": "root ::= \"a\""}), "ebnf"),
    ];
    for (fields, param) in refused {
        let mut req = json!({"prompt": "hi", "max_tokens": 4});
        for (k, v) in fields.as_object().expect("object") {
            req[k] = v.clone();
        }
        let (status, _, body) = post(s.addr, "/v1/completions", req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{fields}: {body}");
        assert_eq!(parse(&body)["error"]["param"], param, "{fields}: {body}");
    }
    assert_eq!(
        fake.state.calls.lock().len(),
        served.len(),
        "refused before any worker"
    );
}

/// Tool calling as OpenAI's clients use it: the tools and the conversation's earlier calls reach
/// the chat template; `"auto"` answers are read for Hermes calls (whole and streamed); a named
/// function and `"required"` are drawn under their formats and answered as calls; misuse is a
/// 400 that names its field, before any worker is called.
#[tokio::test]
async fn tools_are_offered_and_calls_read_in_every_mode() {
    use dolphin_grammar::Format;
    let answer = "Hm.\n<tool_call>{\"name\": \"wx\", \"arguments\": {\"c\": 1}}</tool_call>";
    let (fake, _d, s) = with_worker(Behavior::Text(answer.into())).await;
    let tools = json!([{"type": "function", "function": {"name": "wx",
        "parameters": {"type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"]}}}]);
    let messages = json!([
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "wx", "arguments": "{\"c\": 0}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "And Paris?"},
    ]);
    let tokens = answer.len() as u32;
    let req = json!({"messages": messages, "tools": tools, "max_tokens": tokens});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    assert_eq!(choice["message"]["content"], "Hm.");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{call}"
    );
    assert_eq!(call["function"]["name"], "wx");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("text"))
            .expect("JSON arguments");
    assert_eq!(arguments, json!({"c": 1}));
    // The template saw the tools, the earlier call (its arguments as an object) and its answer.
    let mut earlier = ChatMessage::new("assistant", "");
    earlier.tool_calls = vec![crate::tokenizer::ToolCall {
        id: "call_1".into(),
        name: "wx".into(),
        arguments: json!({"c": 0}),
    }];
    let mut answered = ChatMessage::new("tool", "sunny");
    answered.tool_call_id = Some("call_1".into());
    let rendered = SimTokenizer
        .render_chat(
            &[
                ChatMessage::new("user", "Weather in Rome?"),
                earlier,
                answered,
                ChatMessage::new("user", "And Paris?"),
            ],
            &crate::tokenizer::ChatExtras {
                tools: Some(tools.clone()),
                ..Default::default()
            },
        )
        .expect("renders");
    assert_eq!(
        fake.state.calls.lock()[0].token_ids,
        SimTokenizer.encode(&rendered)
    );
    assert!(rendered.contains("\"arguments\":{\"c\":0}"), "{rendered}");

    // Streamed: the text, then the call whole once its closing tag arrives.
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let (status, _, body) = post(s.addr, "/v1/chat/completions", streamed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert_eq!(deltas[0]["role"], "assistant");
    let text: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    assert_eq!(text, "Hm.");
    let calls: Vec<&Value> = deltas
        .iter()
        .filter_map(|d| d["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "{body}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["function"]["name"], "wx");
    assert_eq!(
        serde_json::from_str::<Value>(calls[0]["function"]["arguments"].as_str().expect("text"))
            .expect("JSON"),
        json!({"c": 1})
    );
    assert_eq!(
        chunks.last().expect("last")["choices"][0]["finish_reason"],
        "tool_calls"
    );

    // A named function: drawn under its parameters' schema, answered as its call, and
    // streamed as the call's arguments part by part.
    let args = r#"{"c": 1}"#;
    *fake.state.behavior.lock() = Behavior::Text(args.into());
    let named = json!({"type": "function", "function": {"name": "wx"}});
    let mut req = json!({"messages": [{"role": "user", "content": "Paris?"}], "tools": tools,
        "tool_choice": named, "max_tokens": args.len()});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let message = &parse(&body)["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null, "{body}");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "wx");
    assert_eq!(message["tool_calls"][0]["function"]["arguments"], args);
    let format = |i: usize| {
        let calls = fake.state.calls.lock();
        let wire = calls[i]
            .sampling
            .as_ref()
            .and_then(|s| s.structured.clone());
        wire.map(|w| Format::from_wire(&w).expect("a format"))
    };
    assert_eq!(format(0), None, "auto draws freely");
    assert_eq!(
        format(2),
        Some(Format::JsonSchema(
            tools[0]["function"]["parameters"].to_string()
        ))
    );
    req["stream"] = json!(true);
    let (_, _, body) = post(s.addr, "/v1/chat/completions", req).await;
    let data = sse_data(&body);
    let parts: Vec<Value> = data[..data.len() - 1]
        .iter()
        .filter_map(|d| {
            parse(d)["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(parts[0]["function"]["name"], "wx", "{body}");
    assert!(
        parts[1..]
            .iter()
            .all(|p| p["id"].is_null() && p["index"] == 0)
    );
    let joined: String = parts
        .iter()
        .filter_map(|p| p["function"]["arguments"].as_str())
        .collect();
    assert_eq!(joined, args);

    // "required": a JSON array of calls.
    let array = r#"[{"name": "wx", "parameters": {"c": 1}}]"#;
    *fake.state.behavior.lock() = Behavior::Text(array.into());
    let req = json!({"messages": [{"role": "user", "content": "Paris?"}], "tools": tools,
        "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": array.len()});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choice = &parse(&body)["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["arguments"],
        r#"{"c":1}"#
    );
    let Some(Format::JsonSchema(schema)) = format(4) else {
        panic!("a schema")
    };
    assert_eq!(
        serde_json::from_str::<Value>(&schema).expect("json")["maxItems"],
        1
    );

    let served = fake.state.calls.lock().len();
    let refused = [
        (
            "/v1/completions",
            json!({"prompt": "hi", "tools": tools}),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                "tool_choice": named, "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
                "function": {"name": "f", "parameters": {"type": "nonsense"}}}], "tool_choice": "required"}),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}),
            "functions",
        ),
    ];
    for (path, req, param) in refused {
        let (status, _, body) = post(s.addr, path, req.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{req}: {body}");
        assert_eq!(parse(&body)["error"]["param"], param, "{req}: {body}");
    }
    assert_eq!(
        fake.state.calls.lock().len(),
        served,
        "refused before any worker"
    );
}

/// With `--reasoning-parser`, a reasoning model's thinking goes out as `reasoning_content`,
/// whole and streamed, and the tool calls are read from the answer after it; completions
/// keep the text as it is.
#[tokio::test]
async fn thinking_is_split_from_the_answer() {
    let answer = "<think>Hm, 2 + 2.</think>\n\nIt is 4.";
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text(answer.into())).await;
    let d = crate::testutil::dispatcher_configured(
        Arc::new(SimTokenizer),
        Policy::AlwaysLocal,
        RequestLog::disabled(),
        |c| c.reasoning_parser = Some(crate::reasoning::ReasoningParser::Qwen3),
    );
    d.registry().add(fake.record()).expect("add");
    let s = start(d).await;
    let req =
        json!({"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": answer.len()});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let message = &parse(&body)["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "Hm, 2 + 2.", "{body}");
    assert_eq!(message["content"], "It is 4.");

    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let (_, _, body) = post(s.addr, "/v1/chat/completions", streamed).await;
    let data = sse_data(&body);
    let deltas: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| parse(d)["choices"][0]["delta"].clone())
        .collect();
    let joined = |key: &str| -> String { deltas.iter().filter_map(|d| d[key].as_str()).collect() };
    assert_eq!(joined("reasoning_content"), "Hm, 2 + 2.", "{body}");
    assert_eq!(joined("content"), "It is 4.");
    // SGLang's `separate_reasoning: false`: the thinking stays in the text.
    let mut together = req.clone();
    together["separate_reasoning"] = json!(false);
    let (_, _, body) = post(s.addr, "/v1/chat/completions", together).await;
    let message = &parse(&body)["choices"][0]["message"];
    assert_eq!(message["content"], answer, "{body}");
    assert!(message["reasoning_content"].is_null(), "{body}");

    // A call after the thinking.
    let call = "<think>Need data.</think><tool_call>{\"name\": \"wx\"}</tool_call>";
    *fake.state.behavior.lock() = Behavior::Text(call.into());
    let tools = json!([{"type": "function", "function": {"name": "wx"}}]);
    let req = json!({"messages": [{"role": "user", "content": "?"}], "tools": tools, "max_tokens": call.len()});
    let (_, _, body) = post(s.addr, "/v1/chat/completions", req).await;
    let choice = &parse(&body)["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    assert_eq!(choice["message"]["reasoning_content"], "Need data.");
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "wx");

    // A format starts after the thinking: the worker is told where.
    *fake.state.behavior.lock() = Behavior::Text("{}".into());
    let req = json!({"messages": [{"role": "user", "content": "?"}], "max_tokens": 2,
        "response_format": {"type": "json_object"}});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let sent = fake.state.calls.lock().last().cloned().expect("a call");
    let format = sent.sampling.and_then(|s| s.structured).expect("a format");
    assert_eq!(format.after_tokens, SimTokenizer.encode("</think>"));

    // Completions render no template and keep the text.
    *fake.state.behavior.lock() = Behavior::Text(answer.into());
    let (_, _, body) = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": "2+2?", "max_tokens": answer.len()}),
    )
    .await;
    assert_eq!(parse(&body)["choices"][0]["text"], answer);
}

/// vLLM's fields that shape the prompt and the text: the last message continued, no generation
/// prompt, a request's own template (on a router that trusts them), documents, the prompt's
/// start truncated, the stop string kept.
#[tokio::test]
async fn the_request_shapes_its_prompt_and_its_stop() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("abcENDxyz".into())).await;
    let d = crate::testutil::dispatcher_configured(
        Arc::new(SimTokenizer),
        Policy::AlwaysLocal,
        RequestLog::disabled(),
        |c| c.trust_request_chat_template = true,
    );
    d.registry().add(fake.record()).expect("add");
    let s = start(d).await;
    let messages = [
        ChatMessage::new("user", "Name a colour."),
        ChatMessage::new("assistant", "The colour is"),
    ];
    let sent = |i: usize| fake.state.calls.lock()[i].token_ids.clone();
    let rendered = |ending| {
        let extras = crate::tokenizer::ChatExtras {
            ending,
            ..Default::default()
        };
        SimTokenizer.encode(
            &SimTokenizer
                .render_chat(&messages, &extras)
                .expect("renders"),
        )
    };
    let chat = |extra: Value| {
        let mut req = json!({"messages": [{"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "The colour is"}], "max_tokens": 2});
        for (k, v) in extra.as_object().expect("object") {
            req[k] = v.clone();
        }
        req
    };
    let cases = [
        (
            json!({"continue_final_message": true, "add_generation_prompt": false}),
            rendered(crate::tokenizer::Ending::ContinueLast),
        ),
        (
            json!({"add_generation_prompt": false}),
            rendered(crate::tokenizer::Ending::LastMessage),
        ),
        (
            json!({"chat_template": "{{ bos_token }}{{ messages[1].content }}!{% if documents %}{{ documents[0].text }}{% endif %}",
                "documents": [{"title": "t", "text": "doc"}]}),
            SimTokenizer.encode("The colour is!doc"),
        ),
        (json!({"truncate_prompt_tokens": 4}), {
            let all = rendered(crate::tokenizer::Ending::AssistantTurn);
            all[all.len() - 4..].to_vec()
        }),
    ];
    for (i, (extra, want)) in cases.into_iter().enumerate() {
        let (status, _, body) = post(s.addr, "/v1/chat/completions", chat(extra.clone())).await;
        assert_eq!(status, StatusCode::OK, "{extra}: {body}");
        assert_eq!(sent(i), want, "{extra}");
    }
    // The continued message reads as written: the sim's ChatML leaves its turn open.
    let continued = SimTokenizer.decode(&sent(0));
    assert!(
        continued.ends_with("assistant\nThe colour is"),
        "{continued:?}"
    );
    // The stop string kept, or not (vLLM's field, or SGLang's `no_stop_trim`).
    for (keep, text) in [
        (json!({"include_stop_str_in_output": true}), "abcEND"),
        (json!({"no_stop_trim": true}), "abcEND"),
        (json!({"include_stop_str_in_output": false}), "abc"),
    ] {
        let mut req = json!({"prompt": "hi", "max_tokens": 9, "stop": ["END"]});
        for (k, v) in keep.as_object().expect("object") {
            req[k] = v.clone();
        }
        let (status, _, body) = post(s.addr, "/v1/completions", req).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let choice = &parse(&body)["choices"][0];
        assert_eq!(choice["text"], text, "{body}");
        assert_eq!(choice["finish_reason"], "stop");
    }
    // -1: as long as the router takes (1000 tokens here); longer prompts lose their start.
    let long = "x".repeat(1500);
    let req = json!({"prompt": long, "max_tokens": 1, "truncate_prompt_tokens": -1});
    let (status, _, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        fake.state
            .calls
            .lock()
            .last()
            .expect("sent")
            .token_ids
            .len(),
        1000
    );
    let (status, _, body) = post(
        s.addr,
        "/tokenize",
        json!({"messages": [{"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "The colour is"}], "continue_final_message": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        parse(&body)["tokens"],
        json!(rendered(crate::tokenizer::Ending::ContinueLast))
    );
    // OpenAI's reasoning effort becomes the template's variable (unless the request set it).
    let mut other: super::types::OtherFields =
        serde_json::from_value(json!({"reasoning_effort": "high"})).expect("fields");
    let extras = other.take_chat_extras(false).expect("accepted");
    assert_eq!(extras.kwargs["reasoning_effort"], "high");
    let mut other: super::types::OtherFields = serde_json::from_value(
        json!({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}),
    )
    .expect("fields");
    let extras = other.take_chat_extras(false).expect("accepted");
    assert_eq!(extras.kwargs["reasoning_effort"], "low");
}

/// vLLM's `prompt_logprobs`: beside each completions choice, once beside chat's choices; for
/// each prompt token after the first, its own log probability and rank and its alternatives.
#[tokio::test]
async fn prompt_logprobs_come_with_the_answer() {
    let (fake, _d, s) = with_worker(Behavior::Text("ok".into())).await;
    let req = json!({"prompt": "hi", "max_tokens": 1, "prompt_logprobs": 2});
    let (status, _, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ids = SimTokenizer.encode("hi");
    let (first, second) = (ids[0], ids[1]);
    let lp = -(second as f32) / 100.0;
    let want = json!([null, {
        second.to_string(): {"logprob": lp, "rank": second % 7 + 1,
            "decoded_token": SimTokenizer.decode(&[second])},
        (second + 1).to_string(): {"logprob": lp - 1.0, "rank": 2,
            "decoded_token": SimTokenizer.decode(&[second + 1])},
    }]);
    let v = parse(&body);
    assert_eq!(v["choices"][0]["prompt_logprobs"], want, "{body}");
    // The output's own log probabilities were not asked for; the prompt's went to the worker.
    assert!(v["choices"][0]["logprobs"].is_null(), "{body}");
    let sent = fake.state.calls.lock()[0].clone();
    assert_eq!(sent.token_ids, vec![first, second]);
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
        "prompt_logprobs": 0, "n": 2});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", chat).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    let prompt_len = v["usage"]["prompt_tokens"].as_u64().expect("usage") as usize;
    let scores = v["prompt_logprobs"].as_array().expect("prompt_logprobs");
    assert_eq!(scores.len(), prompt_len);
    assert!(
        scores[0].is_null()
            && scores[1..]
                .iter()
                .all(|s| s.as_object().is_some_and(|o| o.len() == 1)),
        "{scores:?}"
    );
    assert!(v["choices"][0].get("prompt_logprobs").is_none(), "{body}");
    // A batch: each choice beside its own prompt's (choice p * n + i answers prompt p).
    let req = json!({"prompt": ["hi", "hey you"], "max_tokens": 1, "n": 2, "prompt_logprobs": 0});
    let (status, _, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    for (choice, prompt) in [(0, "hi"), (1, "hi"), (2, "hey you"), (3, "hey you")] {
        let scores = v["choices"][choice]["prompt_logprobs"]
            .as_array()
            .expect("prompt_logprobs");
        let ids = SimTokenizer.encode(prompt);
        assert_eq!(scores.len(), ids.len(), "{choice}: {body}");
        for (score, id) in scores[1..].iter().zip(&ids[1..]) {
            assert!(score.get(id.to_string()).is_some(), "{choice}: {body}");
        }
    }
    // Plain requests carry no such field.
    let (_, _, body) = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 1}),
    )
    .await;
    assert!(
        parse(&body)["choices"][0].get("prompt_logprobs").is_none(),
        "{body}"
    );
    for (path, req) in [
        (
            "/v1/completions",
            json!({"prompt": "hi", "prompt_logprobs": 1, "stream": true}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "prompt_logprobs": 1, "echo": true, "logprobs": 1}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "prompt_logprobs": 21}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "prompt_logprobs": -1}),
        ),
    ] {
        let (status, _, body) = post(s.addr, path, req.clone()).await;
        let v = assert_error(status, &body, StatusCode::BAD_REQUEST);
        assert_eq!(v["error"]["param"], "prompt_logprobs", "{req}: {v}");
    }
}

/// OpenAI's Responses API: input items become the conversation the template renders, the
/// answer becomes output items (text, then each call), whole or as numbered typed events whose
/// last carries the same response; what needs storage is refused by name.
#[tokio::test]
async fn responses_answer_in_output_items() {
    let answer = "Hm.<tool_call>{\"name\": \"wx\", \"arguments\": {\"c\": 1}}</tool_call>";
    let (fake, _d, s) = with_worker(Behavior::Text(answer.into())).await;
    let req = json!({
        "model": "sim-model",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "call_0", "name": "wx", "arguments": "{\"c\": 0}"},
            {"type": "function_call_output", "call_id": "call_0", "output": "cold"},
        ],
        "tools": [{"type": "function", "name": "wx", "parameters": {"type": "object"}}],
        "max_output_tokens": answer.len(),
        "metadata": {"k": "v"},
    });
    let (status, headers, body) = post(s.addr, "/v1/responses", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(headers.contains_key("x-request-id"));
    let v = parse(&body);
    assert_eq!(v["object"], "response");
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with("resp_")),
        "{v}"
    );
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["instructions"], "Be brief.");
    assert_eq!(v["metadata"], json!({"k": "v"}));
    assert_eq!(v["store"], true);
    let output = v["output"].as_array().expect("output");
    assert_eq!(output.len(), 2, "{v}");
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(
        output[0]["content"][0],
        json!({"type": "output_text", "text": "Hm.", "annotations": [], "logprobs": []})
    );
    assert_eq!(output[1]["type"], "function_call");
    assert_eq!(output[1]["name"], "wx");
    assert_eq!(output[1]["arguments"], r#"{"c":1}"#);
    assert!(
        output[1]["call_id"]
            .as_str()
            .is_some_and(|c| c.starts_with("call_")),
        "{v}"
    );
    let usage = &v["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["input_tokens"].as_u64().expect("in")
                + usage["output_tokens"].as_u64().expect("out")
        )
    );
    // The conversation the template saw: instructions, the earlier call and its output.
    let prompt = SimTokenizer.decode(&fake.state.calls.lock()[0].token_ids);
    assert!(
        prompt.starts_with("<|im_start|>system\n<tools>"),
        "{prompt}"
    );
    assert!(
        prompt.contains("<|im_start|>system\nBe brief.<|im_end|>"),
        "{prompt}"
    );
    assert!(prompt.contains(r#""arguments":{"c":0}"#), "{prompt}");
    assert!(prompt.contains("<|im_start|>tool\ncold"), "{prompt}");

    // Streamed: typed, numbered events; the items open, grow and close in order; the last
    // event carries the whole response.
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let (status, _, body) = post(s.addr, "/v1/responses", streamed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (names, events): (Vec<&str>, Vec<Value>) = typed_events(&body).into_iter().unzip();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64);
    }
    let kinds: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !n.ends_with(".delta"))
        .collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(text, "Hm.");
    let last = &events.last().expect("events")["response"];
    assert_eq!(last["status"], "completed");
    assert_eq!(last["output"][1]["arguments"], r#"{"c":1}"#);
    assert_eq!(last["output"][0]["content"], v["output"][0]["content"]);
    // Each event names the item it grows.
    let added = events
        .iter()
        .find(|e| e["type"] == "response.output_item.added")
        .expect("added");
    let item = added["item"]["id"].clone();
    assert!(
        events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .all(|e| e["item_id"] == item && e["output_index"] == 0)
    );

    // Cut off by max_output_tokens: incomplete.
    let short = json!({"input": "hi", "max_output_tokens": 2});
    let (status, _, body) = post(s.addr, "/v1/responses", short).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["model"], "sim-model");

    for (req, field) in [
        (
            json!({"input": "hi", "tools": [{"type": "file_search"}]}),
            "tools",
        ),
        (json!({"input": "hi", "n": 2}), "n"),
        (
            json!({"input": "hi", "logit_bias": {"1": 500}}),
            "logit_bias",
        ),
    ] {
        let (status, _, body) = post(s.addr, "/v1/responses", req.clone()).await;
        let v = assert_error(status, &body, StatusCode::BAD_REQUEST);
        assert_eq!(v["error"]["param"], field, "{req}: {v}");
    }
    // Kept responses (this server keeps 64): read back, continued, forgotten.
    let first = parse(&post(s.addr, "/v1/responses", req.clone()).await.2);
    let id = first["id"].as_str().expect("id").to_owned();
    let (status, _, body) = call(s.addr, Method::GET, &format!("/v1/responses/{id}"), "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(parse(&body)["id"], id.as_str());
    let calls_before = fake.state.calls.lock().len();
    let next = json!({"input": "And in Paris?", "previous_response_id": id, "tools": req["tools"],
        "max_output_tokens": answer.len()});
    let (status, _, body) = post(s.addr, "/v1/responses", next).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let prompt = SimTokenizer.decode(&fake.state.calls.lock()[calls_before].token_ids);
    // The earlier conversation and answer, not its instructions, then the new input.
    assert!(prompt.contains("<|im_start|>user\nWeather?"), "{prompt}");
    assert!(prompt.contains("<|im_start|>tool\ncold"), "{prompt}");
    assert!(
        prompt.contains("Hm.") && prompt.contains(r#""arguments":{"c":1}"#),
        "{prompt}"
    );
    assert!(!prompt.contains("Be brief."), "{prompt}");
    assert!(
        prompt.contains("<|im_start|>user\nAnd in Paris?"),
        "{prompt}"
    );
    let (status, _, body) = call(s.addr, Method::DELETE, &format!("/v1/responses/{id}"), "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(parse(&body)["deleted"], true);
    let (status, _, body) = call(s.addr, Method::GET, &format!("/v1/responses/{id}"), "").await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, _, body) = post(
        s.addr,
        "/v1/responses",
        json!({"input": "hi", "previous_response_id": id}),
    )
    .await;
    let v = assert_error(status, &body, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["param"], "previous_response_id");
    // `store: false`: not kept.
    let unkept = json!({"input": "hi", "store": false, "max_output_tokens": 2});
    let unkept = parse(&post(s.addr, "/v1/responses", unkept).await.2);
    assert_eq!(unkept["store"], false);
    let path = format!("/v1/responses/{}", unkept["id"].as_str().expect("id"));
    let (status, _, body) = call(s.addr, Method::GET, &path, "").await;
    assert_error(status, &body, StatusCode::NOT_FOUND);

    // A mistyped field is the same 400 as on chat.
    let (status, _, body) = post(
        s.addr,
        "/v1/responses",
        json!({"input": "hi", "temperature": "hot"}),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
}

/// `/tokenize` gives the ids the router would send (a conversation through its template, tools
/// included) and `/detokenize` their text; bad input is a 400 naming the field.
#[tokio::test]
async fn tokenize_and_detokenize() {
    let (fake, _d, s) = with_worker(Behavior::Text("x".into())).await;
    let (status, _, body) = post(s.addr, "/tokenize", json!({"prompt": "hi there"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(v["tokens"], json!(SimTokenizer.encode("hi there")));
    assert_eq!(v["count"], 8);
    assert!(v["max_model_len"].as_u64().is_some(), "{v}");
    let tools = json!([{"type": "function", "function": {"name": "wx"}}]);
    let req = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
        "tools": tools, "chat_template_kwargs": {"enable_thinking": false}});
    let (status, _, body) = post(s.addr, "/tokenize", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let extras = crate::tokenizer::ChatExtras {
        tools: Some(tools),
        ..Default::default()
    };
    let rendered = SimTokenizer
        .render_chat(&[ChatMessage::new("user", "hi")], &extras)
        .expect("renders");
    assert_eq!(
        parse(&body)["tokens"],
        json!(SimTokenizer.encode(&rendered))
    );
    let (status, _, body) = post(
        s.addr,
        "/detokenize",
        json!({"tokens": SimTokenizer.encode("hé")}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(parse(&body)["prompt"], "hé");
    for (path, req, want, param) in [
        (
            "/tokenize",
            json!({}),
            StatusCode::BAD_REQUEST,
            json!("prompt"),
        ),
        (
            "/tokenize",
            json!({"prompt": "a", "messages": []}),
            StatusCode::BAD_REQUEST,
            json!("prompt"),
        ),
        (
            "/tokenize",
            json!({"prompt": "a", "model": "other"}),
            StatusCode::NOT_FOUND,
            json!("model"),
        ),
        (
            "/tokenize",
            json!({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "retrieval"}]}),
            StatusCode::BAD_REQUEST,
            json!("tools"),
        ),
        (
            "/detokenize",
            json!({"tokens": [1, 999999]}),
            StatusCode::BAD_REQUEST,
            json!("tokens"),
        ),
        (
            "/detokenize",
            json!({"tokens": "abc"}),
            StatusCode::BAD_REQUEST,
            Value::Null,
        ),
    ] {
        let (status, _, body) = post(s.addr, path, req.clone()).await;
        let v = assert_error(status, &body, want);
        assert_eq!(v["error"]["param"], param, "{req}: {body}");
    }
    assert!(fake.state.calls.lock().is_empty(), "no worker is called");
}

/// OpenAI's penalties and logit bias, and vLLM's repetition penalty, min-p, stop token ids,
/// minimum length, allowed tokens and bad words (tokenized), reach the worker as asked.
#[tokio::test]
async fn logit_rules_reach_the_worker() {
    let (fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let req = json!({
        "prompt": "hello", "max_tokens": 6, "presence_penalty": 0.5, "frequency_penalty": -1.5,
        "logit_bias": {"42": -100, "7": 3.5}, "repetition_penalty": 1.3, "min_p": 0.1,
        "stop_token_ids": [9, 11], "min_tokens": 2, "allowed_token_ids": [5, 3, 5],
        "bad_words": ["ab", " c"], "cache_salt": "tenant-7", "priority": -2,
    });
    let (status, _, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, body) = post(
        s.addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let calls = fake.state.calls.lock().clone();
    let asked = calls[0].sampling.clone().expect("sampling");
    assert_eq!(
        asked.logits.as_deref(),
        Some(&dolphin_proto::v1::LogitRules {
            presence_penalty: 0.5,
            frequency_penalty: -1.5,
            repetition_penalty: 1.3,
            min_p: 0.1,
            min_tokens: 2,
            stop_token_ids: vec![9, 11],
            logit_bias: [(42, -100.0), (7, 3.5)].into_iter().collect(),
            allowed_token_ids: vec![5, 3, 5],
            // The sim tokenizer's bytes: a word after a space is already matched by its own
            // tokens.
            bad_words: [SimTokenizer.encode("ab"), SimTokenizer.encode("c")]
                .into_iter()
                .map(|ids| dolphin_proto::v1::TokenIds { ids })
                .collect(),
        })
    );
    assert_eq!(
        (asked.cache_salt.as_str(), asked.priority),
        ("tenant-7", -2)
    );
    // None asked: none sent (the rules travel boxed, and only when asked for).
    assert_eq!(calls[1].sampling.as_ref().expect("sampling").logits, None);
    assert_eq!(calls[1].sampling.as_ref().expect("sampling").cache_salt, "");
}

#[tokio::test]
async fn completion_stream_with_usage() {
    let (_fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let req = json!({"prompt": [40, 41, 42], "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}});
    let (status, headers, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        headers["content-type"]
            .to_str()
            .expect("ct")
            .starts_with("text/event-stream")
    );
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "abca");
    let finish = chunks
        .iter()
        .find(|c| c["choices"][0]["finish_reason"].is_string())
        .expect("finish chunk");
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = chunks.last().expect("usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert_eq!(usage["usage"]["prompt_tokens"], 3);
}

/// A batch of prompts on completions: choice `p * n + i` is prompt `p`'s `i`th generation,
/// whole or streamed, the usage counting each prompt once.
#[tokio::test]
async fn batched_prompts_are_answered_in_order() {
    let (fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let req = json!({"prompt": ["hi", "hello"], "max_tokens": 2, "n": 2});
    let (status, _, body) = post(s.addr, "/v1/completions", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
        assert_eq!(c["text"], "ab", "{v}");
    }
    let (hi, hello) = (SimTokenizer.encode("hi"), SimTokenizer.encode("hello"));
    assert_eq!(v["usage"]["prompt_tokens"], hi.len() + hello.len(), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    let mut sent: Vec<Vec<u32>> = fake
        .state
        .calls
        .lock()
        .iter()
        .map(|c| c.token_ids.clone())
        .collect();
    sent.sort();
    let mut want = vec![hi.clone(), hi.clone(), hello.clone(), hello.clone()];
    want.sort();
    assert_eq!(sent, want);
    // Token-id prompts, streamed with the usage last.
    let req = json!({"prompt": [[40, 41], [42]], "max_tokens": 2, "stream": true,
        "stream_options": {"include_usage": true}});
    let (status, _, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
    for index in 0..2 {
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"].as_array()?.first())
            .filter(|c| c["index"] == index)
            .filter_map(|c| c["text"].as_str())
            .collect();
        assert_eq!(text, "ab", "choice {index}: {body}");
    }
    let usage = &chunks.last().expect("chunks")["usage"];
    assert_eq!(usage["prompt_tokens"], 3, "{body}");
    assert_eq!(usage["completion_tokens"], 4, "{body}");

    // An evaluation harness's batch: each prompt echoed and scored, nothing generated.
    let req = json!({"prompt": ["hi", "hello"], "max_tokens": 0, "echo": true, "logprobs": 1});
    let (status, _, body) = post(s.addr, "/v1/completions", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    for (i, (prompt, ids)) in [("hi", &hi), ("hello", &hello)].into_iter().enumerate() {
        let c = &v["choices"][i];
        assert_eq!(c["text"], prompt, "{v}");
        let scored = c["logprobs"]["token_logprobs"].as_array().expect("scored");
        assert_eq!(scored.len(), ids.len(), "{v}");
        assert!(scored[0].is_null(), "{v}");
        // The fake scores each prompt token after the first at -id / 100.
        let got = scored[1].as_f64().expect("a number");
        assert!((got + f64::from(ids[1]) / 100.0).abs() < 1e-6, "{v}");
    }
    assert_eq!(v["usage"]["prompt_tokens"], hi.len() + hello.len(), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 0, "{v}");
    // Streamed, each choice starts with its own prompt.
    let mut streamed = req;
    streamed["stream"] = json!(true);
    streamed["max_tokens"] = json!(2);
    let (status, _, body) = post(s.addr, "/v1/completions", streamed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
    for (index, want) in [(0, "hiab"), (1, "helloab")] {
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"].as_array()?.first())
            .filter(|c| c["index"] == index)
            .filter_map(|c| c["text"].as_str())
            .collect();
        assert_eq!(text, want, "choice {index}: {body}");
    }
}

/// `n` > 1: one generation per choice (seeds counted up from the request's), answered as one
/// response or one stream with each choice's index, the usage counting the prompt once.
#[tokio::test]
async fn several_choices_whole_and_streamed() {
    let (fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let req = json!({"prompt": [40, 41, 42], "max_tokens": 4, "n": 3, "seed": 5});
    let (status, headers, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["x-dolphin-decode-worker"], "d1");
    let v = parse(&body);
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
        assert_eq!(c["text"], "abca", "{v}");
        assert_eq!(c["finish_reason"], "length", "{v}");
    }
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["usage"]["total_tokens"], 15);
    let mut seeds: Vec<Option<u64>> = fake
        .state
        .calls
        .lock()
        .iter()
        .map(|c| c.sampling.as_ref().expect("sampling").seed)
        .collect();
    seeds.sort();
    assert_eq!(seeds, [Some(5), Some(6), Some(7)]);

    let req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 2,
                     "stream": true, "stream_options": {"include_usage": true}});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
    for index in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].as_array()?.first())
            .filter(|c| c["index"] == index)
            .collect();
        assert!(!mine.is_empty(), "choice {index}: {body}");
        assert_eq!(mine[0]["delta"]["role"], "assistant", "{body}");
        let roles = mine
            .iter()
            .filter(|c| c["delta"]["role"].is_string())
            .count();
        assert_eq!(roles, 1, "one role chunk per choice: {body}");
        let text: String = mine
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "ab", "{body}");
        assert_eq!(mine.last().expect("chunks")["finish_reason"], "length");
    }
    let usage: Vec<&Value> = chunks.iter().filter(|c| c["usage"].is_object()).collect();
    assert_eq!(usage.len(), 1, "one usage chunk, after both ends: {body}");
    assert_eq!(chunks.last(), Some(usage[0]), "{body}");
    assert_eq!(usage[0]["usage"]["completion_tokens"], 4);
}

/// vLLM's `return_token_ids`: the prompt's ids and the output's beside the text, whole and
/// streamed (the prompt's on each choice's first chunk, the output's chunk by chunk), on both
/// endpoints, each batch prompt's with its own choices; nothing of it unless asked.
#[tokio::test]
async fn token_ids_come_beside_the_text_where_asked() {
    let (_fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let out = SimTokenizer.encode("abca");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap_or_else(|| panic!("ids: {v}"))
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    // Completions: a batch of two token prompts, whole and streamed.
    let req = json!({"prompt": [[40, 41], [42]], "max_tokens": 4, "return_token_ids": true});
    for stream in [false, true] {
        let mut req = req.clone();
        req["stream"] = json!(stream);
        let (chunks, body) = completion_chunks(s.addr, req, stream).await;
        for (index, prompt) in [(0, vec![40, 41]), (1, vec![42])] {
            let mine: Vec<&Value> = chunks
                .iter()
                .flat_map(|c| c["choices"].as_array().expect("choices"))
                .filter(|c| c["index"] == index)
                .collect();
            let with_prompt: Vec<&&Value> = mine
                .iter()
                .filter(|c| !c["prompt_token_ids"].is_null())
                .collect();
            assert_eq!(with_prompt.len(), 1, "once a choice: {body}");
            assert_eq!(ids(&with_prompt[0]["prompt_token_ids"]), prompt, "{body}");
            let got: Vec<u32> = mine.iter().flat_map(|c| ids(&c["token_ids"])).collect();
            assert_eq!(got, out, "{body}");
        }
    }
    // Chat: the prompt's ids once (a whole answer's beside the choices), the output's.
    let req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                     "return_token_ids": true});
    let prompt = SimTokenizer.encode(
        &SimTokenizer
            .render_chat(&[ChatMessage::new("user", "hi")], &Default::default())
            .expect("renders"),
    );
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(ids(&v["prompt_token_ids"]), prompt, "{body}");
    assert_eq!(ids(&v["choices"][0]["token_ids"]), out, "{body}");
    let mut streamed = req;
    streamed["stream"] = json!(true);
    let (status, _, body) = post(s.addr, "/v1/chat/completions", streamed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
    let prompts: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["prompt_token_ids"])
        .filter(|p| !p.is_null())
        .collect();
    assert_eq!(prompts.len(), 1, "{body}");
    assert_eq!(ids(prompts[0]), prompt, "{body}");
    let got: Vec<u32> = chunks
        .iter()
        .flat_map(|c| ids(&c["choices"][0]["token_ids"]))
        .collect();
    assert_eq!(got, out, "{body}");
    // Not asked: not sent.
    let (_, _, body) = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 2}),
    )
    .await;
    assert!(!body.contains("token_ids"), "{body}");
    // vLLM's `return_tokens_as_token_ids`: log probabilities name their tokens by id.
    let a = out[0];
    let req = json!({"prompt": "hi", "max_tokens": 1, "logprobs": 1,
                     "return_tokens_as_token_ids": true});
    let (_, _, body) = post(s.addr, "/v1/completions", req).await;
    let lp = &parse(&body)["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"][0], format!("token_id:{a}"), "{body}");
    assert!(
        lp["top_logprobs"][0].get(format!("token_id:{a}")).is_some(),
        "{body}"
    );
    let req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                     "logprobs": true, "top_logprobs": 1, "return_tokens_as_token_ids": true});
    let (_, _, body) = post(s.addr, "/v1/chat/completions", req).await;
    let entry = &parse(&body)["choices"][0]["logprobs"]["content"][0];
    let name = format!("token_id:{a}");
    assert_eq!(entry["token"], name.as_str(), "{body}");
    assert_eq!(entry["bytes"], json!(name.as_bytes()), "{body}");
    assert_eq!(entry["top_logprobs"][0]["token"], name.as_str(), "{body}");
}

/// vLLM's `continuous_usage_stats`: every chunk carries its choice's usage so far (the
/// prompt's tokens, the choice's generated ones), on both endpoints; `include_usage` still
/// adds the request's usage after the last chunk.
#[tokio::test]
async fn continuous_usage_counts_each_choice_as_it_goes() {
    let (_fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let opts = json!({"include_usage": true, "continuous_usage_stats": true});
    for (path, req) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2,
                "stream": true, "stream_options": opts}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 3, "n": 2, "stream": true,
                "stream_options": opts}),
        ),
    ] {
        let (status, _, body) = post(s.addr, path, req).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let data = sse_data(&body);
        let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
        let (last, per_choice) = chunks.split_last().expect("chunks");
        assert_eq!(last["choices"], json!([]), "{body}");
        let total = &last["usage"];
        assert_eq!(total["completion_tokens"], 6, "{body}");
        let prompt = total["prompt_tokens"].as_u64().expect("prompt tokens");
        for index in 0..2 {
            let usage: Vec<&Value> = per_choice
                .iter()
                .filter(|c| c["choices"][0]["index"] == index)
                .map(|c| &c["usage"])
                .collect();
            assert!(!usage.is_empty(), "{body}");
            let generated: Vec<u64> = usage
                .iter()
                .map(|u| {
                    assert_eq!(u["prompt_tokens"], prompt, "{body}");
                    let g = u["completion_tokens"].as_u64().expect("completion tokens");
                    assert_eq!(u["total_tokens"], prompt + g, "{body}");
                    g
                })
                .collect();
            assert!(generated.is_sorted(), "{path}: {generated:?}");
            assert_eq!(generated.last(), Some(&3), "{path}: {body}");
        }
    }
}

/// A completion's JSON objects, whole (one) or streamed (each event but `[DONE]`), and its
/// body; the status must be 200.
async fn completion_chunks(addr: SocketAddr, req: Value, stream: bool) -> (Vec<Value>, String) {
    let (status, _, body) = post(addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let chunks = if stream {
        let data = sse_data(&body);
        data[..data.len() - 1].iter().map(|d| parse(d)).collect()
    } else {
        vec![parse(&body)]
    };
    (chunks, body)
}

/// A message's `name` and an earlier answer's `reasoning_content` (or `reasoning`) reach the
/// conversation the template renders.
#[test]
fn names_and_earlier_thinking_reach_the_conversation() {
    let input: Vec<super::types::ChatMessageIn> = serde_json::from_value(json!([
        {"role": "user", "content": "2+2?", "name": "ada"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        {"role": "assistant", "content": "5", "reasoning": "Count."},
        {"role": "user", "content": "And 3+3?", "name": null},
    ]))
    .expect("messages");
    let out = super::completions::chat_messages(input).expect("read");
    let got: Vec<(Option<&str>, Option<&str>)> = out
        .iter()
        .map(|m| (m.name.as_deref(), m.reasoning_content.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (Some("ada"), None),
            (None, Some("Add them.")),
            (None, Some("Count.")),
            (None, None)
        ]
    );
}

/// The token that ended the output (end of sequence, or a stop token) is not text unless the
/// request keeps its stop; special tokens are left out unless `skip_special_tokens` is false;
/// whole and streamed alike, as vLLM writes them.
#[tokio::test]
async fn special_and_ending_tokens_in_the_text() {
    let ids = |s: &str| SimTokenizer.encode(s);
    let (a, c) = (ids("a")[0], ids("c")[0]);
    // a, BOS (special), b, end of sequence.
    let (fake, _d, s) = with_worker(Behavior::Tokens(vec![a, 1, ids("b")[0], 2])).await;
    let text = |extra: Value| {
        let addr = s.addr;
        async move {
            let mut answer = String::new();
            for stream in [false, true] {
                let mut req = json!({"prompt": "hi", "max_tokens": 8, "stream": stream});
                for (k, v) in extra.as_object().expect("object") {
                    req[k] = v.clone();
                }
                let (chunks, body) = completion_chunks(addr, req, stream).await;
                let text: String = chunks
                    .iter()
                    .filter_map(|c| c["choices"][0]["text"].as_str())
                    .collect();
                let last = chunks
                    .iter()
                    .rev()
                    .find(|c| !c["choices"][0]["finish_reason"].is_null());
                assert_eq!(
                    last.expect("finished")["choices"][0]["finish_reason"],
                    "stop",
                    "{body}"
                );
                if stream {
                    assert_eq!(text, answer, "streamed as whole");
                }
                answer = text;
            }
            answer
        }
    };
    assert_eq!(text(json!({})).await, "ab");
    assert_eq!(text(json!({"skip_special_tokens": false})).await, "a<s>b");
    let keep_all = json!({"skip_special_tokens": false, "include_stop_str_in_output": true});
    assert_eq!(text(keep_all).await, "a<s>b</s>");
    // An ordinary token that stops (stop_token_ids) is not text either, unless kept.
    *fake.state.behavior.lock() = Behavior::Tokens(ids("abc"));
    assert_eq!(text(json!({})).await, "abc", "c ended nothing");
    let stops = json!({"stop_token_ids": [c]});
    assert_eq!(text(stops).await, "ab");
    let kept = json!({"stop_token_ids": [c], "include_stop_str_in_output": true});
    assert_eq!(text(kept).await, "abc");
    // An end token the output went on after (ignore_eos) is text like any other.
    *fake.state.behavior.lock() = Behavior::Tokens(vec![a, 2, c]);
    let ignored = json!({"skip_special_tokens": false, "ignore_eos": true});
    assert_eq!(text(ignored).await, "a</s>c");
}

/// Strict tools under `"auto"` reach the worker as their calls' grammar; a format of the
/// request's own wins; without a strict tool the model writes freely.
#[tokio::test]
async fn strict_tools_under_auto_reach_the_worker_as_a_grammar() {
    use dolphin_grammar::Format;
    let (fake, _d, s) = with_worker(Behavior::Text("ok".into())).await;
    let tools = |strict: bool| {
        json!([{"type": "function", "function": {"name": "wx", "strict": strict,
            "parameters": {"type": "object", "properties": {"c": {"type": "string"}},
                "required": ["c"], "additionalProperties": false}}}])
    };
    let base = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let with = |extra: Value| {
        let mut req = base.clone();
        if let (Some(req), Value::Object(extra)) = (req.as_object_mut(), extra) {
            req.extend(extra);
        }
        req
    };
    for (req, want) in [
        (with(json!({"tools": tools(true)})), "lark"),
        (with(json!({"tools": tools(false)})), "none"),
        (
            with(json!({"tools": tools(true), "response_format": {"type": "json_object"}})),
            "json object",
        ),
    ] {
        let (status, _, body) = post(s.addr, "/v1/chat/completions", req.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let sent = fake.state.calls.lock().last().cloned().expect("a call");
        let format = sent
            .sampling
            .and_then(|s| s.structured)
            .map(|w| Format::from_wire(&w).expect("format"));
        let got = match &format {
            None => "none",
            Some(Format::Lark(g)) if g.contains("<tool_call>") && g.contains("\"c\"") => "lark",
            Some(Format::JsonObject) => "json object",
            Some(_) => "other",
        };
        assert_eq!(got, want, "{req}: {format:?}");
    }
}

/// The Responses API's output text carries its tokens' log probabilities where `include` asks
/// for them (`top_logprobs` alternatives each), whole and streamed, the tokens of a call
/// left out; the worker is asked for them.
#[tokio::test]
async fn responses_output_text_logprobs() {
    use crate::testutil::fake_logprobs;
    use crate::tokenizer::SimTokenizer;
    let answer = "Hm.<tool_call>{\"name\": \"wx\", \"arguments\": {\"c\": 1}}</tool_call>";
    let (fake, _d, s) = with_worker(Behavior::Text(answer.into())).await;
    let req = json!({
        "input": "Weather?",
        "tools": [{"type": "function", "name": "wx", "parameters": {"type": "object"}}],
        "max_output_tokens": answer.len(),
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
    });
    let (status, _, body) = post(s.addr, "/v1/responses", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(v["top_logprobs"], 2, "{v}");
    assert_eq!(
        fake.state.calls.lock()[0]
            .sampling
            .as_ref()
            .and_then(|s| s.logprobs),
        Some(2)
    );
    let part = &v["output"][0]["content"][0];
    let lps = part["logprobs"].as_array().expect("logprobs");
    let tokens: String = lps.iter().filter_map(|l| l["token"].as_str()).collect();
    assert_eq!(tokens, "Hm.", "{v}");
    let ids = SimTokenizer.encode("Hm.");
    for (lp, &id) in lps.iter().zip(&ids) {
        let want = fake_logprobs(id, 2);
        assert!((lp["logprob"].as_f64().expect("number") as f32 - want.logprob).abs() < 1e-6);
        assert_eq!(lp["top_logprobs"].as_array().map(Vec::len), Some(2), "{lp}");
        assert!(lp["bytes"].is_array(), "{lp}");
    }
    assert_eq!(v["output"][1]["type"], "function_call", "{v}");

    // Streamed: each delta carries its own tokens', the done event and the part all of them.
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let (status, _, body) = post(s.addr, "/v1/responses", streamed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events: Vec<Value> = sse_data(&body).iter().map(|d| parse(d)).collect();
    let deltas: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .flat_map(|e| e["logprobs"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(&deltas, lps, "{body}");
    let done = events
        .iter()
        .find(|e| e["type"] == "response.output_text.done")
        .expect("done");
    assert_eq!(&done["logprobs"], &part["logprobs"]);

    // Not asked: none, and the worker computes none.
    let plain = json!({"input": "hi", "max_output_tokens": 2});
    let v = parse(&post(s.addr, "/v1/responses", plain).await.2);
    assert_eq!(v["output"][0]["content"][0]["logprobs"], json!([]), "{v}");
    assert!(v["top_logprobs"].is_null(), "{v}");
    let last = fake.state.calls.lock().last().cloned().expect("call");
    assert_eq!(last.sampling.and_then(|s| s.logprobs), None);
}

/// Log probabilities reach the client in OpenAI's two shapes, whole and streamed: the worker's
/// values (the fake's `fake_logprobs`), token texts, completions' offsets and the drawn token
/// among the alternatives, chat's bytes; and the worker is asked for them.
#[tokio::test]
async fn logprobs_whole_and_streamed_in_both_shapes() {
    use crate::testutil::fake_logprobs;
    use crate::tokenizer::SimTokenizer;
    let (fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let ids = SimTokenizer.encode("abc");
    let req = json!({"prompt": "x", "max_tokens": 3, "logprobs": 2});
    let (status, _, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let want = |i: usize| fake_logprobs(ids[i], 2);
    let v = parse(&body);
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["a", "b", "c"]), "{v}");
    assert_eq!(lp["text_offset"], json!([0, 1, 2]), "{v}");
    let near = |x: &Value, y: f32| (x.as_f64().expect("number") as f32 - y).abs() < 1e-6;
    for i in 0..3 {
        assert!(near(&lp["token_logprobs"][i], want(i).logprob), "{v}");
        let top = lp["top_logprobs"][i].as_object().expect("object");
        assert_eq!(top.len(), 2, "{v}");
    }
    // The alternatives of "a" are "a" and "b", one nat apart.
    assert!(
        near(&lp["top_logprobs"][0]["b"], want(0).logprob - 1.0),
        "{v}"
    );
    let asked = fake.state.calls.lock()[0]
        .sampling
        .as_ref()
        .map(|s| s.logprobs);
    assert_eq!(asked, Some(Some(2)));

    let req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                     "logprobs": true, "top_logprobs": 1});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(content.len(), 2, "{v}");
    assert_eq!(content[1]["token"], "b");
    assert_eq!(content[1]["bytes"], json!([b'b']));
    assert!(near(&content[1]["logprob"], want(1).logprob), "{v}");
    assert_eq!(content[1]["top_logprobs"].as_array().map(Vec::len), Some(1));

    // Streamed: every token's entry arrives once, in order, in the chunks.
    let req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                     "stream": true, "logprobs": true});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    let tokens: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| parse(d))
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .map(|e| e["token"].clone())
        .collect();
    assert_eq!(tokens, vec![json!("a"), json!("b"), json!("c")], "{body}");
    let req = json!({"prompt": "x", "max_tokens": 3, "stream": true, "logprobs": 0});
    let (status, _, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    let offsets: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| parse(d))
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["text_offset"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(offsets, vec![json!(0), json!(1), json!(2)], "{body}");

    // With echo the prompt's come first, its first token without any, and the decode worker
    // computes them (the request is prefilled locally).
    let prompt = SimTokenizer.encode("xyz");
    for stream in [false, true] {
        let req = json!({"prompt": "xyz", "max_tokens": 2, "logprobs": 1, "echo": true,
                         "stream": stream});
        let (chunks, body) = completion_chunks(s.addr, req, stream).await;
        let field = |name: &str| -> Vec<Value> {
            chunks
                .iter()
                .filter_map(|c| c["choices"][0]["logprobs"][name].as_array().cloned())
                .flatten()
                .collect()
        };
        assert_eq!(
            field("tokens"),
            vec![json!("x"), json!("y"), json!("z"), json!("a"), json!("b")],
            "{body}"
        );
        assert_eq!(
            field("text_offset"),
            (0..5).map(|i| json!(i)).collect::<Vec<_>>(),
            "{body}"
        );
        let lps = field("token_logprobs");
        assert!(lps[0].is_null(), "{body}");
        assert!(near(&lps[1], fake_logprobs(prompt[1], 1).logprob), "{body}");
        assert!(near(&lps[3], want(0).logprob), "{body}");
        assert!(field("top_logprobs")[0].is_null(), "{body}");
        let call = fake.state.calls.lock().last().cloned().expect("calls");
        let sampling = call.sampling.expect("sampling");
        assert_eq!(
            (sampling.logprobs, sampling.prompt_logprobs),
            (Some(1), Some(1))
        );
        assert!(call.remote.is_none(), "prefilled locally");
    }

    // `max_tokens: 0` with echo scores the prompt alone: nothing generated is sent.
    for stream in [false, true] {
        let req = json!({"prompt": "xyz", "max_tokens": 0, "logprobs": 0, "echo": true,
                         "stream": stream, "stream_options": {"include_usage": true}});
        let (chunks, body) = completion_chunks(s.addr, req, stream).await;
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(text, "xyz", "{body}");
        let tokens: Vec<Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array().cloned())
            .flatten()
            .collect();
        assert_eq!(tokens, vec![json!("x"), json!("y"), json!("z")], "{body}");
        let finish: Vec<&Value> = chunks
            .iter()
            .map(|c| &c["choices"][0]["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, vec!["length"], "{body}");
        let usage = chunks
            .iter()
            .find(|c| c["usage"].is_object())
            .expect("usage");
        assert_eq!(usage["usage"]["completion_tokens"], 0, "{body}");
        let call = fake.state.calls.lock().last().cloned().expect("calls");
        assert_eq!(call.sampling.expect("sampling").max_tokens, 1);
    }
    // Without echo, 0 tokens is still refused.
    let req = json!({"prompt": "xyz", "max_tokens": 0});
    let (status, _, body) = post(s.addr, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Without the fields nothing is asked or reported.
    let (_, _, body) = post(s.addr, "/v1/completions", json!({"prompt": "x"})).await;
    assert!(parse(&body)["choices"][0]["logprobs"].is_null(), "{body}");
    let last = fake.state.calls.lock().last().cloned().expect("calls");
    assert_eq!(last.sampling.expect("sampling").logprobs, None);
}

/// `echo`: a completion's text starts with its prompt (token ids as their text), whole and
/// streamed, once per choice; chat has no such field and refuses it.
#[tokio::test]
async fn echo_starts_the_text_with_the_prompt() {
    let (_fake, _d, s) = with_worker(Behavior::Text("abc".into())).await;
    let whole = json!({"prompt": "hello ", "max_tokens": 3, "echo": true, "n": 2});
    let (status, _, body) = post(s.addr, "/v1/completions", whole).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    for c in v["choices"].as_array().expect("choices") {
        assert_eq!(c["text"], "hello abc", "{v}");
    }
    let ids = SimTokenizer.encode("hi there");
    let streamed = json!({"prompt": ids, "max_tokens": 4, "echo": true, "stream": true});
    let (status, _, body) = post(s.addr, "/v1/completions", streamed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    let text: String = data[..data.len() - 1]
        .iter()
        .filter_map(|d| parse(d)["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "hi thereabca", "{body}");
    let (status, _, body) = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 1, "echo": false}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(parse(&body)["choices"][0]["text"], "a");
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                      "echo": true});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", chat).await;
    let v = assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "echo", "{v}");
}

#[tokio::test]
async fn chat_whole_and_streamed() {
    let (fake, _d, s) = with_worker(Behavior::Text("Hi!".into())).await;
    let messages = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hello"}]}]);
    let (status, _, body) = post(
        s.addr,
        "/v1/chat/completions",
        json!({"messages": messages, "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "Hi!");
    let rendered = SimTokenizer
        .render_chat(
            &[
                ChatMessage::new("system", "be brief"),
                ChatMessage::new("user", "hello"),
            ],
            &crate::tokenizer::ChatExtras::default(),
        )
        .expect("renders");
    assert_eq!(
        fake.state.calls.lock()[0].token_ids,
        SimTokenizer.encode(&rendered)
    );

    let req = json!({"messages": messages, "max_completion_tokens": 3, "stream": true});
    let (status, _, body) = post(s.addr, "/v1/chat/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hi!");
    assert_eq!(
        chunks.last().expect("last")["choices"][0]["finish_reason"],
        "length"
    );
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
}

#[tokio::test]
async fn a_client_that_sends_a_refused_body_whole_still_reads_the_413() {
    let (_fake, _d, s) = with_worker(Behavior::Text("x".into())).await;
    // Announced past the limit (refused before reading), and unannounced (refused once the
    // limit is passed): either way the rest is read and thrown away, so the client, which
    // writes everything before it reads, gets the answer rather than a reset connection.
    let body = vec![b'x'; super::MAX_BODY_BYTES + (4 << 20)];
    let (status, answer) = raw_post(s.addr, "/v1/completions", &[], &body).await;
    assert_eq!(status, 413, "{answer}");
    let (status, whole) = chunked_post(s.addr, "/v1/completions", body.len()).await;
    assert_eq!((status, whole), (413, true));
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let (fake, _d, s) = with_worker(Behavior::Text("x".into())).await;
    let a = s.addr;
    let cases = [
        (
            json!({"prompt": "", "max_tokens": 1}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"prompt": "hi", "max_tokens": 0}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"prompt": "hi", "max_tokens": 1_000_000}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"prompt": "hi", "max_tokens": -1}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"prompt": "hi", "n": 17}), StatusCode::BAD_REQUEST),
        (json!({"prompt": "hi", "n": 0}), StatusCode::BAD_REQUEST),
        (
            json!({"prompt": "hi", "top_p": 0.0}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"prompt": "hi", "top_p": 1.5}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"prompt": "hi", "top_p": -0.1}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"prompt": []}), StatusCode::BAD_REQUEST),
        (
            json!({"prompt": ["a", "b"], "n": 9}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"max_tokens": 3}), StatusCode::BAD_REQUEST),
        (
            json!({"prompt": "hi", "prefill_mode": "sideways"}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"prompt": "x".repeat(1001)}), StatusCode::BAD_REQUEST),
        (
            json!({"prompt": "hi", "model": "gpt-4"}),
            StatusCode::NOT_FOUND,
        ),
    ];
    for (req, want) in cases {
        let (status, _, body) = post(a, "/v1/completions", req.clone()).await;
        let v = assert_error(status, &body, want);
        if want == StatusCode::NOT_FOUND {
            assert_eq!(v["error"]["code"], "model_not_found");
        }
        for field in ["n", "top_p"] {
            if req.get(field).is_some() {
                assert_eq!(v["error"]["param"], field, "{req}: {v}");
            }
        }
        if req["prompt"].as_str().is_some_and(|p| p.len() > 1000) {
            assert_eq!(v["error"]["code"], "context_length_exceeded");
        }
    }
    // OpenAI fields the server does not serve: refused by name when they ask for something,
    // accepted when they ask for nothing.
    let refused = [
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "best_of": 3}),
            "best_of",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "suffix": "end"}),
            "suffix",
        ),
        ("/v1/chat/completions", json!({"logprobs": 2}), "logprobs"),
        (
            "/v1/chat/completions",
            json!({"top_logprobs": 3}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"logprobs": true, "top_logprobs": -1}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"tools": [{"type": "function"}]}),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"tool_choice": "required"}),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            json!({"response_format": {"type": "xml"}}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            json!({"logit_bias": {"42": 101}}),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            json!({"logit_bias": {"hello": 1}}),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            json!({"presence_penalty": 2.5}),
            "presence_penalty",
        ),
        (
            "/v1/chat/completions",
            json!({"presence_penalty": "high"}),
            "presence_penalty",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "stop_token_ids": [-1]}),
            "stop_token_ids",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "min_tokens": 1.5}),
            "min_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"frequency_penalty": -3}),
            "frequency_penalty",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "repetition_penalty": -1.1}),
            "repetition_penalty",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "min_tokens": 4, "max_tokens": 2}),
            "min_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "min_p": 1.5}),
            "min_p",
        ),
        (
            "/v1/chat/completions",
            json!({"guided_json": {"type": "nonsense"}}),
            "guided_json",
        ),
        (
            "/v1/chat/completions",
            json!({"stop_token_ids": [2, 1000000]}),
            "stop_token_ids",
        ),
        ("/v1/chat/completions", json!({"best_of": 2.0}), "best_of"),
        ("/v1/chat/completions", json!({"top_k": -2}), "top_k"),
        (
            "/v1/chat/completions",
            json!({"continue_final_message": true, "add_generation_prompt": true}),
            "continue_final_message",
        ),
        (
            "/v1/chat/completions",
            json!({"add_generation_prompt": "no"}),
            "add_generation_prompt",
        ),
        // This router does not trust request templates.
        (
            "/v1/chat/completions",
            json!({"chat_template": "{{ messages }}"}),
            "chat_template",
        ),
        (
            "/v1/chat/completions",
            json!({"documents": ["text"]}),
            "documents",
        ),
        (
            "/v1/chat/completions",
            json!({"reasoning_effort": "extreme"}),
            "reasoning_effort",
        ),
        (
            "/v1/chat/completions",
            json!({"web_search_options": {}}),
            "web_search_options",
        ),
        (
            "/v1/chat/completions",
            json!({"modalities": ["text", "audio"]}),
            "modalities",
        ),
        (
            "/v1/chat/completions",
            json!({"truncate_prompt_tokens": 0}),
            "truncate_prompt_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "echo": true, "truncate_prompt_tokens": 1}),
            "truncate_prompt_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "chat_template": "{{ messages }}"}),
            "chat_template",
        ),
        (
            "/v1/chat/completions",
            json!({"chat_template_kwargs": {"messages": []}}),
            "chat_template_kwargs",
        ),
        // vLLM's sampling and output fields: served where their type and range hold, refused
        // by name where they do not or where they ask for what is not served.
        (
            "/v1/chat/completions",
            json!({"allowed_token_ids": []}),
            "allowed_token_ids",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "allowed_token_ids": [3, 1000000]}),
            "allowed_token_ids",
        ),
        (
            "/v1/chat/completions",
            json!({"allowed_token_ids": "3"}),
            "allowed_token_ids",
        ),
        (
            "/v1/chat/completions",
            json!({"bad_words": "red"}),
            "bad_words",
        ),
        (
            "/v1/chat/completions",
            json!({"bad_words": [" "]}),
            "bad_words",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "bad_words": [1]}),
            "bad_words",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "bad_words": ["x".repeat(5000)]}),
            "bad_words",
        ),
        (
            "/v1/chat/completions",
            json!({"skip_special_tokens": "no"}),
            "skip_special_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "add_special_tokens": 1}),
            "add_special_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "detokenize": false}),
            "detokenize",
        ),
        (
            "/v1/chat/completions",
            json!({"return_tokens_as_token_ids": "yes"}),
            "return_tokens_as_token_ids",
        ),
        (
            "/v1/chat/completions",
            json!({"return_token_ids": 1}),
            "return_token_ids",
        ),
        ("/v1/chat/completions", json!({"priority": 1.5}), "priority"),
        (
            "/v1/completions",
            json!({"prompt": "hi", "cache_salt": 7}),
            "cache_salt",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "cache_salt": "x".repeat(257)}),
            "cache_salt",
        ),
        (
            "/v1/chat/completions",
            json!({"logits_processors": ["my.module:Processor"]}),
            "logits_processors",
        ),
        (
            "/v1/chat/completions",
            json!({"vllm_xargs": {"a": 1}}),
            "vllm_xargs",
        ),
        (
            "/v1/chat/completions",
            json!({"kv_transfer_params": {"do_remote_prefill": true}}),
            "kv_transfer_params",
        ),
        (
            "/v1/chat/completions",
            json!({"guided_json": {"type": "object"}, "guided_whitespace_pattern": " "}),
            "guided_whitespace_pattern",
        ),
        // SGLang's.
        (
            "/v1/chat/completions",
            json!({"stream_reasoning": false}),
            "stream_reasoning",
        ),
        (
            "/v1/chat/completions",
            json!({"lora_path": "a"}),
            "lora_path",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "return_hidden_states": true}),
            "return_hidden_states",
        ),
        (
            "/v1/chat/completions",
            json!({"custom_logit_processor": "x"}),
            "custom_logit_processor",
        ),
        (
            "/v1/chat/completions",
            json!({"session_params": {"id": "s"}}),
            "session_params",
        ),
        (
            "/v1/chat/completions",
            json!({"no_stop_trim": "yes"}),
            "no_stop_trim",
        ),
        (
            "/v1/chat/completions",
            json!({"separate_reasoning": 1}),
            "separate_reasoning",
        ),
        ("/v1/completions", json!({"prompt": "hi", "rid": 5}), "rid"),
    ];
    let chat = |extra: &serde_json::Value| {
        let mut req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        for (k, v) in extra.as_object().expect("object") {
            req[k] = v.clone();
        }
        req
    };
    for (path, req, field) in refused {
        let req = if path.contains("chat") {
            chat(&req)
        } else {
            req
        };
        let (status, _, body) = post(a, path, req.clone()).await;
        let v = assert_error(status, &body, StatusCode::BAD_REQUEST);
        assert_eq!(v["error"]["param"], field, "{req}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(field)),
            "{v}"
        );
    }
    let (status, _, body) = call(a, Method::POST, "/v1/completions", "{not json").await;
    assert_eq!(
        assert_error(status, &body, StatusCode::BAD_REQUEST)["error"]["type"],
        "invalid_request_error"
    );
    let (status, _, body) = post(a, "/v1/chat/completions", json!({"messages": []})).await;
    let v = assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "messages", "{v}");
    // The dispatcher's range checks name their field too.
    for (req, field) in [
        (
            json!({"prompt": "hi", "max_tokens": 1_000_000}),
            "max_tokens",
        ),
        (json!({"prompt": "hi", "temperature": -1.0}), "temperature"),
    ] {
        let (status, _, body) = post(a, "/v1/completions", req.clone()).await;
        let v = assert_error(status, &body, StatusCode::BAD_REQUEST);
        assert_eq!(v["error"]["param"], field, "{req}: {v}");
    }
    let (status, _, body) = post(
        a,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST);
    let huge = vec![b'x'; super::MAX_BODY_BYTES + 1];
    let (status, _, body) = call(a, Method::POST, "/v1/completions", huge).await;
    assert_error(status, &body, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, _, body) = call(a, Method::GET, "/v2/nothing", "").await;
    assert_error(status, &body, StatusCode::NOT_FOUND);
    let (status, _, body) = call(a, Method::GET, "/v1/completions", "").await;
    assert_error(status, &body, StatusCode::METHOD_NOT_ALLOWED);
    let (status, headers, body) = call(a, Method::PUT, "/v1/chat/completions", "{}").await;
    assert_error(status, &body, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "POST");
    let (status, _, body) = call(a, Method::POST, "/v1/completions", "{\"prompt\": ").await;
    let e = assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("invalid JSON body")),
        "{body}"
    );
    // No announced length: the limit stops the read once the body passes it.
    let (status, _) = chunked_post(a, "/v1/chat/completions", super::MAX_BODY_BYTES + 1).await;
    assert_eq!(status, 413);
    assert!(
        fake.state.calls.lock().is_empty(),
        "no bad request reached the worker"
    );
    // A compressed body is refused as such, not as bad JSON; identity is the body as sent.
    for (encoding, want) in [("gzip", 415), ("identity", 200)] {
        let (status, body) = raw_post(
            a,
            "/v1/completions",
            &[("content-encoding", encoding)],
            json!({"prompt": "hi", "max_tokens": 2})
                .to_string()
                .as_bytes(),
        )
        .await;
        assert_eq!(status, want, "{encoding}: {body}");
        if want == 415 {
            assert!(
                body.contains(r#"content-encoding \"gzip\" are not"#),
                "{body}"
            );
        }
    }
    for extra in [
        json!({"logprobs": false, "tools": [], "tool_choice": "none", "frequency_penalty": 0}),
        json!({"response_format": {"type": "text"}, "parallel_tool_calls": true, "user": "u1"}),
        json!({"detokenize": true, "priority": 0, "cache_salt": "", "return_token_ids": false}),
        json!({"spaces_between_special_tokens": false, "skip_special_tokens": true}),
        json!({"stream_reasoning": true, "separate_reasoning": true, "rid": "r-1"}),
    ] {
        let (status, _, body) = post(a, "/v1/chat/completions", chat(&extra)).await;
        assert_eq!(status, StatusCode::OK, "{extra}: {body}");
    }
}

#[tokio::test]
async fn worker_and_capacity_failures_map_to_429_and_503() {
    let (_fake, _d, s) = with_worker(Behavior::Fail(Code::ResourceExhausted)).await;
    let (status, _, body) = post(s.addr, "/v1/completions", json!({"prompt": "hi"})).await;
    assert_eq!(
        assert_error(status, &body, StatusCode::TOO_MANY_REQUESTS)["error"]["code"],
        "rate_limit_exceeded"
    );

    let empty = start(dispatcher(Policy::AlwaysLocal, RequestLog::disabled())).await;
    let (status, _, body) = post(
        empty.addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_full_router_sheds_with_429_and_streams_hold_their_slot_to_the_end() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Hang).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let limit = InflightLimit::new(2);
    let s = start_with(d, None, limit.clone()).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let stream = || {
        let body = json!({"prompt": "hi", "max_tokens": 5, "stream": true}).to_string();
        hyper::Request::post(format!("http://{}/v1/completions", s.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("request")
    };
    // Two streams past their headers (the worker sent one token and hangs): both slots taken.
    let mut open = Vec::new();
    for _ in 0..2 {
        let resp = client.request(stream()).await.expect("response");
        assert_eq!(resp.status(), StatusCode::OK);
        open.push(resp);
    }
    assert_eq!(limit.in_flight(), 2);
    let (status, _, body) = post(s.addr, "/v1/completions", json!({"prompt": "hi"})).await;
    let v = assert_error(status, &body, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{body}");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{body}");
    // Listing models takes no slot.
    let (status, _, _) = call(s.addr, Method::GET, "/v1/models", "").await;
    assert_eq!(status, StatusCode::OK);
    // A client that goes away frees its slot.
    drop(open.pop());
    until_in_flight(&limit, 1).await;
    let resp = client.request(stream()).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    drop((open, resp));
    until_in_flight(&limit, 0).await;
}

#[tokio::test]
async fn mid_stream_failure_becomes_an_error_event() {
    let (_fake, _d, s) = with_worker(Behavior::FailAfterFirst(Code::Internal)).await;
    let (status, _, body) = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 5, "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&body);
    let last = parse(data.last().expect("events"));
    assert_eq!(last["error"]["type"], "server_error", "{body}");
    assert!(!data.iter().any(|d| d == "[DONE]"));
    // Whole responses turn the same failure into an error status.
    let (status, _, body) = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 5}),
    )
    .await;
    assert_error(status, &body, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn the_workers_context_bounds_requests_and_is_listed() {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("x".into())).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    let mut rec = fake.record();
    rec.context_length = 40;
    d.registry().add(rec).expect("add");
    let s = start(d.clone()).await;
    let (_, _, body) = call(s.addr, Method::GET, "/v1/models", "").await;
    assert_eq!(parse(&body)["data"][0]["max_model_len"], 40);
    // 30 prompt tokens (the sim tokenizer: one per byte) and 11 asked for: one too many.
    let prompt = "p".repeat(30);
    let (status, _, body) = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 11}),
    )
    .await;
    let v = assert_error(status, &body, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    // Without max_tokens the default (16) shrinks to the 10 left.
    let (status, _, body) = post(s.addr, "/v1/completions", json!({"prompt": prompt})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = parse(&body);
    assert_eq!(v["usage"]["completion_tokens"], 10, "{v}");
}

#[tokio::test]
async fn models_health_and_metrics() {
    let (_fake, _d, s) = with_worker(Behavior::Text("x".into())).await;
    let (status, _, body) = call(s.addr, Method::GET, "/v1/models", "").await;
    assert_eq!(status, StatusCode::OK);
    let v = parse(&body);
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "sim-model");
    assert!(
        v["data"][0]["created"]
            .as_u64()
            .is_some_and(|t| t > 1_700_000_000),
        "a Unix time: {v}"
    );
    // One model, as OpenAI's `models.retrieve` asks for it.
    let (status, _, body) = call(s.addr, Method::GET, "/v1/models/sim-model", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(parse(&body), v["data"][0]);
    for other in ["/v1/models/gpt-4", "/v1/models/org/sim-model"] {
        let (status, _, body) = call(s.addr, Method::GET, other, "").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{other}");
        let e = parse(&body);
        assert_eq!(e["error"]["code"], "model_not_found", "{other}: {e}");
    }
    let (status, _, _) = call(s.addr, Method::GET, "/health", "").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "health is on the operators' listener"
    );
    let (status, _, body) = call(s.ops, Method::GET, "/health", "").await;
    assert_eq!(status, StatusCode::OK);
    let v = parse(&body);
    assert_eq!(
        (v["decode_workers"].as_u64(), v["prefill_workers"].as_u64()),
        (Some(1), Some(0))
    );
    let (status, _, _) = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = call(s.addr, Method::GET, "/metrics", "").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "metrics are on the operators' listener"
    );
    let (status, _, body) = call(s.ops, Method::GET, "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("dolphin_router_requests_total"), "{body}");
}

/// A worker answering "x...", a dispatcher in front of it, and a key file holding `keys`
/// (the directory lives as long as the caller holds it).
async fn keyed_worker(
    keys: &str,
) -> (
    FakeWorker,
    Arc<Dispatcher>,
    tempfile::TempDir,
    crate::auth::KeySet,
) {
    let fake = FakeWorker::start("d1", Role::Decode, Behavior::Text("x".into())).await;
    let d = dispatcher(Policy::AlwaysLocal, RequestLog::disabled());
    d.registry().add(fake.record()).expect("add");
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("keys");
    std::fs::write(&path, keys).expect("write");
    let keys = crate::auth::KeySet::load(&path).expect("keys");
    (fake, d, dir, keys)
}

#[tokio::test]
async fn api_keys_are_required_when_configured() {
    let (_fake, d, _dir, keys) = keyed_worker("sk-one\nsk-two\n").await;
    let s = start_with_keys(d, Some(keys)).await;
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    for (auth, message) in [
        (None, "didn't provide an API key"),
        (Some("Bearer sk-three"), "Incorrect API key"),
        (Some("Basic c2stb25l"), "didn't provide an API key"),
    ] {
        let (status, headers, text) =
            call_with(s.addr, Method::POST, "/v1/completions", body.clone(), auth).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:?}: {text}");
        assert_eq!(headers["www-authenticate"], "Bearer");
        let v = parse(&text);
        assert_eq!(v["error"]["code"], "invalid_api_key", "{text}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(message)
        );
    }
    // Unknown paths and models too: nothing answers without a key.
    let (status, _, _) = call(s.addr, Method::GET, "/v1/models", "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    for key in ["sk-one", "sk-two"] {
        let auth = format!("Bearer {key}");
        let (status, _, text) = call_with(
            s.addr,
            Method::POST,
            "/v1/completions",
            body.clone(),
            Some(&auth),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    // The operators' listener takes no key.
    let (status, _, _) = call(s.ops, Method::GET, "/health", "").await;
    assert_eq!(status, StatusCode::OK);
}

/// A browser app on an allowed origin: its preflight is answered without a key, its calls
/// need one and carry the CORS headers whatever the answer (a 401 too, so the app can read
/// it); another origin gets no CORS header; without `--cors-allowed-origins` a preflight is
/// a 405, as before.
#[tokio::test]
async fn browsers_on_allowed_origins_get_cors_headers() {
    let (_fake, d, _dir, keys) = keyed_worker("sk-one\n").await;
    let cors = super::cors::Cors::from_flag(&["https://app.example".to_owned()]).expect("origin");
    let s = start_with_cors(d.clone(), Some(keys), InflightLimit::new(16), cors).await;
    let app = ("origin", "https://app.example");
    let preflight = [
        ("access-control-request-method", "POST"),
        (
            "access-control-request-headers",
            "authorization, content-type",
        ),
    ];
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/models"] {
        let (status, headers, _) = call_headers(
            s.addr,
            Method::OPTIONS,
            path,
            &[app, preflight[0], preflight[1]],
            "",
        )
        .await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{path}");
        assert_eq!(
            headers["access-control-allow-origin"],
            "https://app.example"
        );
        assert_eq!(
            headers["access-control-allow-headers"],
            "authorization, content-type"
        );
    }
    let (status, headers, _) = call_headers(
        s.addr,
        Method::OPTIONS,
        "/v1/completions",
        &[("origin", "https://evil.example"), preflight[0]],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(!headers.contains_key("access-control-allow-origin"));

    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let json = ("content-type", "application/json");
    let (status, headers, _) = call_headers(
        s.addr,
        Method::POST,
        "/v1/completions",
        &[app, json],
        body.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    let key = ("authorization", "Bearer sk-one");
    let (status, headers, text) = call_headers(
        s.addr,
        Method::POST,
        "/v1/completions",
        &[app, json, key],
        body.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(headers["vary"], "origin");
    assert!(
        headers["access-control-expose-headers"]
            .to_str()
            .expect("text")
            .contains("x-request-id")
    );
    let (status, headers, _) =
        call_headers(s.addr, Method::GET, "/v1/models", &[app, key], "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    let (_, headers, _) = call_headers(
        s.addr,
        Method::POST,
        "/v1/completions",
        &[json, key],
        body.clone(),
    )
    .await;
    assert!(
        !headers.contains_key("access-control-allow-origin"),
        "no Origin, no CORS"
    );

    let plain = start(d).await;
    let (status, headers, _) = call_headers(
        plain.addr,
        Method::OPTIONS,
        "/v1/completions",
        &[app, preflight[0]],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(!headers.contains_key("access-control-allow-origin"));
}

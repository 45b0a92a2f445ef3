//! The four clients of the router-overhead benchmark, one connection each: the decode worker
//! called directly over gRPC, and the router over gRPC, HTTP and HTTP with SSE streaming. Each
//! checks that its response is complete (all `max_tokens` tokens, a finish reason), so a
//! benchmark never times failures as fast successes.

use std::sync::Arc;

use bytes::Bytes;
use dolphin_proto::v1::{
    self, decode_worker_client::DecodeWorkerClient, generate_request::Input,
    inference_client::InferenceClient,
};
use tonic::transport::{Channel, Endpoint};

use crate::BenchError;
use crate::http_client::HttpConn;
use crate::load::Requester;

/// The prompts of a run in every form a client needs, indexed alike.
#[derive(Debug)]
pub struct Prompts {
    /// Prompt text (what the router receives).
    pub texts: Vec<String>,
    /// The same prompts as the router's tokenizer encodes them (what the decode worker gets).
    pub tokens: Vec<Vec<u32>>,
    /// `/v1/completions` bodies, non-streamed.
    pub http_bodies: Vec<Bytes>,
    /// `/v1/completions` bodies with `stream: true`.
    pub sse_bodies: Vec<Bytes>,
    /// Tokens each request generates.
    pub max_tokens: u32,
}

impl Prompts {
    /// Builds the bodies for `texts` tokenized as `tokens`.
    pub fn new(texts: Vec<String>, tokens: Vec<Vec<u32>>, model: &str, max_tokens: u32) -> Self {
        let body = |text: &String, stream: bool| {
            Bytes::from(
                serde_json::json!({
                    "model": model,
                    "prompt": text,
                    "max_tokens": max_tokens,
                    "temperature": 0.0,
                    "stream": stream,
                })
                .to_string(),
            )
        };
        Prompts {
            http_bodies: texts.iter().map(|t| body(t, false)).collect(),
            sse_bodies: texts.iter().map(|t| body(t, true)).collect(),
            texts,
            tokens,
            max_tokens,
        }
    }

    fn sampling(&self) -> v1::SamplingParams {
        v1::SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            max_tokens: self.max_tokens,
            ..Default::default()
        }
    }
}

/// Which path a client exercises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Mode {
    /// `DecodeWorker.Decode` on the decode worker, no router.
    DirectGrpc,
    /// `Inference.Generate` on the router (local prefill).
    RouterGrpc,
    /// `POST /v1/completions` on the router, whole response (local prefill).
    RouterHttp,
    /// `POST /v1/completions` with `stream: true` (server-sent events, local prefill).
    RouterHttpSse,
    /// `Inference.Generate` on a router that prefills every request remotely.
    RemoteGrpc,
    /// `POST /v1/completions` on the remote-prefill router.
    RemoteHttp,
    /// `POST /v1/completions`, streamed, on the remote-prefill router.
    RemoteHttpSse,
    /// `POST /v1/completions` on the mock worker itself, no router (the peers' baseline).
    MockHttp,
    /// The same, streamed.
    MockHttpSse,
    /// Through nginx (plain reverse proxy) to the mock.
    NginxHttp,
    /// Through nginx, streamed.
    NginxHttpSse,
    /// Through smg (cache-aware) to the mock.
    SmgHttp,
    /// Through smg, streamed.
    SmgHttpSse,
    /// Through smg in P/D mode to a prefill and a decode mock.
    SmgPdHttp,
    /// Through smg in P/D mode, streamed.
    SmgPdHttpSse,
}

/// The process a mode's requests go through (whose CPU time is measured).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// No router: the worker itself.
    None,
    /// Dolphin's router, local prefill.
    DolphinLocal,
    /// Dolphin's router, remote prefill.
    DolphinRemote,
    /// nginx.
    Nginx,
    /// smg, cache-aware.
    Smg,
    /// smg, P/D mode.
    SmgPd,
}

impl Mode {
    /// Name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::DirectGrpc => "direct_grpc",
            Mode::RouterGrpc => "router_grpc",
            Mode::RouterHttp => "router_http",
            Mode::RouterHttpSse => "router_http_sse",
            Mode::RemoteGrpc => "remote_grpc",
            Mode::RemoteHttp => "remote_http",
            Mode::RemoteHttpSse => "remote_http_sse",
            Mode::MockHttp => "mock_http",
            Mode::MockHttpSse => "mock_http_sse",
            Mode::NginxHttp => "nginx_http",
            Mode::NginxHttpSse => "nginx_http_sse",
            Mode::SmgHttp => "smg_http",
            Mode::SmgHttpSse => "smg_http_sse",
            Mode::SmgPdHttp => "smg_pd_http",
            Mode::SmgPdHttpSse => "smg_pd_http_sse",
        }
    }

    /// The router this mode goes through.
    pub fn target(self) -> Target {
        match self {
            Mode::DirectGrpc | Mode::MockHttp | Mode::MockHttpSse => Target::None,
            Mode::RouterGrpc | Mode::RouterHttp | Mode::RouterHttpSse => Target::DolphinLocal,
            Mode::RemoteGrpc | Mode::RemoteHttp | Mode::RemoteHttpSse => Target::DolphinRemote,
            Mode::NginxHttp | Mode::NginxHttpSse => Target::Nginx,
            Mode::SmgHttp | Mode::SmgHttpSse => Target::Smg,
            Mode::SmgPdHttp | Mode::SmgPdHttpSse => Target::SmgPd,
        }
    }

    /// Whether the response is streamed as server-sent events.
    pub fn sse(self) -> bool {
        matches!(
            self,
            Mode::RouterHttpSse
                | Mode::RemoteHttpSse
                | Mode::MockHttpSse
                | Mode::NginxHttpSse
                | Mode::SmgHttpSse
                | Mode::SmgPdHttpSse
        )
    }

    /// Whether the client speaks gRPC.
    pub fn grpc(self) -> bool {
        matches!(self, Mode::DirectGrpc | Mode::RouterGrpc | Mode::RemoteGrpc)
    }

    /// The no-router mode whose latency this mode's added latency is measured against: the
    /// decode worker called directly for Dolphin's router, the mock for the peers (same
    /// response shape, streamed or not).
    pub fn baseline(self) -> Mode {
        match self.target() {
            Target::None => self,
            Target::DolphinLocal | Target::DolphinRemote => Mode::DirectGrpc,
            _ if self.sse() => Mode::MockHttpSse,
            _ => Mode::MockHttp,
        }
    }
}

/// Addresses of everything a client may connect to (`None`: not running).
#[derive(Clone, Debug, Default)]
pub struct Addrs {
    /// The decode worker's gRPC address.
    pub decode_grpc: Option<String>,
    /// The local-prefill router's gRPC and HTTP addresses.
    pub router_grpc: Option<String>,
    /// See `router_grpc`.
    pub router_http: Option<String>,
    /// The remote-prefill router's gRPC and HTTP addresses.
    pub remote_grpc: Option<String>,
    /// See `remote_grpc`.
    pub remote_http: Option<String>,
    /// The mock worker, nginx, smg and smg in P/D mode (HTTP).
    pub mock_http: Option<String>,
    /// See `mock_http`.
    pub nginx_http: Option<String>,
    /// See `mock_http`.
    pub smg_http: Option<String>,
    /// See `mock_http`.
    pub smg_pd_http: Option<String>,
}

impl Addrs {
    /// Where `mode`'s client connects.
    pub fn of(&self, mode: Mode) -> Option<&str> {
        let a = match mode {
            Mode::DirectGrpc => &self.decode_grpc,
            Mode::RouterGrpc => &self.router_grpc,
            Mode::RouterHttp | Mode::RouterHttpSse => &self.router_http,
            Mode::RemoteGrpc => &self.remote_grpc,
            Mode::RemoteHttp | Mode::RemoteHttpSse => &self.remote_http,
            Mode::MockHttp | Mode::MockHttpSse => &self.mock_http,
            Mode::NginxHttp | Mode::NginxHttpSse => &self.nginx_http,
            Mode::SmgHttp | Mode::SmgHttpSse => &self.smg_http,
            Mode::SmgPdHttp | Mode::SmgPdHttpSse => &self.smg_pd_http,
        };
        a.as_deref()
    }
}

/// One client connection of any mode.
#[derive(Debug)]
pub struct Client {
    conn: Conn,
    prompts: Arc<Prompts>,
    /// Index of the next prompt; clients start at different prompts.
    next: usize,
    /// Prefix of request ids sent directly to the worker (which requires them unique).
    id_prefix: String,
    seq: u64,
}

#[derive(Debug)]
enum Conn {
    Direct(DecodeWorkerClient<Channel>),
    Router(InferenceClient<Channel>),
    Http { conn: HttpConn, sse: bool },
}

/// A gRPC channel of its own (one HTTP/2 connection) with TCP_NODELAY.
async fn channel(addr: &str) -> Result<Channel, BenchError> {
    Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| BenchError::Http(format!("bad address {addr}: {e}")))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| BenchError::Http(format!("connect to {addr}: {e}")))
}

impl Client {
    /// Connects client number `index` for `mode` to its address in `addrs`.
    pub async fn connect(
        mode: Mode,
        index: usize,
        prompts: Arc<Prompts>,
        addrs: &Addrs,
    ) -> Result<Client, BenchError> {
        let addr = addrs
            .of(mode)
            .ok_or_else(|| BenchError::Setup(format!("{} is not running", mode.as_str())))?;
        let conn = match mode {
            Mode::DirectGrpc => Conn::Direct(DecodeWorkerClient::new(channel(addr).await?)),
            Mode::RouterGrpc | Mode::RemoteGrpc => {
                Conn::Router(InferenceClient::new(channel(addr).await?))
            }
            _ => Conn::Http {
                conn: HttpConn::connect(addr).await?,
                sse: mode.sse(),
            },
        };
        Ok(Client {
            conn,
            next: index * 7 % prompts.texts.len().max(1),
            prompts,
            id_prefix: format!("bench-{}-{index}", std::process::id()),
            seq: 0,
        })
    }
}

fn bad(what: impl Into<String>) -> BenchError {
    BenchError::Http(what.into())
}

impl Requester for Client {
    async fn call(&mut self) -> Result<(), BenchError> {
        let i = self.next;
        self.next = (i + 1) % self.prompts.texts.len();
        self.seq += 1;
        let want = self.prompts.max_tokens;
        let p = &self.prompts;
        let (tokens, finished) = match &mut self.conn {
            Conn::Direct(c) => {
                let req = v1::DecodeRequest {
                    request_id: format!("{}-{}", self.id_prefix, self.seq),
                    token_ids: p.tokens[i].clone(),
                    sampling: Some(p.sampling()),
                    remote: None,
                };
                let mut s = c
                    .decode(req)
                    .await
                    .map_err(|e| bad(e.to_string()))?
                    .into_inner();
                let (mut n, mut fin) = (0, false);
                while let Some(m) = s.message().await.map_err(|e| bad(e.to_string()))? {
                    n += m.token_ids.len() as u32;
                    fin |= m.finish_reason != 0;
                }
                (n, fin)
            }
            Conn::Router(c) => {
                let req = v1::GenerateRequest {
                    input: Some(Input::Text(p.texts[i].clone())),
                    sampling: Some(p.sampling()),
                    ..Default::default()
                };
                let mut s = c
                    .generate(req)
                    .await
                    .map_err(|e| bad(e.to_string()))?
                    .into_inner();
                let (mut n, mut fin) = (0, false);
                while let Some(m) = s.message().await.map_err(|e| bad(e.to_string()))? {
                    n += m.token_ids.len() as u32;
                    fin |= m.finish_reason != 0;
                }
                (n, fin)
            }
            Conn::Http { conn, sse } => {
                let body = if *sse {
                    &p.sse_bodies[i]
                } else {
                    &p.http_bodies[i]
                };
                let (status, resp) = conn.post_json("/v1/completions", body.clone()).await?;
                if !status.is_success() {
                    return Err(bad(format!(
                        "HTTP {status}: {}",
                        String::from_utf8_lossy(&resp)
                    )));
                }
                if *sse {
                    check_sse(&resp)?
                } else {
                    check_whole(&resp)?
                }
            }
        };
        if !finished || tokens != want {
            return Err(bad(format!(
                "incomplete response: {tokens} of {want} tokens, finished: {finished}"
            )));
        }
        Ok(())
    }
}

/// Completion tokens and whether a finish reason came, from a whole `/v1/completions` body.
fn check_whole(body: &[u8]) -> Result<(u32, bool), BenchError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("response JSON: {e}")))?;
    let tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0) as u32;
    let finished = v["choices"][0]["finish_reason"].is_string();
    Ok((tokens, finished))
}

/// Text chunks become tokens one to one for the sim tokenizer's printable ids, so the token
/// count of an SSE stream is its number of text bytes; finished means a finish reason and the
/// closing `[DONE]`.
fn check_sse(body: &[u8]) -> Result<(u32, bool), BenchError> {
    let text = std::str::from_utf8(body).map_err(|e| bad(format!("SSE body: {e}")))?;
    let (mut chars, mut reason, mut done) = (0u32, false, false);
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim_start) else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(data).map_err(|e| bad(format!("SSE event JSON: {e}")))?;
        if v.get("error").is_some() {
            return Err(bad(format!("SSE error event: {data}")));
        }
        let choice = &v["choices"][0];
        chars += choice["text"].as_str().map_or(0, |t| t.len() as u32);
        reason |= choice["finish_reason"].is_string();
    }
    Ok((chars, reason && done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_body_is_checked() {
        let body = br#"{"choices":[{"text":"abcdefgh","finish_reason":"length"}],"usage":{"completion_tokens":8}}"#;
        assert_eq!(check_whole(body).expect("ok"), (8, true));
        assert_eq!(check_whole(br#"{"choices":[{}]}"#).expect("ok"), (0, false));
        assert!(check_whole(b"not json").is_err());
    }

    #[test]
    fn sse_stream_is_checked() {
        let body = "data: {\"choices\":[{\"text\":\"abc\",\"finish_reason\":null}]}\n\n\
                    data: {\"choices\":[{\"text\":\"de\",\"finish_reason\":\"length\"}]}\n\n\
                    data: [DONE]\n\n";
        assert_eq!(check_sse(body.as_bytes()).expect("ok"), (5, true));
        let cut = "data: {\"choices\":[{\"text\":\"abc\",\"finish_reason\":null}]}\n\n";
        assert_eq!(check_sse(cut.as_bytes()).expect("ok"), (3, false));
        assert!(check_sse(b"data: {\"error\":{\"message\":\"x\"}}\n\n").is_err());
    }

    #[test]
    fn bodies_carry_the_prompt_and_stream_flag() {
        let p = Prompts::new(vec!["hi".into()], vec![vec![75, 76]], "sim-model", 8);
        let whole: serde_json::Value = serde_json::from_slice(&p.http_bodies[0]).expect("json");
        let sse: serde_json::Value = serde_json::from_slice(&p.sse_bodies[0]).expect("json");
        assert_eq!(
            (whole["prompt"].as_str(), whole["stream"].as_bool()),
            (Some("hi"), Some(false))
        );
        assert_eq!(
            (sse["max_tokens"].as_u64(), sse["stream"].as_bool()),
            (Some(8), Some(true))
        );
    }
}

//! A worker that answers instantly, for measuring what a router in front of it costs: nginx and
//! SGLang's gateway (`smg`) in `router_overhead` talk HTTP to it, as they would to an SGLang or
//! vLLM server. It serves what `smg` needs to register a worker (`GET /health`, `GET /v1/models`)
//! and `POST /v1/completions` (whole or `stream: true`), answering `max_tokens` one-character
//! tokens with a finish reason, so the benchmark's client checks the same response shape it checks
//! on Dolphin's router. Everything else is 404. One thread: it never competes with the router
//! under test for more than one core.
//!
//! `mock_http_worker --addr 127.0.0.1:0 --model sim-model` prints
//! `DOLPHIN_READY {"role":"mock","http_addr":"127.0.0.1:PORT"}` once it listens.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
#[command(about = "An HTTP worker that answers completions instantly (a router benchmark's peer)")]
struct Args {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: String,
    /// The model id it serves (`/v1/models`; requests must name it).
    #[arg(long, default_value = "sim-model")]
    model: String,
}

struct Mock {
    models: Bytes,
    model: String,
}

fn reply(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error"}});
    reply(status, "application/json", Bytes::from(body.to_string()))
}

impl Mock {
    fn completion(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
            return error(StatusCode::BAD_REQUEST, "body is not JSON");
        };
        if v["model"].as_str() != Some(self.model.as_str()) {
            return error(StatusCode::NOT_FOUND, "unknown model");
        }
        let n = v["max_tokens"].as_u64().unwrap_or(16).min(4096) as usize;
        let prompt_tokens = v["prompt"].as_str().map_or(0, str::len);
        let usage = serde_json::json!({
            "prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n
        });
        if v["stream"].as_bool() == Some(true) {
            let mut out = String::with_capacity(n * 128 + 64);
            for i in 0..n {
                let last = i + 1 == n;
                let chunk = serde_json::json!({
                    "id": "cmpl-mock", "object": "text_completion", "created": 1, "model": self.model,
                    "choices": [{"index": 0, "text": "a", "logprobs": null,
                                 "finish_reason": if last { Some("length") } else { None }}]
                });
                let _ = write!(out, "data: {chunk}\n\n");
            }
            out.push_str("data: [DONE]\n\n");
            return reply(StatusCode::OK, "text/event-stream", Bytes::from(out));
        }
        let whole = serde_json::json!({
            "id": "cmpl-mock", "object": "text_completion", "created": 1, "model": self.model,
            "choices": [{"index": 0, "text": "a".repeat(n), "logprobs": null, "finish_reason": "length"}],
            "usage": usage,
        });
        reply(
            StatusCode::OK,
            "application/json",
            Bytes::from(whole.to_string()),
        )
    }

    async fn serve(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let (parts, body) = req.into_parts();
        let resp = match (parts.method, parts.uri.path()) {
            (Method::GET, "/health") => reply(StatusCode::OK, "text/plain", Bytes::new()),
            (Method::GET, "/v1/models") => {
                reply(StatusCode::OK, "application/json", self.models.clone())
            }
            (Method::POST, "/v1/completions") => match body.collect().await {
                Ok(b) => self.completion(&b.to_bytes()),
                Err(_) => error(StatusCode::BAD_REQUEST, "body could not be read"),
            },
            _ => error(StatusCode::NOT_FOUND, "not found"),
        };
        Ok(resp)
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&args.addr)
            .await
            .with_context(|| format!("bind {}", args.addr))?;
        let addr = listener.local_addr()?;
        let models = serde_json::json!({"object": "list", "data": [
            {"id": args.model, "object": "model", "created": 1, "owned_by": "sglang"}
        ]});
        let mock = Arc::new(Mock {
            models: Bytes::from(models.to_string()),
            model: args.model,
        });
        println!(
            "DOLPHIN_READY {}",
            serde_json::json!({"role": "mock", "http_addr": addr.to_string()})
        );
        loop {
            let (tcp, _) = listener.accept().await.context("accept")?;
            let _ = tcp.set_nodelay(true);
            let mock = mock.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| mock.clone().serve(req));
                let _ = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    })
}

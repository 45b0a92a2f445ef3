//! A minimal HTTP/1.1 client for the OpenAI-compatible API (hyper-util's client), and an SSE
//! body splitter.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A complete response.
#[derive(Clone, Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The `content-type` header, if any.
    pub content_type: Option<String>,
    /// The whole body.
    pub body: Bytes,
}

impl Response {
    /// The body as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .map_err(|e| anyhow::anyhow!("body is not JSON ({e}): {}", self.text()))
    }

    /// The `data:` payloads of an SSE body, in order (`[DONE]` included).
    pub fn sse_data(&self) -> Vec<String> {
        sse_data(&self.text())
    }
}

/// `GET http://{addr}{path}`.
pub async fn get(addr: &str, path: &str) -> anyhow::Result<Response> {
    send("GET", addr, path, None, None).await
}

/// `GET http://{addr}{path}` with `Authorization: Bearer KEY`.
pub async fn get_auth(addr: &str, path: &str, key: &str) -> anyhow::Result<Response> {
    send("GET", addr, path, None, Some(key)).await
}

/// `POST http://{addr}{path}` with a body sent as `application/json` (it need not be valid JSON:
/// the bad-input tests send broken bodies).
pub async fn post_json(addr: &str, path: &str, body: &str) -> anyhow::Result<Response> {
    send("POST", addr, path, Some(body.to_owned()), None).await
}

/// [`post_json`] with `Authorization: Bearer KEY`.
pub async fn post_json_auth(
    addr: &str,
    path: &str,
    body: &str,
    key: &str,
) -> anyhow::Result<Response> {
    send("POST", addr, path, Some(body.to_owned()), Some(key)).await
}

async fn send(
    method: &str,
    addr: &str,
    path: &str,
    body: Option<String>,
    key: Option<&str>,
) -> anyhow::Result<Response> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    if let Some(key) = key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    read(client.request(req).await?).await
}

/// The status, content type and whole body of `resp`.
async fn read(resp: hyper::Response<hyper::body::Incoming>) -> anyhow::Result<Response> {
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(Response {
        status,
        content_type,
        body,
    })
}

/// `POST https://{addr}{path}` with a JSON body over TLS (HTTP/1.1, the connection closed
/// after the response).
pub async fn post_json_tls(
    addr: &str,
    path: &str,
    body: &str,
    tls: &dolphin_tls::Tls,
) -> anyhow::Result<Response> {
    let dialer = dolphin_tls::Dialer::new(Some(tls), &[b"http/1.1"], Duration::from_secs(10))?;
    let stream = dialer.dial(addr).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method("POST")
        .uri(path)
        .header("host", addr)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))?;
    read(send.send_request(req).await?).await
}

/// Splits an SSE stream into its events' `data:` payloads (multi-line data joined with "\n").
pub fn sse_data(text: &str) -> Vec<String> {
    let text = text.replace("\r\n", "\n");
    text.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_sse_events() {
        let body =
            "data: {\"a\":1}\n\n: comment\n\nevent: x\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n";
        assert_eq!(sse_data(body), ["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
    }

    #[test]
    fn joins_multiline_data() {
        assert_eq!(sse_data("data: a\ndata: b\n\n"), ["a\nb"]);
    }
}

//! One keep-alive HTTP/1.1 client connection with TCP_NODELAY (hyper's connection API: no pool,
//! so a benchmark's N clients are exactly N connections).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::BenchError;

/// A single HTTP/1.1 connection; requests on it go one after another.
#[derive(Debug)]
pub struct HttpConn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

impl HttpConn {
    /// Connects to `addr` (`host:port`) with TCP_NODELAY.
    pub async fn connect(addr: &str) -> Result<HttpConn, BenchError> {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(BenchError::io(format!("connect to {addr}")))?;
        tcp.set_nodelay(true)
            .map_err(BenchError::io("set TCP_NODELAY"))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| BenchError::Http(format!("handshake with {addr}: {e}")))?;
        // Drives the connection; ends when `sender` is dropped or the server closes.
        tokio::spawn(conn);
        Ok(HttpConn {
            sender,
            host: addr.to_string(),
        })
    }

    /// `POST path` with a JSON body; returns the status and the whole response body.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), BenchError> {
        self.send(Method::POST, path, body).await
    }

    /// `GET path`; returns the status and the whole response body.
    pub async fn get(&mut self, path: &str) -> Result<(StatusCode, Bytes), BenchError> {
        self.send(Method::GET, path, Bytes::new()).await
    }

    async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), BenchError> {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.host)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| BenchError::Http(format!("build request: {e}")))?;
        self.sender
            .ready()
            .await
            .map_err(|e| BenchError::Http(format!("connection closed: {e}")))?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| BenchError::Http(format!("{path}: {e}")))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| BenchError::Http(format!("{path} body: {e}")))?
            .to_bytes();
        Ok((status, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Answers every request on one connection with its own body echoed back.
    async fn echo_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = Vec::new();
            loop {
                let mut chunk = [0u8; 4096];
                let n = s.read(&mut chunk).await.expect("read");
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                let Some(end) = text.find("\r\n\r\n") else {
                    continue;
                };
                let len: usize = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(|v| v.trim().parse().expect("len"))
                    })
                    .unwrap_or(0);
                if buf.len() < end + 4 + len {
                    continue;
                }
                let body = buf[end + 4..end + 4 + len].to_vec();
                buf.drain(..end + 4 + len);
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                s.write_all(head.as_bytes()).await.expect("write");
                s.write_all(&body).await.expect("write");
            }
        });
        addr
    }

    #[tokio::test]
    async fn keeps_one_connection_for_several_requests() {
        let addr = echo_server().await;
        let mut c = HttpConn::connect(&addr).await.expect("connect");
        for i in 0..3 {
            let body = Bytes::from(format!("{{\"i\":{i}}}"));
            let (status, got) = c.post_json("/x", body.clone()).await.expect("post");
            assert_eq!(status, StatusCode::OK);
            assert_eq!(got, body);
        }
        // The server accepts a single connection: a fourth request still works only because
        // the connection was kept alive.
        let (status, got) = c.get("/y").await.expect("get");
        assert_eq!((status, got.len()), (StatusCode::OK, 0));
    }
}

//! A connection that is TCP, or TLS over TCP, as the configuration decided.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{client, server};

/// A TCP connection, with or without TLS on it.
#[derive(Debug)]
pub enum MaybeTlsStream {
    /// No TLS.
    Plain(TcpStream),
    /// TLS, this side the server.
    Server(Box<server::TlsStream<TcpStream>>),
    /// TLS, this side the client.
    Client(Box<client::TlsStream<TcpStream>>),
}

impl MaybeTlsStream {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Server(s) => s.get_ref().0,
            Self::Client(s) => s.get_ref().0,
        }
    }

    /// Whether TLS protects the connection.
    pub fn is_tls(&self) -> bool {
        !matches!(self, Self::Plain(_))
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            MaybeTlsStream::Plain($s) => $e,
            MaybeTlsStream::Server($s) => $e,
            MaybeTlsStream::Client($s) => $e,
        }
    };
}

impl AsyncRead for MaybeTlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for MaybeTlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Server(s) => s.is_write_vectored(),
            Self::Client(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}

/// For hyper-util's pooled client (the router's `Worker` calls); HTTP/2 only, so nothing to say
/// about ALPN.
impl hyper_util::client::legacy::connect::Connection for MaybeTlsStream {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

impl tonic::transport::server::Connected for MaybeTlsStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp().connect_info()
    }
}

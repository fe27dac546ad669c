//! The API's listener. Its connections give the HTTP server's own refusals, those
//! made before a request reaches delayq (a request line or header that does not
//! parse: 400; headers too large: 431; a URI too long: 414), the JSON error shape
//! every other answer has.
//!
//! The HTTP server writes such a refusal as a bare head (`content-length: 0`,
//! `connection: close`) and closes the connection; no handler or layer sees it.
//! [`RefusalIo`] recognises that head at the end of what the server writes and
//! writes the same answer with a body instead. Nothing else can look like it: every
//! other answer delayq gives has a body (JSON or Prometheus text), and neither
//! holds a raw CR LF.
//!
//! With `api.tls` the connections are TLS: each handshake runs in a task of its own
//! (at most [`HANDSHAKE_TIMEOUT`]), so that a slow or silent client holds up no
//! other, and only connections whose handshake succeeded reach the HTTP server.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

/// Longest a TLS handshake may take before its connection is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The API's listener: TCP, or TLS over it.
pub enum Listener {
    Plain(TcpListener),
    Tls {
        local: SocketAddr,
        /// Connections whose handshake succeeded, from [`Listener::tls`]'s task.
        ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
        accepting: tokio::task::JoinHandle<()>,
    },
}

impl Listener {
    /// TLS over `tcp`: connections are accepted and their handshakes run by a task
    /// that ends with the listener.
    pub fn tls(tcp: TcpListener, acceptor: tokio_rustls::TlsAcceptor) -> io::Result<Listener> {
        let local = tcp.local_addr()?;
        let (done, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(async move {
            let mut tcp = tcp;
            loop {
                let (io, addr) = axum::serve::Listener::accept(&mut tcp).await;
                let (acceptor, done) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
                        Ok(Ok(tls)) => {
                            let _ = done.send((tls, addr)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%addr, error = %e, "TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Listener::Tls {
            local,
            ready,
            accepting,
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Tls { accepting, .. } = self {
            accepting.abort();
        }
    }
}

impl axum::serve::Listener for Listener {
    type Io = RefusalIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (RefusalIo, SocketAddr) {
        let (inner, addr) = match self {
            Listener::Plain(tcp) => {
                let (io, addr) = axum::serve::Listener::accept(tcp).await;
                (Stream::Plain(io), addr)
            }
            Listener::Tls { ready, .. } => match ready.recv().await {
                Some((tls, addr)) => (Stream::Tls(Box::new(tls)), addr),
                // The accepting task ended (only when aborted): nothing comes.
                None => std::future::pending().await,
            },
        };
        (
            RefusalIo {
                inner,
                pending: Vec::new(),
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Listener::Plain(tcp) => tcp.local_addr(),
            Listener::Tls { local, .. } => Ok(*local),
        }
    }
}

/// A connection's peer address, for handlers that ask (`ConnectInfo<Peer>`).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Listener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

/// One connection, plain or TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Stream::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Stream::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(io) => Pin::new(io).poll_flush(cx),
            Stream::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Stream::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection that rewrites the HTTP server's bare refusals (see the module).
pub struct RefusalIo {
    inner: Stream,
    /// Bytes accepted from the server but not yet written out.
    pending: Vec<u8>,
}

impl RefusalIo {
    /// Writes out `pending`; Ready once it is empty.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for RefusalIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for RefusalIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        match with_json_refusal(buf) {
            None => Pin::new(&mut this.inner).poll_write(cx, buf),
            Some(rewritten) => {
                // Taken whole: the server sees its bytes written, the rewritten
                // ones go out before anything else (flush and shutdown drain them).
                this.pending = rewritten;
                if let Poll::Ready(Err(e)) = this.drain(cx) {
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(buf.len()))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    // One buffer per write, so that a refusal's head is never split over slices.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// The refusals the HTTP server makes on its own: status line, error code, detail.
const REFUSALS: &[(&str, &str, &str)] = &[
    (
        "HTTP/1.1 400 Bad Request\r\n",
        "bad_request",
        "the request line or a header could not be parsed as HTTP/1.1",
    ),
    (
        "HTTP/1.1 431 Request Header Fields Too Large\r\n",
        "headers_too_large",
        "the request's headers are larger than the server reads",
    ),
    (
        "HTTP/1.1 414 URI Too Long\r\n",
        "uri_too_long",
        "the request's URI is longer than the server reads",
    ),
];

/// `written` with a bare refusal at its end given a JSON body; None when it ends
/// with none.
fn with_json_refusal(written: &[u8]) -> Option<Vec<u8>> {
    if !written.ends_with(b"\r\n\r\n") {
        return None;
    }
    REFUSALS.iter().find_map(|(line, code, detail)| {
        let start = find_last(written, line.as_bytes())?;
        let head = std::str::from_utf8(&written[start + line.len()..]).ok()?;
        let headers: Vec<&str> = head.trim_end_matches("\r\n").split("\r\n").collect();
        if !headers
            .iter()
            .any(|h| h.eq_ignore_ascii_case("content-length: 0"))
        {
            return None;
        }
        let body = serde_json::json!({ "error": code, "detail": detail }).to_string();
        let mut out = written[..start].to_vec();
        out.extend_from_slice(line.as_bytes());
        for header in headers.iter().filter(|h| {
            let name = h.split(':').next().unwrap_or_default();
            !name.eq_ignore_ascii_case("content-length")
                && !name.eq_ignore_ascii_case("content-type")
        }) {
            out.extend_from_slice(header.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(
            format!(
                "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        Some(out)
    })
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(written: &str, want: Option<&str>) {
        let got = with_json_refusal(written.as_bytes()).map(|b| String::from_utf8(b).unwrap());
        assert_eq!(got.as_deref(), want, "{written:?}");
    }

    #[test]
    fn bare_refusals_get_the_json_body_and_nothing_else_changes() {
        let refused = with_json_refusal(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: D\r\n\r\n",
        )
        .unwrap();
        let refused = String::from_utf8(refused).unwrap();
        let (head, body) = refused.split_once("\r\n\r\n").unwrap();
        assert_eq!(
            head,
            format!(
                "HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ndate: D\r\ncontent-type: application/json\r\ncontent-length: {}",
                body.len()
            )
        );
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"], "headers_too_large");
        assert!(body["detail"].as_str().unwrap().contains("headers"));
        // After an answer to an earlier request in the same write.
        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        let refusal = with_json_refusal(
            format!("{ok}HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let refusal = String::from_utf8(refusal).unwrap();
        assert!(refusal.starts_with(ok), "{refusal}");
        assert!(
            refusal.contains("\r\n\r\n{\"error\":\"bad_request\""),
            "{refusal}"
        );
        // Answers with a body, delayq's own 400 included, stay as they are.
        check(ok, None);
        check(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
            None,
        );
        check("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n", None);
        check("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n", None);
    }
}

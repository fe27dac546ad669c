//! The single pushes' load generator: keep-alive HTTP/1.1 connections, each a task
//! of its own that takes the next message's number and posts it, one request at a
//! time, over hyper's own client connection (no pool, no request builder, a body
//! formatted straight into bytes), all on one thread's event loop. The bench's
//! client shares the machine's cores with delayq and Redis, so what it costs is
//! taken from what it measures: a general client (a connection pool, a JSON value
//! built and serialized a request) took about 30 µs of CPU a push, about as much as
//! delayq's own HTTP work; these connections on the bench's runtime 14–16 µs, on one
//! thread of their own 12–13 (the rows report it as the bench's CPU).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// What the pushes got back.
pub struct Pushed {
    /// Answered 201 Created.
    pub accepted: u64,
    /// Answered otherwise, or not at all.
    pub refused: u64,
    /// Each request's time from sent to answered, µs.
    pub latency: Histogram<u64>,
}

impl Pushed {
    fn none() -> anyhow::Result<Pushed> {
        Ok(Pushed {
            accepted: 0,
            refused: 0,
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        })
    }
}

/// Posts `n` bodies (`body(i)` for i in 0..n) to `path` at `addr`, `connections`
/// at a time, from a thread of its own: one event loop drives every connection, as
/// a load generator's thread does, so that no request wakes another thread.
pub async fn push_all(
    addr: SocketAddr,
    path: &str,
    n: u64,
    connections: usize,
    body: impl Fn(u64) -> String + Send + Sync + 'static,
) -> anyhow::Result<Pushed> {
    let path = path.to_owned();
    let (done, pushed) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("bench-pushers".into())
        .spawn(move || {
            let pushed = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|runtime| {
                    runtime.block_on(push_on_this_thread(addr, &path, n, connections, body))
                });
            let _ = done.send(pushed);
        })?;
    pushed.await.context("the pushers' thread")?
}

/// [`push_all`]'s connections, on the current thread's runtime.
async fn push_on_this_thread(
    addr: SocketAddr,
    path: &str,
    n: u64,
    connections: usize,
    body: impl Fn(u64) -> String + Send + Sync + 'static,
) -> anyhow::Result<Pushed> {
    // What every request shares, made once: its target and its Host header.
    let uri: Uri = path.parse()?;
    let host = HeaderValue::from_str(&addr.to_string())?;
    let next = Arc::new(AtomicU64::new(0));
    let body = Arc::new(body);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (next, body, uri, host) = (next.clone(), body.clone(), uri.clone(), host.clone());
        tasks.spawn(async move {
            let mut pushed = Pushed::none()?;
            let mut sender = connect(addr).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(pushed);
                }
                let request = Request::post(uri.clone())
                    .header(header::HOST, host.clone())
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(body(i))))?;
                let sent = Instant::now();
                let answered = async {
                    let response = sender.send_request(request).await?;
                    let status = response.status().as_u16();
                    // The answer read whole, so that the connection takes the next.
                    response.into_body().collect().await?;
                    Ok::<_, hyper::Error>(status)
                }
                .await;
                pushed.latency.record(sent.elapsed().as_micros() as u64)?;
                match answered {
                    Ok(201) => pushed.accepted += 1,
                    Ok(_) => pushed.refused += 1,
                    Err(_) => {
                        // The connection is gone: the push counts as refused, the
                        // rest go over a new one.
                        pushed.refused += 1;
                        sender = connect(addr).await?;
                    }
                }
            }
        });
    }
    let mut all = Pushed::none()?;
    while let Some(done) = tasks.join_next().await {
        let pushed = done.context("a pushing task")??;
        all.accepted += pushed.accepted;
        all.refused += pushed.refused;
        all.latency.add(&pushed.latency)?;
    }
    Ok(all)
}

/// A keep-alive connection to `addr`, its I/O driven by a task of its own.
async fn connect(addr: SocketAddr) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect to {addr}"))?;
    tcp.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

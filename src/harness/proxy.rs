//! A TCP proxy that can cut a process off from a server the way a network
//! partition does: while cut, nothing moves in either direction and no connection
//! is closed, so neither side learns of it except by waiting. New connections are
//! accepted and held the same way. The server may be named after the proxy
//! listens (connections wait for it), so a process can be configured with the
//! proxy's address before the server it leads to has started.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub addr: SocketAddr,
    cut: watch::Sender<bool>,
    upstream: Arc<watch::Sender<Option<SocketAddr>>>,
    stop: CancellationToken,
}

impl Proxy {
    /// Listens on a free loopback port; relays every connection to the server
    /// named by [`Proxy::lead_to`].
    pub async fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (cut, open) = watch::channel(false);
        let upstream = Arc::new(watch::channel(None).0);
        let server = upstream.clone();
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = token.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((client, _)) = accepted else { continue };
                let open = open.clone();
                let token = token.clone();
                let mut named = server.subscribe();
                tokio::spawn(async move {
                    let Ok(upstream) = named.wait_for(Option::is_some).await.map(|a| a.unwrap())
                    else {
                        return;
                    };
                    if wait_open(open.clone(), &token).await {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::select! {
                        _ = token.cancelled() => {}
                        _ = relay(cr, sw, open.clone(), &token) => {}
                        _ = relay(sr, cw, open, &token) => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            cut,
            upstream,
            stop,
        }
    }

    /// Names the Redis server to relay to, by its URL (`redis://host:port`).
    pub fn lead_to(&self, redis_url: &str) {
        let hostport = redis_url
            .trim_start_matches("redis://")
            .trim_end_matches('/');
        let addr: SocketAddr = hostport.parse().expect("a loopback host:port");
        self.upstream.send_replace(Some(addr));
    }

    /// Stops relaying (connections stay open, bytes wait).
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Relays again, bytes held back included.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }

    /// A Redis URL through this proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Waits while the proxy is cut; true when stopped meanwhile.
async fn wait_open(mut open: watch::Receiver<bool>, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        r = open.wait_for(|cut| !cut) => r.is_err(),
    }
}

/// Copies from `from` to `to` until either side closes; holds each chunk while cut.
async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    open: watch::Receiver<bool>,
    stop: &CancellationToken,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if wait_open(open.clone(), stop).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

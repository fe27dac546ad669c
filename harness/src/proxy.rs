//! A TCP proxy that can cut a process off from a server the way a network
//! partition does: while cut, nothing moves in either direction and no connection
//! is closed, so neither side learns of it except by waiting. New connections are
//! accepted and held the same way. The server may be named after the proxy
//! listens (connections wait for it), so a process can be configured with the
//! proxy's address before the server it leads to has started. It can also end
//! every connection whose server side is about to send given bytes, so that a
//! command takes effect on the server and its reply never arrives (what a reply
//! too large to read in time does).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub addr: SocketAddr,
    cut: watch::Sender<bool>,
    /// Bytes whose reply ends its connection (see [`Proxy::end_replies_with`]).
    poison: watch::Sender<Option<Arc<[u8]>>>,
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
        let (poison, poisoned) = watch::channel(None);
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
                let poisoned = poisoned.clone();
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
                        _ = relay(cr, sw, open.clone(), None, &token) => {}
                        _ = relay(sr, cw, open, Some(poisoned), &token) => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            cut,
            poison,
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

    /// From now on, ends every connection (both ways, at once) whose server is
    /// about to send `marker`, without relaying those bytes: the command took
    /// effect, and its client waits for a reply that never comes and sees its
    /// connection closed. A marker may span chunks.
    pub fn end_replies_with(&self, marker: &[u8]) {
        assert!(
            !marker.is_empty(),
            "an empty marker would end every connection"
        );
        self.poison.send_replace(Some(marker.into()));
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
/// Returns (ending the connection) before relaying a chunk where the marker in
/// `poisoned` appears, counting the end of the chunk before it.
async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    open: watch::Receiver<bool>,
    poisoned: Option<watch::Receiver<Option<Arc<[u8]>>>>,
    stop: &CancellationToken,
) {
    let mut buf = vec![0u8; 64 * 1024];
    // The last bytes relayed, as many as a marker has but one.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if wait_open(open.clone(), stop).await {
            return;
        }
        let marker = poisoned.as_ref().and_then(|p| p.borrow().clone());
        if let Some(marker) = marker {
            tail.extend_from_slice(&buf[..n]);
            if tail.windows(marker.len()).any(|w| w == &marker[..]) {
                return;
            }
            let keep = tail.len().min(marker.len() - 1);
            tail.drain(..tail.len() - keep);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client through `proxy` to a server that sends `chunks`, the next one
    /// each time the client has read the one before in full (so that each comes
    /// to the proxy apart); returns what the client read before its connection
    /// ended.
    async fn received(proxy: &Proxy, chunks: &'static [&'static [u8]]) -> Vec<u8> {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        proxy.lead_to(&format!("redis://{}", server.local_addr().unwrap()));
        tokio::spawn(async move {
            let (mut conn, _) = server.accept().await.unwrap();
            let mut asked = [0u8; 1];
            for chunk in chunks {
                if conn.read_exact(&mut asked).await.is_err()
                    || conn.write_all(chunk).await.is_err()
                {
                    return;
                }
            }
        });
        let mut client = TcpStream::connect(proxy.addr).await.unwrap();
        let mut got = Vec::new();
        for chunk in chunks {
            let mut read = vec![0u8; chunk.len()];
            let next = async {
                client.write_all(b"?").await?;
                client.read_exact(&mut read).await
            };
            let answered = tokio::time::timeout(std::time::Duration::from_secs(10), next)
                .await
                .expect("a chunk or the end of the connection");
            if answered.is_err() {
                break;
            }
            got.extend_from_slice(&read);
        }
        got
    }

    #[tokio::test]
    async fn a_reply_with_the_marker_ends_the_connection_unrelayed() {
        let proxy = Proxy::start().await;
        proxy.end_replies_with(b"POISON");
        // In one chunk, and split across two.
        let got = received(&proxy, &[b"fine ", b"a POISON b", b"never"]).await;
        assert_eq!(got, b"fine ");
        let got = received(&proxy, &[b"fine ", b"xPOI", b"SONx", b"never"]).await;
        assert_eq!(got, b"fine xPOI");
    }
}

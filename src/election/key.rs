//! The leader key (`KeyWatch`), checked and watched while this node leads: any
//! sign that it is gone or no longer this term's ends the term.

use super::*;

pub(super) enum KeyCheck {
    Present,
    Gone,
}

/// Watches this node's leader key, so that its deletion (by an operator, or by
/// etcd when the lease expired) ends the term.
pub(super) struct KeyWatch {
    pub(super) client: Client,
    pub(super) key: Vec<u8>,
    /// The key's create revision: a key recreated under the same name is not ours.
    pub(super) revision: i64,
    pub(super) limit: Duration,
    pub(super) stream: Option<WatchStream>,
    pub(super) retry: Backoff,
    pub(super) retry_at: Option<Instant>,
}

impl KeyWatch {
    pub(super) fn new(client: Client, key: Vec<u8>, revision: i64, limit: Duration) -> KeyWatch {
        KeyWatch {
            client,
            key,
            revision,
            limit,
            stream: None,
            retry: Backoff::new(Duration::from_millis(50), Duration::from_secs(2)),
            retry_at: None,
        }
    }

    /// Right after the campaign: reads the key and, at the same time, watches it
    /// from just after its creation, so that a takeover waits one round trip to
    /// etcd, not two. Any deletion since the key was created reaches the watch.
    pub(super) async fn open_won(&mut self) -> anyhow::Result<KeyCheck> {
        let (read, stream) = tokio::join!(self.get(), self.watch_from(self.revision + 1));
        if !self.is_ours(&read?) {
            return Ok(KeyCheck::Gone);
        }
        self.stream = Some(stream?);
        Ok(KeyCheck::Present)
    }

    /// Reads the key and, if it is still ours, watches it from just after that
    /// read (a watch opened again may start past the revisions etcd compacted).
    pub(super) async fn open(&mut self) -> anyhow::Result<KeyCheck> {
        let read = self.get().await?;
        if !self.is_ours(&read) {
            return Ok(KeyCheck::Gone);
        }
        let from = read.header().map_or(0, |h| h.revision()) + 1;
        self.stream = Some(self.watch_from(from).await?);
        Ok(KeyCheck::Present)
    }

    /// The key as etcd holds it now.
    async fn get(&self) -> anyhow::Result<etcd_client::GetResponse> {
        call(self.limit, || {
            let mut c = self.client.clone();
            let key = self.key.clone();
            async move { c.get(key, None).await }
        })
        .await
    }

    /// Whether the key read exists and is still this term's.
    fn is_ours(&self, read: &etcd_client::GetResponse) -> bool {
        read.kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == self.revision)
    }

    /// A watch on the key from revision `from` on.
    async fn watch_from(&self, from: i64) -> anyhow::Result<WatchStream> {
        call(self.limit, || {
            let mut c = self.client.clone();
            let key = self.key.clone();
            async move {
                c.watch(key, Some(WatchOptions::new().with_start_revision(from)))
                    .await
            }
        })
        .await
    }

    /// Completes when etcd says the key is gone. A broken watch is opened again
    /// (after reading the key), for as long as it takes. Cancel-safe.
    pub(super) async fn deleted(&mut self) {
        loop {
            match &mut self.stream {
                Some(stream) => match stream.message().await {
                    Ok(Some(resp)) => {
                        if resp
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                        {
                            return;
                        }
                        if resp.canceled() {
                            tracing::debug!(
                                reason = resp.cancel_reason(),
                                "watch on the leader key cancelled; watching again"
                            );
                            self.stream = None;
                        }
                    }
                    Ok(None) => self.stream = None,
                    Err(e) => {
                        tracing::debug!(
                            error = %readable(&e),
                            "watch on the leader key broke; watching again"
                        );
                        self.stream = None;
                    }
                },
                None => {
                    if let Some(at) = self.retry_at {
                        tokio::time::sleep_until(at).await;
                    }
                    match self.open().await {
                        Ok(KeyCheck::Gone) => return,
                        Ok(KeyCheck::Present) => {
                            self.retry.reset();
                            self.retry_at = None;
                        }
                        Err(e) => {
                            tracing::debug!(
                                error = %readable(e.as_ref()),
                                "cannot watch the leader key yet"
                            );
                            self.retry_at = Some(Instant::now() + self.retry.next_delay());
                        }
                    }
                }
            }
        }
    }
}

//! A business key's messages in one stream, listed or cancelled together: in each
//! shard that may hold them (every shard, or on Redis Cluster the stream's own
//! slot), one atomic call per shard.

use super::*;

/// Where one message of a key is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyedState {
    /// Waiting for its due time.
    Scheduled,
    /// Due, held back by its stream's rate limit or pause.
    Held,
    /// Finished, while its record is kept.
    Done(RecordState),
}

impl KeyedState {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyedState::Scheduled => "scheduled",
            KeyedState::Held => "held",
            KeyedState::Done(state) => state.as_str(),
        }
    }

    pub fn is_pending(self) -> bool {
        matches!(self, KeyedState::Scheduled | KeyedState::Held)
    }
}

/// One message of a key, as its shard knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedMessage {
    pub id: String,
    pub state: KeyedState,
    /// Pending: its due time; finished: when it finished (epoch ms, Redis's clock).
    pub at_ms: u64,
    /// Pending: its priority.
    pub priority: Option<u8>,
    /// Finished: the stream entry written, if any.
    pub entry_id: Option<String>,
}

/// What cancelling a key did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyCancelled {
    /// The messages cancelled now, each with Redis's time of its cancellation.
    pub cancelled: Vec<(String, u64)>,
    /// The key's messages on record as delivered already.
    pub delivered: u64,
}

impl Store {
    /// The shards that may hold messages to `stream`.
    pub(super) async fn shards_of_stream(&self, stream: &str) -> Result<Vec<u16>> {
        if self.is_cluster() {
            Ok(vec![keys::slot_of(stream)])
        } else {
            self.shards_in_use().await
        }
    }

    /// The messages pushed to `stream` with `key` that are pending or still on
    /// record, in no particular order.
    pub async fn key_messages(&self, stream: &str, key: &MessageKey) -> Result<Vec<KeyedMessage>> {
        let mut found = Vec::new();
        // A read changes nothing: the shards are asked 64 at a time.
        for chunk in self.shards_of_stream(stream).await?.chunks(64) {
            let asked = chunk
                .iter()
                .map(|&shard| self.key_messages_in(shard, stream, key));
            for part in futures::future::try_join_all(asked).await? {
                found.extend(part);
            }
        }
        Ok(found)
    }

    async fn key_messages_in(
        &self,
        shard: u16,
        stream: &str,
        key: &MessageKey,
    ) -> Result<Vec<KeyedMessage>> {
        let k = self.keys.shard(shard);
        let reply: Value = self
            .scripts
            .key_messages
            .key(&k.due)
            .key(&k.bodies)
            .key(&k.records)
            .arg(stream)
            .arg(key.as_str())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        let items = array(reply)?;
        let bad = || StoreError::Reply(format!("key_messages said {} values", items.len()));
        if items.len() % 4 != 0 {
            return Err(bad());
        }
        let mut out = Vec::with_capacity(items.len() / 4);
        for i in (0..items.len()).step_by(4) {
            let said = string_at(&items, i + 1)?;
            let state = match said.as_str() {
                "scheduled" => KeyedState::Scheduled,
                "held" => KeyedState::Held,
                other => KeyedState::Done(
                    RecordState::parse(other)
                        .ok_or_else(|| StoreError::Reply(format!("key_messages said {other:?}")))?,
                ),
            };
            let detail = string_at(&items, i + 3)?;
            out.push(KeyedMessage {
                id: string_at(&items, i)?,
                state,
                at_ms: int_at(&items, i + 2)?,
                priority: if state.is_pending() {
                    detail.parse().ok()
                } else {
                    None
                },
                entry_id: (!state.is_pending() && !detail.is_empty()).then_some(detail),
            });
        }
        Ok(out)
    }

    /// Cancels every pending message pushed to `stream` with `key`, one atomic call
    /// per shard; the cancellations stay on record for `retention`. Calling again
    /// cancels nothing more. With `redis.min_replicas_acked`, a shard whose call
    /// the replicas did not confirm fails the whole answer (what it cancelled
    /// stays cancelled: repeat the call).
    pub async fn cancel_key(
        &self,
        stream: &str,
        key: &MessageKey,
        retention: Duration,
    ) -> Result<KeyCancelled> {
        let mut done = KeyCancelled::default();
        for shard in self.shards_of_stream(stream).await? {
            let k = self.keys.shard(shard);
            let mut call = shard_invocation(&self.scripts.cancel_key, &k);
            call.arg(0)
                .arg(stream)
                .arg(key.as_str())
                .arg(self.records_arg(retention));
            let (reply, acked) = self.invoke_acked(&call).await?;
            let items = array(reply)?;
            let cancelled = int_at(&items, 0)? as usize;
            if cancelled > 0 {
                acked::confirmed(acked)?;
            }
            done.delivered += int_at(&items, 1)?;
            let at = int_at(&items, 2)?;
            for i in 0..cancelled {
                done.cancelled.push((string_at(&items, 3 + i)?, at));
            }
        }
        Ok(done)
    }
}

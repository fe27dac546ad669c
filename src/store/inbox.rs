//! The inbox's Redis side: the stream producers XADD delayed sends into, read by
//! every instance through one consumer group. Scheduling what is read goes through
//! [`Store::schedule_many`] (which acknowledges in the same script); what cannot be
//! scheduled goes through [`Store::reject_inbox_entries`]. The loop deciding which is
//! `crate::inbox`.

use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;

use super::streams::{RawEntry, ensure_group, entry_list, read_reply, within, xreadgroup};
use super::{Result, Store, StoreError, array, text};

/// Names of the inbox stream, its group and its rejected stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxQueue {
    pub stream: String,
    pub group: String,
    pub rejected_stream: String,
}

/// An inbox entry as XADDed by a producer: raw bytes, field order kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxEntry {
    pub id: String,
    /// None when the entry was deleted from the stream after it was read.
    pub fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

impl From<RawEntry> for InboxEntry {
    fn from((id, fields): RawEntry) -> Self {
        InboxEntry { id, fields }
    }
}

/// How much the inbox holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InboxStats {
    /// Entries in the stream: not yet read, or read and not yet scheduled.
    pub length: u64,
    /// Entries read by some instance and not yet scheduled or rejected.
    pub pending: u64,
}

/// One consumer's reads of the inbox, on a connection of its own: `next` blocks,
/// which must never happen on the shared connection.
pub struct InboxReader {
    conn: MultiplexedConnection,
    queue: InboxQueue,
    consumer: String,
    timeout: Duration,
}

impl Store {
    /// Opens a connection for `consumer` and creates the inbox group if missing
    /// (reading from the stream's start, so entries XADDed before any instance
    /// started are scheduled too).
    pub async fn inbox_reader(&self, queue: &InboxQueue, consumer: &str) -> Result<InboxReader> {
        let mut conn = self.separate_connection().await?;
        within(
            self.response_timeout,
            ensure_group(&mut conn, &queue.stream, &queue.group),
        )
        .await?;
        Ok(InboxReader {
            conn,
            queue: queue.clone(),
            consumer: consumer.to_owned(),
            timeout: self.response_timeout,
        })
    }

    /// Writes each entry, with its reason and original fields, to the rejected
    /// stream, and acknowledges and deletes it from the inbox, atomically.
    pub async fn reject_inbox_entries(
        &self,
        queue: &InboxQueue,
        rejects: &[(&InboxEntry, String)],
    ) -> Result<u64> {
        if rejects.is_empty() {
            return Ok(0);
        }
        let mut inv = self.scripts.reject_inbox.prepare_invoke();
        inv.key(&queue.rejected_stream)
            .key(&queue.stream)
            .arg(&queue.group);
        for (entry, reason) in rejects {
            let fields = entry.fields.as_deref().unwrap_or_default();
            inv.arg(&entry.id).arg(reason).arg(fields.len());
            for (k, v) in fields {
                inv.arg(k.as_slice()).arg(v.as_slice());
            }
        }
        let n: u64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        Ok(n)
    }

    /// Length of the inbox and entries pending in its group (0 before the group exists).
    pub async fn inbox_stats(&self, queue: &InboxQueue) -> Result<InboxStats> {
        let mut conn = self.conn.clone();
        let length: u64 = redis::cmd("XLEN")
            .arg(&queue.stream)
            .query_async(&mut conn)
            .await?;
        let pending: redis::RedisResult<Value> = redis::cmd("XPENDING")
            .arg(&queue.stream)
            .arg(&queue.group)
            .query_async(&mut conn)
            .await;
        let pending = match pending {
            Ok(reply) => array(reply)?
                .first()
                .map(super::int)
                .transpose()?
                .unwrap_or(0)
                .max(0) as u64,
            Err(e) if e.code() == Some("NOGROUP") => 0,
            Err(e) => return Err(e.into()),
        };
        Ok(InboxStats { length, pending })
    }
}

impl InboxReader {
    /// Entries this consumer read earlier and still holds: after a restart under the
    /// same name, or a batch that failed half-way.
    pub async fn own_pending(&mut self, count: usize) -> Result<Vec<InboxEntry>> {
        self.read("0", count, None).await
    }

    /// New entries, waiting up to `block` for the first.
    pub async fn next(&mut self, count: usize, block: Duration) -> Result<Vec<InboxEntry>> {
        self.read(">", count, Some(block)).await
    }

    async fn read(
        &mut self,
        from: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<InboxEntry>> {
        let cmd = xreadgroup(
            &self.queue.group,
            &self.consumer,
            count,
            block,
            &self.queue.stream,
            from,
        );
        let conn = &mut self.conn;
        let limit = block.unwrap_or_default() + self.timeout;
        let reply: Value = within(limit, async { Ok(cmd.query_async(conn).await?) }).await?;
        Ok(read_reply(reply)?
            .into_iter()
            .map(InboxEntry::from)
            .collect())
    }

    /// Takes over up to `count` entries that other consumers (instances that died)
    /// left unacknowledged for at least `min_idle`, scanning the pending list from
    /// `cursor` ("0-0" to start). Returns the next cursor ("0-0" when the scan is
    /// done) and the entries taken.
    pub async fn reclaim(
        &mut self,
        min_idle: Duration,
        count: usize,
        cursor: &str,
    ) -> Result<(String, Vec<InboxEntry>)> {
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.queue.stream)
            .arg(&self.queue.group)
            .arg(&self.consumer)
            .arg(min_idle.as_millis() as u64)
            .arg(cursor)
            .arg("COUNT")
            .arg(count);
        let conn = &mut self.conn;
        let reply: Value = within(self.timeout, async { Ok(cmd.query_async(conn).await?) }).await?;
        let mut parts = array(reply)?.into_iter();
        let next = text(&parts.next().unwrap_or(Value::Nil))?;
        let entries = entry_list(parts.next().unwrap_or(Value::Nil))?;
        Ok((next, entries.into_iter().map(InboxEntry::from).collect()))
    }
}

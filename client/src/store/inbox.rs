//! The inbox's Redis side: the stream producers XADD delayed sends into, read by
//! every instance through one consumer group. Scheduling what is read goes through
//! [`Store::schedule_many`] (which acknowledges in the same script); what cannot be
//! scheduled goes through [`Store::reject_inbox_entries`]. The loop deciding which is
//! `crate::inbox`.

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;

use super::conn::Separate;
use super::streams::{RawEntry, ensure_group, entry_list, read_reply, within, xreadgroup};
use super::{Result, Store, StoreError, array, text};

/// Names of the inbox stream, its group and its rejected stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxQueue {
    pub stream: String,
    pub group: String,
    pub rejected_stream: String,
}

impl InboxQueue {
    /// The group in which entries rejected unread stay pending, so that no trim of
    /// the inbox takes them (`inbox_entries.KEPT` in `lua/prelude/15-inbox.lua`).
    pub fn kept_group(&self) -> String {
        format!("{}:kept", self.group)
    }
}

/// An inbox entry as XADDed by a producer: raw bytes, field order kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxEntry {
    pub id: String,
    pub fields: EntryFields,
}

/// What reading an inbox entry found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryFields {
    /// Its field/value pairs, in order.
    Read(Vec<(Vec<u8>, Vec<u8>)>),
    /// The entry was deleted from the stream after it was handed out.
    Deleted,
    /// Not read: handed out too often, the last times failing to be read. Its
    /// rejection leaves it in the inbox, acknowledged (see [`Rejection::new`]).
    Unread,
}

impl From<Option<Vec<(Vec<u8>, Vec<u8>)>>> for EntryFields {
    fn from(fields: Option<Vec<(Vec<u8>, Vec<u8>)>>) -> Self {
        fields.map_or(EntryFields::Deleted, EntryFields::Read)
    }
}

impl From<RawEntry> for InboxEntry {
    fn from((id, fields): RawEntry) -> Self {
        InboxEntry {
            id,
            fields: fields.into(),
        }
    }
}

/// Most field/value pairs copied into one rejection, whatever the limits given to
/// [`Rejection::new`]: the rejection script writes an entry's fields with one XADD of
/// 7 + 2 × pairs arguments, which must stay well below the ~8000 values Lua in Redis
/// can unpack at once.
pub const MAX_COPIED_PAIRS: usize = 3000;

/// How large an entry's fields may be to be copied into its rejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyLimit {
    /// Field/value pairs (capped at [`MAX_COPIED_PAIRS`]).
    pub pairs: usize,
    /// Bytes of field names and values together.
    pub bytes: usize,
}

impl CopyLimit {
    /// Why `fields` are not copied under this limit, or None when they are.
    pub fn refusal(self, fields: &[(Vec<u8>, Vec<u8>)]) -> Option<String> {
        let pairs = self.pairs.min(MAX_COPIED_PAIRS);
        let bytes: usize = fields.iter().map(|(k, v)| k.len() + v.len()).sum();
        (fields.len() > pairs || bytes > self.bytes).then(|| {
            format!(
                "too large to copy to the rejected stream ({} field/value pairs, {bytes} bytes; at most {pairs} pairs and {} bytes are copied): its fields are not kept",
                fields.len(),
                self.bytes
            )
        })
    }
}

/// An inbox entry on its way to the rejected stream: its id, the reason, and its
/// fields byte for byte when they are within a [`CopyLimit`] (none otherwise, the
/// reason then says so). Built only by [`Rejection::new`] and
/// [`Rejection::without_fields`], so no rejection carries more than the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection<'a> {
    entry_id: &'a str,
    reason: String,
    fields: &'a [(Vec<u8>, Vec<u8>)],
    /// The entry was never read: it is acknowledged but left in the inbox, pending
    /// in the kept group ([`InboxQueue::kept_group`]).
    unread: bool,
}

impl<'a> Rejection<'a> {
    /// An entry that was never read ([`EntryFields::Unread`]) goes with its id and
    /// the reason only, and stays in the inbox, acknowledged, where its fields can
    /// still be read.
    pub fn new(entry: &'a InboxEntry, reason: String, limit: CopyLimit) -> Self {
        let fields = match &entry.fields {
            EntryFields::Read(fields) => fields.as_slice(),
            EntryFields::Deleted => &[],
            EntryFields::Unread => {
                return Rejection {
                    entry_id: &entry.id,
                    reason,
                    fields: &[],
                    unread: true,
                };
            }
        };
        match limit.refusal(fields) {
            None => Rejection {
                entry_id: &entry.id,
                reason,
                fields,
                unread: false,
            },
            Some(refusal) => Rejection::without_fields(entry, format!("{reason}; {refusal}")),
        }
    }

    /// The entry's id and the reason only.
    pub fn without_fields(entry: &'a InboxEntry, reason: String) -> Self {
        Rejection {
            entry_id: &entry.id,
            reason,
            fields: &[],
            unread: false,
        }
    }

    pub fn entry_id(&self) -> &'a str {
        self.entry_id
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether the entry's fields go with it.
    pub fn has_fields(&self) -> bool {
        !self.fields.is_empty()
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
    pub(super) conn: Separate,
    pub(super) queue: InboxQueue,
    pub(super) consumer: String,
    pub(super) timeout: Duration,
    /// For the scripts of the takeover and of marked reads.
    pub(super) store: Store,
    /// Where its next marked read starts (see `inbox_read`): the group's last
    /// delivered id as this reader last saw it, and the entries after it read
    /// already, when they were (with the last read's hand-out).
    pub(super) ahead: Option<(String, Option<Vec<InboxEntry>>)>,
}

impl Store {
    /// Opens a connection for `consumer` and creates the inbox group if missing
    /// (reading from the stream's start, so entries XADDed before any instance
    /// started are scheduled too).
    pub async fn inbox_reader(&self, queue: &InboxQueue, consumer: &str) -> Result<InboxReader> {
        let mut conn = self.blocking_connection().await?;
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
            store: self.clone(),
            ahead: None,
        })
    }

    /// Writes each rejection, with its reason and the fields it carries, to the
    /// rejected stream, and acknowledges and deletes its entry from the inbox (an
    /// unread one is acknowledged and kept, pending in the kept group), atomically.
    pub async fn reject_inbox_entries(
        &self,
        queue: &InboxQueue,
        rejects: &[Rejection<'_>],
    ) -> Result<u64> {
        if rejects.is_empty() {
            return Ok(0);
        }
        let mut inv = self.scripts.reject_inbox.prepare_invoke();
        inv.key(&queue.rejected_stream)
            .key(&queue.stream)
            .arg(&queue.group);
        for r in rejects {
            let pairs = if r.unread { -1 } else { r.fields.len() as i64 };
            inv.arg(r.entry_id).arg(&r.reason).arg(pairs);
            for (k, v) in r.fields {
                inv.arg(k.as_slice()).arg(v.as_slice());
            }
        }
        let n: u64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        Ok(n)
    }

    /// Keeps inbox entries claimed by `consumer`, resetting their idle time without
    /// counting a delivery (XCLAIM JUSTID): for entries it still works on, so that
    /// no instance takes them over meanwhile.
    pub async fn hold_inbox_entries(
        &self,
        queue: &InboxQueue,
        consumer: &str,
        ids: &[&str],
    ) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let _: Value = redis::cmd("XCLAIM")
            .arg(&queue.stream)
            .arg(&queue.group)
            .arg(consumer)
            .arg(0)
            .arg(ids)
            .arg("JUSTID")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}

impl InboxReader {
    /// Entries this consumer read earlier and still holds (after a restart under the
    /// same name), oldest first, after entry `after` ("0" from the start).
    pub async fn own_pending(&mut self, after: &str, count: usize) -> Result<Vec<InboxEntry>> {
        self.read(after, count, None).await
    }

    /// Entries this consumer holds after entry `after` ("0" from the start), oldest
    /// first, with how often each was handed out (`XPENDING` of this consumer), up to
    /// `count`: listed without being handed out again, which a consumer's
    /// `XREADGROUP` of its own pending entries would count. Their fields come with
    /// [`InboxReader::entries`].
    pub async fn own_pending_listed(
        &mut self,
        after: &str,
        count: usize,
    ) -> Result<Vec<(String, u64)>> {
        let start = if after == "0" {
            "-".to_owned()
        } else {
            format!("({after}")
        };
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(&self.queue.stream)
            .arg(&self.queue.group)
            .arg(&start)
            .arg("+")
            .arg(count)
            .arg(&self.consumer);
        let conn = &mut self.conn;
        let reply: Value = within(self.timeout, async { Ok(cmd.query_async(conn).await?) }).await?;
        array(reply)?.into_iter().map(pending_item).collect()
    }

    /// The entries with these ids, in that order (`XRANGE` of each, which hands
    /// nothing out); an entry deleted from the stream comes without fields.
    pub async fn entries(&mut self, ids: &[&str]) -> Result<Vec<InboxEntry>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("XRANGE").arg(&self.queue.stream).arg(id).arg(id);
        }
        let conn = &mut self.conn;
        let replies: Vec<Value> =
            within(self.timeout, async { Ok(pipe.query_async(conn).await?) }).await?;
        let mut entries = Vec::with_capacity(ids.len());
        for (id, reply) in ids.iter().zip(replies) {
            let fields = entry_list(reply)?.into_iter().next().and_then(|(_, f)| f);
            entries.push(InboxEntry {
                id: (*id).to_owned(),
                fields: fields.into(),
            });
        }
        Ok(entries)
    }

    /// Sets how often entry `id`, held by this consumer, was handed out
    /// (`XCLAIM … RETRYCOUNT … JUSTID`, which reads nothing): an attempt counted
    /// without reading the entry.
    pub async fn set_handed_out(&mut self, id: &str, times: u64) -> Result<()> {
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(&self.queue.stream)
            .arg(&self.queue.group)
            .arg(&self.consumer)
            .arg(0)
            .arg(id)
            .arg("RETRYCOUNT")
            .arg(times)
            .arg("JUSTID");
        let conn = &mut self.conn;
        let _: Value = within(self.timeout, async { Ok(cmd.query_async(conn).await?) }).await?;
        Ok(())
    }

    /// How often the group handed out each of `entries` (XREADGROUP, XAUTOCLAIM),
    /// by entry id; an entry no longer pending is left out.
    pub async fn deliveries(&mut self, entries: &[InboxEntry]) -> Result<HashMap<String, u64>> {
        if entries.is_empty() {
            return Ok(HashMap::new());
        }
        let mut pipe = redis::pipe();
        for e in entries {
            pipe.cmd("XPENDING")
                .arg(&self.queue.stream)
                .arg(&self.queue.group)
                .arg(&e.id)
                .arg(&e.id)
                .arg(1);
        }
        let conn = &mut self.conn;
        let replies: Vec<Value> =
            within(self.timeout, async { Ok(pipe.query_async(conn).await?) }).await?;
        let mut out = HashMap::with_capacity(entries.len());
        for reply in replies {
            if let Some(item) = array(reply)?.into_iter().next() {
                let (id, handed_out) = pending_item(item)?;
                out.insert(id, handed_out);
            }
        }
        Ok(out)
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

    /// Takes over the entries that other consumers (instances that died) left
    /// pending for at least `min_idle`, looking at up to `count` pending entries from
    /// `cursor` ("-" to start): each handed out once more, a marked read's whole
    /// range with its ends (`lua/inbox_reclaim.lua`). Returns the next cursor (""
    /// when the scan is done) and the entries taken.
    pub async fn reclaim(
        &mut self,
        min_idle: Duration,
        count: usize,
        cursor: &str,
    ) -> Result<(String, Vec<InboxEntry>)> {
        let mut inv = self.store.scripts.inbox_reclaim.prepare_invoke();
        inv.key(&self.queue.stream)
            .arg(&self.queue.group)
            .arg(&self.consumer)
            .arg(min_idle.as_millis() as u64)
            .arg(cursor)
            .arg(count);
        let reply = script_call(&mut self.conn, self.timeout, &inv).await?;
        let mut parts = array(reply)?.into_iter();
        let next = text(&parts.next().unwrap_or(Value::Nil))?;
        let entries = entry_list(parts.next().unwrap_or(Value::Nil))?;
        let entries = entries.into_iter().map(InboxEntry::from).collect();
        Ok((next, entries))
    }
}

/// A script call on a reader's connection, answered within `timeout`.
pub(super) async fn script_call(
    conn: &mut Separate,
    timeout: Duration,
    inv: &super::Call<'_>,
) -> Result<Value> {
    within(timeout, async {
        inv.invoke_async(conn)
            .await
            .map_err(StoreError::from_script)
    })
    .await
}

/// One entry of an extended `XPENDING` reply (`[id, consumer, idle ms, deliveries]`):
/// its id and how often it was handed out.
fn pending_item(item: Value) -> Result<(String, u64)> {
    let parts = array(item)?;
    let id = text(parts.first().unwrap_or(&Value::Nil))?;
    let handed_out = super::int(parts.get(3).unwrap_or(&Value::Nil))?.max(0) as u64;
    Ok((id, handed_out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` fields of `size` bytes each (name and value together).
    fn fields(n: usize, size: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..n)
            .map(|_| (vec![b'k'; size / 2], vec![b'v'; size - size / 2]))
            .collect()
    }

    #[track_caller]
    fn check(limit: (usize, usize), entry: (usize, usize), copied: bool) {
        let limit = CopyLimit {
            pairs: limit.0,
            bytes: limit.1,
        };
        let refusal = limit.refusal(&fields(entry.0, entry.1));
        assert_eq!(
            refusal.is_none(),
            copied,
            "{entry:?} under {limit:?}: {refusal:?}"
        );
        if let Some(refusal) = refusal {
            assert!(refusal.contains("too large to copy"), "{refusal}");
        }
    }

    #[test]
    #[rustfmt::skip]
    fn fields_are_copied_only_within_the_limit() {
        check((10, 100), (0, 0), true);
        check((10, 100), (10, 10), true);
        check((10, 100), (11, 2), false);
        check((10, 100), (5, 21), false);
        check((10, 100), (1, 100), true);
        check((10, 100), (1, 101), false);
        check((1006, 1 << 20), (5000, 10), false);
        check((usize::MAX, usize::MAX), (MAX_COPIED_PAIRS, 2), true);
        check((usize::MAX, usize::MAX), (MAX_COPIED_PAIRS + 1, 2), false);
    }

    #[test]
    fn a_rejection_too_large_to_copy_keeps_its_id_and_reason_only() {
        let limit = CopyLimit {
            pairs: 2,
            bytes: 100,
        };
        let small = InboxEntry {
            id: "1-0".into(),
            fields: EntryFields::Read(fields(2, 4)),
        };
        let large = InboxEntry {
            id: "2-0".into(),
            fields: EntryFields::Read(fields(3, 4)),
        };
        let deleted = InboxEntry {
            id: "3-0".into(),
            fields: EntryFields::Deleted,
        };
        let kept = Rejection::new(&small, "bad".into(), limit);
        assert_eq!(
            (kept.entry_id(), kept.reason(), kept.fields),
            ("1-0", "bad", &fields(2, 4)[..])
        );
        let dropped = Rejection::new(&large, "bad".into(), limit);
        assert_eq!((dropped.entry_id(), dropped.has_fields()), ("2-0", false));
        assert!(
            dropped.reason().starts_with("bad; too large to copy"),
            "{}",
            dropped.reason()
        );
        assert!(
            dropped.reason().contains("(3 field/value pairs, 12 bytes;"),
            "{}",
            dropped.reason()
        );
        let none = Rejection::new(&deleted, "gone".into(), limit);
        assert_eq!((none.reason(), none.has_fields()), ("gone", false));
    }
}

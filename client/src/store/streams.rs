//! Target streams on behalf of clients without a Redis connection of their own: a
//! consumer group read with a wait (HTTP long polls), acknowledgements, and plain
//! appends for the client library's zero-delay sends.
//!
//! A blocking read never runs on the shared multiplexed connection (it would stall
//! every command queued behind it): each takes a connection of its own from a small
//! pool, and at most `max_blocking_reads` wait at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{ErrorKind, RedisError, Value};
use tokio::sync::Semaphore;

use super::conn::{Separate, master_moved};
use super::{Result, Store, StoreError, array, text};
use crate::message::Fields;

/// Idle connections kept for the next long poll; more are opened when busier.
const MAX_IDLE: usize = 8;

/// A stream entry, field order kept. Values that are not UTF-8 are shown lossily.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamEntry {
    pub id: String,
    pub fields: Vec<(String, String)>,
}

pub(super) struct PollPool {
    idle: Mutex<Vec<Separate>>,
    permits: Arc<Semaphore>,
    max: usize,
}

impl PollPool {
    pub(super) fn new(max: usize) -> Self {
        PollPool {
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max.max(1))),
            max: max.max(1),
        }
    }

    fn take(&self) -> Option<Separate> {
        self.idle.lock().expect("pool lock").pop()
    }

    fn put(&self, conn: Separate) {
        let mut idle = self.idle.lock().expect("pool lock");
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }
}

impl Store {
    /// A connection for long polls: through Sentinel, a read under way when the
    /// master moves ends there, and `read_group` makes it again on the new master
    /// for what is left of its wait (sent again whole, it could outlast the wait).
    async fn poll_connection(&self) -> Result<Separate> {
        Ok(self.blocking_connection().await?.interrupted_by_moves())
    }

    /// Reads up to `count` entries of `stream` not yet delivered to `group`, for
    /// `consumer`, waiting up to `wait` for the first (zero: not at all). The group is
    /// created if missing, reading from the stream's start (so entries written before
    /// the first read are not skipped), and the stream with it. Entries read stay
    /// pending for the consumer until acknowledged ([`Store::ack`]).
    pub async fn read_group(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        count: usize,
        wait: Duration,
    ) -> Result<Vec<StreamEntry>> {
        // The read ends `wait` after it was asked for, however long the connection
        // and the group took to make: its answer is due then.
        let ends = (!wait.is_zero()).then(|| std::time::Instant::now() + wait);
        let _permit = self
            .polls
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                StoreError::Busy(format!(
                    "{} long polls are waiting already (api.max_polls); retry later",
                    self.polls.max
                ))
            })?;
        let (mut conn, pooled) = match self.polls.take() {
            Some(conn) => (conn, true),
            None => (self.poll_connection().await?, false),
        };
        let limit = wait + self.response_timeout;
        let mut result = within(
            limit,
            read_group(&mut conn, stream, group, consumer, count, ends),
        )
        .await;
        if pooled
            && matches!(&result, Err(StoreError::Redis(e)) if e.is_connection_dropped() || e.is_io_error())
        {
            // The idle connection went stale (Redis restarted, or a proxy cut it): once more on a fresh one.
            conn = self.poll_connection().await?;
            result = within(
                limit,
                read_group(&mut conn, stream, group, consumer, count, ends),
            )
            .await;
        }
        let entries = result?;
        self.polls.put(conn);
        Ok(entries
            .into_iter()
            .map(|(id, fields)| StreamEntry {
                id,
                fields: fields
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            String::from_utf8_lossy(&k).into_owned(),
                            String::from_utf8_lossy(&v).into_owned(),
                        )
                    })
                    .collect(),
            })
            .collect())
    }

    /// Acknowledges entries of `group`; returns how many were pending.
    pub async fn ack(&self, stream: &str, group: &str, ids: &[String]) -> Result<u64> {
        let mut cmd = redis::cmd("XACK");
        cmd.arg(stream).arg(group).arg(ids);
        cmd.query_async(&mut self.conn.clone())
            .await
            .map_err(|e| wrong_type(e, stream))
    }

    /// Deletes a stream (a tool's own, such as the drill's); whether it existed.
    pub async fn remove_stream(&self, stream: &str) -> Result<bool> {
        let removed: u64 = redis::cmd("DEL")
            .arg(stream)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(removed > 0)
    }

    /// Up to `count` entries of `stream` after the entry `after` (from the start
    /// without), in order: a tool reading a whole stream page by page.
    pub async fn stream_page(
        &self,
        stream: &str,
        after: Option<&str>,
        count: usize,
    ) -> Result<Vec<StreamEntry>> {
        if after
            .and_then(crate::message::EntryId::parse)
            .is_some_and(|a| a.is_last())
        {
            return Ok(Vec::new());
        }
        let start = after.map_or_else(|| "-".to_owned(), |a| format!("({a}"));
        let reply: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count.max(1))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| wrong_type(e, stream))?;
        Ok(stream_entries(reply)?
            .into_iter()
            .map(|(id, fields)| StreamEntry { id, fields })
            .collect())
    }

    /// Whether `stream` still holds the entry `entry` (not deleted, not trimmed).
    pub async fn holds_entry(&self, stream: &str, entry: &str) -> Result<bool> {
        Ok(self.entry(stream, entry).await?.is_some())
    }

    /// The fields of `stream`'s entry `entry`, while the stream holds it.
    pub async fn entry(&self, stream: &str, entry: &str) -> Result<Option<Fields>> {
        let reply: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(entry)
            .arg(entry)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| wrong_type(e, stream))?;
        Ok(stream_entries(reply)?
            .into_iter()
            .next()
            .map(|(_, fields)| fields))
    }

    /// The id of the last entry of `stream`; None while it has none.
    pub async fn last_entry_id(&self, stream: &str) -> Result<Option<String>> {
        let reply: Value = redis::cmd("XREVRANGE")
            .arg(stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| wrong_type(e, stream))?;
        Ok(stream_entries(reply)?.into_iter().next().map(|(id, _)| id))
    }

    /// Appends an entry to a stream now (XADD), bypassing scheduling; returns its id.
    pub async fn append(&self, stream: &str, fields: &[(String, String)]) -> Result<String> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream).arg("*");
        for (field, value) in fields {
            cmd.arg(field).arg(value);
        }
        cmd.query_async(&mut self.conn.clone())
            .await
            .map_err(|e| wrong_type(e, stream))
    }
}

/// A key of the wrong type is the caller's conflict with what Redis holds, not an outage.
pub(super) fn wrong_type(e: RedisError, stream: &str) -> StoreError {
    if e.code() == Some("WRONGTYPE") {
        StoreError::Corrupt(format!(
            "key {stream:?} holds something other than a stream"
        ))
    } else {
        StoreError::Redis(e)
    }
}

/// Runs a command on a connection without a response timeout, with one.
pub(super) async fn within<T>(limit: Duration, f: impl Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Redis(RedisError::from((
            ErrorKind::Io,
            "timed out",
            format!("no answer from Redis within {limit:?}"),
        )))),
    }
}

/// Creates a consumer group reading from the stream's start, and the stream if
/// missing; a group that exists already is left as it is.
pub(super) async fn ensure_group(conn: &mut Separate, stream: &str, group: &str) -> Result<()> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(wrong_type(e, stream)),
    }
}

/// An entry as read: id, and fields (None when the entry was deleted meanwhile).
pub(super) type RawEntry = (String, Option<Vec<(Vec<u8>, Vec<u8>)>>);

async fn read_group(
    conn: &mut Separate,
    stream: &str,
    group: &str,
    consumer: &str,
    count: usize,
    ends: Option<std::time::Instant>,
) -> Result<Vec<RawEntry>> {
    // Blocks for what is left of the wait (not at all once it is spent).
    let read = || {
        let left = ends.map(|ends| ends.saturating_duration_since(std::time::Instant::now()));
        xreadgroup(
            group,
            consumer,
            count,
            left.filter(|l| !l.is_zero()),
            stream,
            ">",
        )
    };
    // A read under way when the master moved is made again there, for what is
    // left of the wait (see `Store::poll_connection`).
    let first = loop {
        match read().query_async(conn).await {
            Err(e) if master_moved(&e) => continue,
            read => break read,
        }
    };
    let reply: Value = match first {
        Ok(reply) => reply,
        Err(e) if e.code() == Some("NOGROUP") => {
            ensure_group(conn, stream, group).await?;
            match read().query_async(conn).await {
                Ok(reply) => reply,
                Err(e) if gone_meanwhile(&e) => return Ok(Vec::new()),
                Err(e) => return Err(wrong_type(e, stream)),
            }
        }
        Err(e) if gone_meanwhile(&e) => return Ok(Vec::new()),
        Err(e) => return Err(wrong_type(e, stream)),
    };
    read_reply(reply)
}

/// A read that the stream or group vanishing under it ended: the stream deleted while
/// the read waited (UNBLOCKED), or the group destroyed between its making and the
/// read (NOGROUP). The poll ends with nothing; the next one makes them again.
fn gone_meanwhile(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("UNBLOCKED" | "NOGROUP"))
}

/// Entries of an XREADGROUP reply for one stream (Nil when the wait ran out).
/// `XREADGROUP GROUP group consumer COUNT count [BLOCK ms] STREAMS stream from`;
/// a block shorter than a millisecond still blocks (BLOCK 0 would wait forever).
pub(super) fn xreadgroup(
    group: &str,
    consumer: &str,
    count: usize,
    block: Option<Duration>,
    stream: &str,
    from: &str,
) -> redis::Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count);
    if let Some(block) = block {
        cmd.arg("BLOCK").arg(block.as_millis().max(1) as u64);
    }
    cmd.arg("STREAMS").arg(stream).arg(from);
    cmd
}

pub(super) fn read_reply(reply: Value) -> Result<Vec<RawEntry>> {
    let streams = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Map(pairs) => pairs.into_iter().map(|(_, entries)| entries).collect(),
        other => array(other)?
            .into_iter()
            .map(|s| {
                array(s).map(|mut parts| {
                    if parts.len() == 2 {
                        parts.remove(1)
                    } else {
                        Value::Nil
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    let mut out = Vec::new();
    for entries in streams {
        out.extend(entry_list(entries)?);
    }
    Ok(out)
}

/// `[[id, [field, value, ...] | nil], ...]`. Values are moved out, not copied: a
/// batch of inbox entries is thousands of them.
pub(super) fn entry_list(v: Value) -> Result<Vec<RawEntry>> {
    array(v)?
        .into_iter()
        .map(|entry| {
            let mut parts = array(entry)?.into_iter();
            let id = match parts.next() {
                Some(v) => String::from_utf8(owned_bytes(v)?)
                    .map_err(|_| StoreError::Reply("stream entry id is not UTF-8".into()))?,
                None => return Err(StoreError::Reply("stream entry without an id".into())),
            };
            let fields = match parts.next() {
                None | Some(Value::Nil) => None,
                Some(v) => {
                    let flat = array(v)?;
                    if flat.len() % 2 != 0 {
                        return Err(StoreError::Reply(
                            "stream entry with an odd number of field values".into(),
                        ));
                    }
                    let mut pairs = Vec::with_capacity(flat.len() / 2);
                    let mut values = flat.into_iter();
                    while let (Some(k), Some(v)) = (values.next(), values.next()) {
                        pairs.push((owned_bytes(k)?, owned_bytes(v)?));
                    }
                    Some(pairs)
                }
            };
            Ok((id, fields))
        })
        .collect()
}

fn owned_bytes(v: Value) -> Result<Vec<u8>> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        other => Err(StoreError::Reply(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

/// An XRANGE reply as (entry id, fields in order).
pub(super) fn stream_entries(reply: Value) -> Result<Vec<(String, Fields)>> {
    let mut out = Vec::new();
    for item in array(reply)? {
        let parts = array(item)?;
        let id = super::string_at(&parts, 0)?;
        let flat = array(parts.get(1).cloned().unwrap_or(Value::Nil))?;
        let mut fields = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            if let [name, value] = pair {
                fields.push((text(name)?, text(value)?));
            }
        }
        out.push((id, fields));
    }
    Ok(out)
}

//! Marked reads of the inbox: a read's entries handed out without being pending one
//! by one in the group, its first and last entry pending instead, under a consumer
//! named for the read (`<node>@<first>..<last>`). The reader reads entries with
//! `XRANGE` (which hands nothing out) and then hands them out with
//! `lua/inbox_take.lua`, which moves the group past them unless another reader moved
//! it first. A read stored whole by one schedule call is settled there (its consumer
//! deleted); any other read is released, its every entry made pending one by one,
//! from where each goes as an entry read on its own does (`inbox_entries` in
//! `lua/prelude/15-inbox.lua`). A pending entry costs Redis about a microsecond to
//! make and take away, most of what reading an entry costs.
//!
//! An older release takes over an idle pending entry on its own, and would take a
//! dead reader's two ends without the entries between: a reader reads marked only
//! while no such reader is about ([`InboxReader::older_readers`]).
//!
//! The inbox's stats count a read in flight by its entries, not by its two ends
//! ([`Store::inbox_stats`]).

use std::time::Duration;

use redis::Value;

use super::batch::MAX_PER_CALL;
use super::inbox::{InboxEntry, InboxQueue, InboxReader, InboxStats, script_call};
use super::scripts::Call;
use super::streams::{entry_list, within};
use super::{Result, Store, StoreError, array, text};

/// A plain consumer (an older release's reader) seen this recently reads the inbox
/// still: it calls `XREADGROUP` at least every half second while it runs.
const OLDER_READER_SEEN: Duration = Duration::from_secs(5);

/// What a read handed out.
#[derive(Debug, Default)]
pub struct Read {
    pub entries: Vec<InboxEntry>,
    /// The read's consumer, when it is marked and took entries: the schedule call
    /// that stores them all settles it ([`super::InboxAck::read`]); anything else
    /// must release it ([`Store::release_inbox_read`]).
    pub marked: Option<String>,
}

/// Whether `consumer` is a marked read's: `…@<ms>-<seq>..<ms>-<seq>`.
pub fn is_read_consumer(consumer: &str) -> bool {
    read_range(consumer).is_some()
}

/// The first and last entry of a marked read's consumer.
fn read_range(consumer: &str) -> Option<(&str, &str)> {
    let (_, range) = consumer.rsplit_once('@')?;
    let (first, last) = range.split_once("..")?;
    (entry_id(first).is_some() && entry_id(last).is_some()).then_some((first, last))
}

/// Of the group's `consumers` (name, entries pending), the marked reads': the
/// entries pending under them (their ends) and the entries of the inbox they
/// stand for (at most [`MAX_PER_CALL`] a read, as many as a read takes).
async fn marked_entries(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &str,
    consumers: &[(String, i64)],
) -> Result<(i64, u64)> {
    let mut ends = 0;
    let mut ranges = redis::pipe();
    for (name, pending) in consumers {
        if let Some((first, last)) = read_range(name) {
            ends += pending;
            ranges
                .cmd("XRANGE")
                .arg(stream)
                .arg(first)
                .arg(last)
                .arg("COUNT")
                .arg(MAX_PER_CALL);
        }
    }
    if ranges.is_empty() {
        return Ok((ends, 0));
    }
    let read: Vec<Value> = ranges.query_async(conn).await?;
    let entries = read
        .into_iter()
        .map(|r| array(r).map(|e| e.len() as u64))
        .sum::<Result<u64>>()?;
    Ok((ends, entries))
}

/// A stream entry id as its two numbers, which order ids as Redis does.
fn entry_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    let number = |p: &str| {
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    Some((number(ms)?, number(seq)?))
}

impl Store {
    /// Length of the inbox and entries pending in its group (0 before the group
    /// exists). A marked read in flight counts as its entries, not as the two ends
    /// the group holds of it.
    pub async fn inbox_stats(&self, queue: &InboxQueue) -> Result<InboxStats> {
        let mut conn = self.conn.clone();
        let length: u64 = redis::cmd("XLEN")
            .arg(&queue.stream)
            .query_async(&mut conn)
            .await?;
        let summary: redis::RedisResult<Value> = redis::cmd("XPENDING")
            .arg(&queue.stream)
            .arg(&queue.group)
            .query_async(&mut conn)
            .await;
        let summary = match summary {
            Ok(reply) => array(reply)?,
            Err(e) if e.code() == Some("NOGROUP") => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let pending = summary.first().map(super::int).transpose()?.unwrap_or(0);
        let mut consumers = Vec::new();
        if let Some(Value::Array(listed)) = summary.into_iter().nth(3) {
            for item in listed {
                if let [name, count] = &array(item)?[..] {
                    consumers.push((text(name)?, super::int(count)?));
                }
            }
        }
        let (ends, entries) = marked_entries(&mut conn, &queue.stream, &consumers).await?;
        Ok(InboxStats {
            length,
            pending: (pending - ends).max(0) as u64 + entries,
        })
    }

    /// Releases the marked read `read` once its ends have been idle `min_idle`: its
    /// every entry becomes pending for `to`, handed out `added` times more than its
    /// ends were. Returns their ids (none when it was settled or released already).
    pub async fn release_inbox_read(
        &self,
        queue: &InboxQueue,
        read: &str,
        to: &str,
        added: u64,
        min_idle: Duration,
    ) -> Result<Vec<String>> {
        let mut inv = self.scripts.inbox_release.prepare_invoke();
        inv.key(&queue.stream)
            .arg(&queue.group)
            .arg(read)
            .arg(to)
            .arg(added)
            .arg(min_idle.as_millis() as u64);
        inv.invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)
    }
}

impl InboxReader {
    /// New entries, read marked, waiting up to `block` for the first (`XREAD
    /// BLOCK`, which hands nothing out). A read that another reader's came before
    /// takes what that one left, or reads on from where it ended; none comes back
    /// only when no entry was left to hand out.
    ///
    /// A marked read that Redis refuses (a right the user lacks: `NOPERM`) hands
    /// nothing out: the entries are read unmarked then, as an older release reads.
    pub async fn next_marked(&mut self, count: usize, block: Duration) -> Result<Read> {
        match self.marked_read(count, block).await {
            Err(e) if e.refusal().is_some() && !e.is_transient() => {
                tracing::debug!(error = %e, "a marked read of the inbox was refused; reading it entry by entry");
                let entries = self.next(count, block).await?;
                Ok(Read {
                    entries,
                    marked: None,
                })
            }
            read => read,
        }
    }

    async fn marked_read(&mut self, count: usize, block: Duration) -> Result<Read> {
        let (mut after, fetched) = match self.ahead.take() {
            Some(ahead) => ahead,
            None => (self.delivered().await?, None),
        };
        let mut entries = match fetched {
            Some(entries) => entries,
            None => self.range_after(&after, count).await?,
        };
        if entries.is_empty() {
            // An entry already there answers at once.
            let mut wait = redis::cmd("XREAD");
            wait.arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(block.as_millis().max(1) as u64)
                .arg("STREAMS")
                .arg(&self.queue.stream)
                .arg(&after);
            let conn = &mut self.conn;
            let came: Value = within(block + self.timeout, async {
                Ok(wait.query_async(conn).await?)
            })
            .await?;
            if came != Value::Nil {
                entries = self.range_after(&after, count).await?;
            }
        }
        while let (Some(first), Some(last)) = (entries.first(), entries.last()) {
            let (first, last) = (first.id.clone(), last.id.clone());
            let read = (entries.len(), first.as_str(), last.as_str());
            let (took, now, next) = self.take(&after, read, count).await?;
            match took {
                Took::Read(read) => {
                    self.ahead = Some((now, Some(next)));
                    return Ok(Read {
                        entries,
                        marked: Some(read),
                    });
                }
                // Deleted from the inbox since they were read: on with what follows.
                Took::Deleted => (after, entries) = (now, next),
                // Another reader moved the group first: what it left of these, else
                // what came after.
                Took::Moved => {
                    let moved = entry_id(&now);
                    entries.retain(|e| entry_id(&e.id) > moved);
                    after = now;
                    if entries.is_empty() {
                        entries = self.range_after(&after, count).await?;
                    }
                }
            }
        }
        self.ahead = Some((after, Some(Vec::new())));
        Ok(Read::default())
    }

    /// Up to `count` entries after `after`, handing nothing out.
    async fn range_after(&mut self, after: &str, count: usize) -> Result<Vec<InboxEntry>> {
        let cmd = self.range_cmd(after, count);
        let conn = &mut self.conn;
        let reply: Value = within(self.timeout, async { Ok(cmd.query_async(conn).await?) }).await?;
        range_reply(reply)
    }

    fn range_cmd(&self, after: &str, count: usize) -> redis::Cmd {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(&self.queue.stream)
            .arg(format!("({after}"))
            .arg("+")
            .arg("COUNT")
            .arg(count);
        cmd
    }

    /// Hands out the `n` entries from `first` to `last` as one marked read if the group
    /// is still at `after` (`lua/inbox_take.lua`), and reads up to `count` entries
    /// after `last` in the same round trip (the next read's, if this one took
    /// them): what the take did, the group's last delivered id now, and the entries
    /// after `last`.
    async fn take(
        &mut self,
        after: &str,
        (n, first, last): (usize, &str, &str),
        count: usize,
    ) -> Result<(Took, String, Vec<InboxEntry>)> {
        let inv = take_call(
            &self.store,
            &self.queue,
            &self.consumer,
            after,
            (n, first, last),
        );
        let next = self.range_cmd(last, count);
        let conn = &mut self.conn;
        let (reply, next) = within(self.timeout, async {
            inv.invoke_then(conn, &next)
                .await
                .map_err(StoreError::from_script)
        })
        .await?;
        let (took, now) = take_reply(reply)?;
        Ok((took, now, range_reply(next)?))
    }

    /// The group's last delivered id: a take of nothing answers it.
    async fn delivered(&mut self) -> Result<String> {
        let inv = take_call(&self.store, &self.queue, &self.consumer, "", (0, "", ""));
        let reply = script_call(&mut self.conn, self.timeout, &inv).await?;
        Ok(take_reply(reply)?.1)
    }

    /// This reader's marked reads that a life of it before left unfinished (their
    /// consumers still holding entries).
    pub async fn own_reads(&mut self) -> Result<Vec<String>> {
        let own = format!("{}@", self.consumer);
        Ok(self
            .consumers()
            .await?
            .into_iter()
            .filter(|c| c.pending > 0 && c.name.starts_with(&own) && is_read_consumer(&c.name))
            .map(|c| c.name)
            .collect())
    }

    /// Whether a reader of an older release reads the inbox: a plain consumer seen
    /// within the last few seconds with no consumer `<its name>@` beside it, which
    /// each reader of this release makes (and keeps) as it asks.
    ///
    /// At `maxmemory` Redis refuses to make that consumer (`XGROUP CREATECONSUMER`
    /// is refused there, unlike reads and claims): the check goes on without it.
    /// Until it is made, readers of this release take this one for an older
    /// release's and read entry by entry, the safe side.
    pub async fn older_readers(&mut self) -> Result<bool> {
        let mut made = redis::cmd("XGROUP");
        made.arg("CREATECONSUMER")
            .arg(&self.queue.stream)
            .arg(&self.queue.group)
            .arg(format!("{}@", self.consumer));
        let conn = &mut self.conn;
        let made: Result<Value> =
            within(self.timeout, async { Ok(made.query_async(conn).await?) }).await;
        if let Err(e) = made
            && !matches!(&e, StoreError::Redis(r) if r.code() == Some("OOM"))
        {
            return Err(e);
        }
        let consumers = self.consumers().await?;
        let marked: std::collections::HashSet<&str> = consumers
            .iter()
            .filter_map(|c| c.name.strip_suffix('@'))
            .collect();
        Ok(consumers.iter().any(|c| {
            c.idle < OLDER_READER_SEEN
                && c.name != self.consumer
                && !c.name.ends_with('@')
                && !is_read_consumer(&c.name)
                && !marked.contains(c.name.as_str())
        }))
    }

    /// The group's consumers (`XINFO CONSUMERS`; none without the group).
    async fn consumers(&mut self) -> Result<Vec<Consumer>> {
        let mut cmd = redis::cmd("XINFO");
        cmd.arg("CONSUMERS")
            .arg(&self.queue.stream)
            .arg(&self.queue.group);
        let conn = &mut self.conn;
        let reply = within(self.timeout, async {
            match cmd.query_async::<Value>(conn).await {
                Ok(reply) => Ok(reply),
                Err(e) if e.code() == Some("NOGROUP") => Ok(Value::Nil),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
        if reply == Value::Nil {
            return Ok(Vec::new());
        }
        array(reply)?.into_iter().map(consumer).collect()
    }
}

/// `lua/inbox_take.lua` for `consumer`'s read of the `n` entries from `first` to
/// `last`, read after `after` (all "" and 0: a take of nothing, which answers the
/// group's last delivered id).
fn take_call<'s>(
    store: &'s Store,
    queue: &InboxQueue,
    consumer: &str,
    after: &str,
    (n, first, last): (usize, &str, &str),
) -> Call<'s> {
    let mut inv = store.scripts.inbox_take.prepare_invoke();
    inv.key(&queue.stream)
        .arg(&queue.group)
        .arg(format!("{consumer}@"))
        .arg(after)
        .arg(first)
        .arg(last)
        .arg(n);
    inv
}

/// What a take did (`lua/inbox_take.lua`).
enum Took {
    /// Handed the entries out as the read of this consumer.
    Read(String),
    /// Moved the group past them, none of them left to hand out.
    Deleted,
    /// Nothing: another reader had moved the group.
    Moved,
}

/// `inbox_take.lua`'s answer: what it did and the group's last delivered id.
fn take_reply(reply: Value) -> Result<(Took, String)> {
    match &array(reply)?[..] {
        [read, now, moved] => {
            let read = text(read)?;
            let took = match super::int(moved)? {
                0 => Took::Moved,
                _ if read.is_empty() => Took::Deleted,
                _ => Took::Read(read),
            };
            Ok((took, text(now)?))
        }
        other => Err(StoreError::Reply(format!("inbox_take answered {other:?}"))),
    }
}

/// An `XRANGE` reply as entries (an error reply fails).
fn range_reply(reply: Value) -> Result<Vec<InboxEntry>> {
    if let Value::ServerError(e) = reply {
        return Err(StoreError::Redis(e.into()));
    }
    Ok(entry_list(reply)?
        .into_iter()
        .map(InboxEntry::from)
        .collect())
}

/// A consumer of the inbox's group, as `XINFO CONSUMERS` lists it.
struct Consumer {
    name: String,
    pending: i64,
    idle: Duration,
}

fn consumer(item: Value) -> Result<Consumer> {
    let mut c = Consumer {
        name: String::new(),
        pending: 0,
        idle: Duration::ZERO,
    };
    let fields: Vec<Value> = match item {
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        other => array(other)?,
    };
    for pair in fields.chunks(2) {
        let [field, value] = pair else { continue };
        match text(field)?.as_str() {
            "name" => c.name = text(value)?,
            "pending" => c.pending = super::int(value)?,
            "idle" => c.idle = Duration::from_millis(super::int(value)?.max(0) as u64),
            _ => {}
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::is_read_consumer;

    #[test]
    #[rustfmt::skip]
    fn read_consumers_are_told_from_plain_ones() {
        for (name, read) in [
            ("node-1@1700000000000-0..1700000000001-3", true),
            ("node-1@", false),
            ("a@b@1-0..2-0", true),
            ("node-1", false),
            ("node@host", false),
            ("node-1@1-0..", false),
            ("node-1@1-0..2", false),
            ("node-1@-0..2-0", false),
            ("node-1@1-0..2-99999999999999999999", false),
            ("node-1@1-0.2-0", false),
            ("", false),
        ] {
            assert_eq!(is_read_consumer(name), read, "{name}");
        }
    }
}

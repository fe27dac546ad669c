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

use std::time::Duration;

use redis::Value;

use super::inbox::{InboxEntry, InboxQueue, InboxReader, script_call};
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
    let Some((_, range)) = consumer.rsplit_once('@') else {
        return false;
    };
    range
        .split_once("..")
        .is_some_and(|(first, last)| entry_id(first).is_some() && entry_id(last).is_some())
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
    /// takes what that one left, or nothing (the caller reads again).
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
        let mut after = match self.cursor.take() {
            Some(after) => after,
            None => self.delivered().await?,
        };
        let mut entries = self.range_after(&after, count).await?;
        if entries.is_empty() {
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
            let (read, now) = self.take(&after, &first, &last).await?;
            if now == last {
                self.cursor = Some(now);
                // None left to hand out: deleted from the inbox since they were read.
                if read.is_empty() {
                    return Ok(Read::default());
                }
                return Ok(Read {
                    entries,
                    marked: Some(read),
                });
            }
            // Another reader moved the group first: what it left of these, if any.
            let moved = entry_id(&now);
            entries.retain(|e| entry_id(&e.id) > moved);
            after = now;
        }
        self.cursor = Some(after);
        Ok(Read::default())
    }

    /// Up to `count` entries after `after`, handing nothing out.
    async fn range_after(&mut self, after: &str, count: usize) -> Result<Vec<InboxEntry>> {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(&self.queue.stream)
            .arg(format!("({after}"))
            .arg("+")
            .arg("COUNT")
            .arg(count);
        let conn = &mut self.conn;
        let reply: Value = within(self.timeout, async { Ok(cmd.query_async(conn).await?) }).await?;
        Ok(entry_list(reply)?
            .into_iter()
            .map(InboxEntry::from)
            .collect())
    }

    /// Hands out the entries from `first` to `last` as one marked read if the group
    /// is still at `after` (`lua/inbox_take.lua`): the read's consumer ("" when none
    /// of them was left) and the group's last delivered id now.
    async fn take(&mut self, after: &str, first: &str, last: &str) -> Result<(String, String)> {
        let mut inv = self.store.scripts.inbox_take.prepare_invoke();
        inv.key(&self.queue.stream)
            .arg(&self.queue.group)
            .arg(format!("{}@", self.consumer))
            .arg(after)
            .arg(first)
            .arg(last);
        let reply = script_call(&mut self.conn, self.timeout, &inv).await?;
        match &array(reply)?[..] {
            [read, now] => Ok((text(read)?, text(now)?)),
            other => Err(StoreError::Reply(format!("inbox_take answered {other:?}"))),
        }
    }

    /// The group's last delivered id: a take of nothing answers it.
    async fn delivered(&mut self) -> Result<String> {
        Ok(self.take("", "", "").await?.1)
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
    pub async fn older_readers(&mut self) -> Result<bool> {
        let mut made = redis::cmd("XGROUP");
        made.arg("CREATECONSUMER")
            .arg(&self.queue.stream)
            .arg(&self.queue.group)
            .arg(format!("{}@", self.consumer));
        let conn = &mut self.conn;
        let _: Value = within(self.timeout, async { Ok(made.query_async(conn).await?) }).await?;
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

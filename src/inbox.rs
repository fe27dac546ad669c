//! Interception of delayed MQ sends: producers that already XADD keep doing so, into
//! the inbox stream, with reserved fields saying where and when:
//!
//! | field | meaning |
//! |---|---|
//! | `delayq-stream` | target stream (required) |
//! | `delayq-delay` | delay: milliseconds, or human such as `20m` |
//! | `delayq-at` | due time: epoch milliseconds, or RFC 3339 (instead of a delay) |
//! | `delayq-id` | message id (default: the inbox entry id, e.g. `1700000000000-0`) |
//! | `delayq-priority` | 0–9 |
//! | `delayq-ttl` | milliseconds or human, counted from the due time |
//!
//! Every other field is the message, forwarded verbatim and in order. Every instance
//! (leader or not) reads the inbox through one consumer group, under its node id, and
//! schedules each batch with [`Store::schedule_many`], which acknowledges each entry
//! in the same script that stores its message: an entry is acknowledged exactly when
//! it is scheduled. An entry that cannot be scheduled goes, with its reason and
//! original fields, to the rejected stream (also acknowledged atomically); an entry
//! too large to copy there (more field/value pairs than `api.max_fields` plus the
//! six reserved ones, or more bytes than `api.max_message_bytes` plus 4 KiB) goes
//! with its id and reason only. Entries an instance read and never acknowledged (it
//! died) are taken over by any live instance once idle for `inbox.reclaim_after`.
//!
//! Poison input is isolated, never retried forever: a call that fails for any reason
//! but a transient one (Redis unreachable, slow, or refusing writes for now) is split
//! in halves until the entry at fault is found, which is rejected while the others
//! go on; transient failures are retried on the entries held, without reading them
//! again; and an entry handed out more than [`MAX_ATTEMPTS`] times is rejected untried.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::{Config, InboxConfig};
use crate::message::{Due, MessageId, NewMessage, parse_duration_field};
use crate::metrics as m;
use crate::store::{
    BatchItem, CopyLimit, InboxAck, InboxEntry, InboxQueue, InboxReader, Rejection, ScheduleMode,
    Scheduled, Store, StoreError,
};

/// Prefix of the reserved fields; any other `delayq-*` field is refused, so a typo
/// (`delayq-dealy`) is reported instead of forwarded.
const RESERVED_PREFIX: &str = crate::message::RESERVED_PREFIX;
const STREAM_FIELD: &str = "delayq-stream";
const DELAY_FIELD: &str = "delayq-delay";
const AT_FIELD: &str = "delayq-at";
const ID_FIELD: &str = "delayq-id";
const PRIORITY_FIELD: &str = "delayq-priority";
const TTL_FIELD: &str = "delayq-ttl";
const RESERVED: &[&str] = &[
    STREAM_FIELD,
    DELAY_FIELD,
    AT_FIELD,
    ID_FIELD,
    PRIORITY_FIELD,
    TTL_FIELD,
];

/// Longest a read waits for new entries before the loop looks at cancellation and
/// abandoned entries again (and so the longest a stop waits for an idle reader).
const MAX_BLOCK: Duration = Duration::from_millis(500);
/// Batches scheduled at once by one instance, while it reads the next.
const MAX_IN_FLIGHT: usize = 3;
/// Most times an entry is handed out (read again, or taken over from an instance
/// that stopped) without leaving the inbox: handed out once more, it is rejected
/// without another try. A transient error does not use an attempt: the reader
/// retries the entries it holds instead of reading them again.
pub const MAX_ATTEMPTS: u64 = 5;
/// Bytes the reserved fields may add to `api.max_message_bytes` in an entry whose
/// fields are still copied into its rejection.
const RESERVED_BYTES: usize = 4096;

/// Reads the inbox and schedules what it holds until `cancel`; does nothing when the
/// inbox is disabled. Errors are logged and retried with backoff; the read and the
/// batches in flight when `cancel` comes are finished.
pub async fn run(live: watch::Receiver<Arc<Config>>, store: Store, cancel: CancellationToken) {
    let Some(inbox) = live.borrow().inbox.clone() else {
        return;
    };
    let queue = inbox.queue();
    let worker = Worker {
        live,
        inbox,
        queue,
        store,
    };
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    while !cancel.is_cancelled() {
        match worker.consume(&cancel, &mut backoff).await {
            Ok(()) => return,
            Err(e) => {
                metrics::counter!(m::INBOX_ERRORS).increment(1);
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, inbox = %worker.queue.stream, "inbox read or batch failed");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

struct Worker {
    /// The running configuration: a reload's allow list applies to the next batch.
    live: watch::Receiver<Arc<Config>>,
    /// Fixed at start (a reload never changes `[inbox]`).
    inbox: InboxConfig,
    queue: InboxQueue,
    store: Store,
}

impl Worker {
    fn config(&self) -> Arc<Config> {
        self.live.borrow().clone()
    }

    /// One connection's life: own leftovers first, then new entries, taking over
    /// abandoned ones every half `reclaim_after`. Returns Ok only when cancelled.
    async fn consume(
        &self,
        cancel: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<(), StoreError> {
        let mut reader = self
            .store
            .inbox_reader(&self.queue, &self.config().node_id)
            .await?;
        let batch = self.inbox.batch_size;
        // What this consumer held before (a restart under the same node id), page by
        // page: an entry that stays pending (its rejection could not be written) is
        // passed, not read again in a loop.
        let mut after = "0".to_owned();
        loop {
            let entries = reader.own_pending(&after, batch).await?;
            let Some(last) = entries.last() else {
                break;
            };
            after = last.id.clone();
            let deliveries = reader.deliveries(&entries).await?;
            self.handle(&entries, Some(&deliveries), cancel).await?;
        }
        backoff.reset();
        let reclaim_every = (self.inbox.reclaim_after / 2)
            .clamp(Duration::from_millis(50), Duration::from_secs(10));
        let block = reclaim_every.min(MAX_BLOCK);
        let mut next_reclaim = Instant::now();
        // Batches being scheduled while the next one is read, so Redis is not left idle
        // while this process parses; one ends in error only when cancelled while it
        // waits to retry, its entries still pending for the next start.
        let mut in_flight = FuturesUnordered::new();
        loop {
            while let Some(Some(done)) = in_flight.next().now_or_never() {
                done?;
            }
            if in_flight.len() >= MAX_IN_FLIGHT {
                if let Some(done) = in_flight.next().await {
                    done?;
                }
                continue;
            }
            if cancel.is_cancelled() {
                while let Some(done) = in_flight.next().await {
                    done?;
                }
                return Ok(());
            }
            if Instant::now() >= next_reclaim {
                self.reclaim(&mut reader, cancel).await?;
                next_reclaim = Instant::now() + reclaim_every;
            }
            // Never abandoned half-way (not even for cancellation): entries a read
            // returns are pending for this consumer and must be handled. The batches
            // in flight go on meanwhile.
            let read = reader.next(batch, block);
            tokio::pin!(read);
            let entries = loop {
                tokio::select! {
                    entries = &mut read => break entries?,
                    Some(done) = in_flight.next(), if !in_flight.is_empty() => done?,
                }
            };
            if !entries.is_empty() {
                in_flight.push(async move { self.handle(&entries, None, cancel).await });
            }
        }
    }

    /// Takes over and handles every entry idle longer than `reclaim_after`.
    async fn reclaim(
        &self,
        reader: &mut InboxReader,
        cancel: &CancellationToken,
    ) -> Result<(), StoreError> {
        let mut cursor = "0-0".to_owned();
        loop {
            let (next, entries) = reader
                .reclaim(self.inbox.reclaim_after, self.inbox.batch_size, &cursor)
                .await?;
            if !entries.is_empty() {
                tracing::info!(
                    entries = entries.len(),
                    "took over inbox entries another instance left unacknowledged"
                );
                metrics::counter!(m::INBOX_RECLAIMED).increment(entries.len() as u64);
                let deliveries = reader.deliveries(&entries).await?;
                self.handle(&entries, Some(&deliveries), cancel).await?;
            }
            if next == "0-0" || next.is_empty() {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Handles `entries` (see [`Worker::attempt`]), then retries, with backoff, those
    /// a transient error left pending, holding them meanwhile instead of reading
    /// them again: a Redis that refuses writes for a while costs an entry none of its
    /// [`MAX_ATTEMPTS`]. `deliveries` (entry id → times handed out) is given for
    /// entries read again or taken over. Fails only when `cancel` comes while
    /// entries wait for a retry; they stay pending and are read again first.
    async fn handle(
        &self,
        entries: &[InboxEntry],
        deliveries: Option<&HashMap<String, u64>>,
        cancel: &CancellationToken,
    ) -> Result<(), StoreError> {
        let mut todo: Vec<&InboxEntry> = entries.iter().collect();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let Some((left, error)) = self.attempt(&todo, deliveries).await else {
                return Ok(());
            };
            metrics::counter!(m::INBOX_ERRORS).increment(1);
            let delay = backoff.next_delay();
            tracing::warn!(error = %error, entries = left.len(), retry_in = ?delay, inbox = %self.queue.stream, "inbox batch failed; retrying its entries");
            tokio::select! {
                _ = cancel.cancelled() => return Err(error),
                _ = tokio::time::sleep(delay) => {}
            }
            let ids: Vec<&str> = left.iter().map(|e| e.id.as_str()).collect();
            if let Err(e) = self
                .store
                .hold_inbox_entries(&self.queue, &self.config().node_id, &ids)
                .await
            {
                tracing::debug!(error = %e, "could not hold inbox entries until their retry");
            }
            todo = left;
        }
    }

    /// One try at each entry: schedules the valid ones (acknowledging each with its
    /// message) and rejects the rest. A call that fails for any but a transient
    /// reason is split in halves until the entry at fault is found, which is then
    /// rejected alone; an entry handed out more than [`MAX_ATTEMPTS`] times is
    /// rejected untried. Returns the entries a transient error left pending, with
    /// the first such error.
    async fn attempt<'e>(
        &self,
        todo: &[&'e InboxEntry],
        deliveries: Option<&HashMap<String, u64>>,
    ) -> Option<(Vec<&'e InboxEntry>, StoreError)> {
        let config = self.config();
        let mut items = Vec::with_capacity(todo.len());
        let mut from = Vec::with_capacity(todo.len());
        let mut rejects: Vec<(&InboxEntry, String)> = Vec::new();
        for &entry in todo {
            let handed_out = deliveries.and_then(|d| d.get(&entry.id)).copied();
            if let Some(n) = handed_out.filter(|&n| n > MAX_ATTEMPTS) {
                tracing::warn!(entry = %entry.id, handed_out = n, "inbox entry read too often without leaving the inbox; rejected untried");
                rejects.push((
                    entry,
                    format!(
                        "handed out {n} times without being scheduled or rejected (at most {MAX_ATTEMPTS} attempts): given up"
                    ),
                ));
                continue;
            }
            match parse_entry(entry, &config) {
                Ok(msg) => {
                    items.push(BatchItem {
                        msg,
                        mode: ScheduleMode::New,
                        inbox_entry: Some(entry.id.clone()),
                    });
                    from.push(entry);
                }
                Err(reason) => rejects.push((entry, reason)),
            }
        }
        let ack = Some(InboxAck {
            stream: &self.queue.stream,
            group: &self.queue.group,
        });
        let max_delay = self.config().api.limits.max_delay;
        let items = &items;
        let outcomes = isolate(items.len(), |indexes: Vec<usize>| async move {
            let outcomes = if indexes.len() == items.len() {
                self.store.schedule_many(items, max_delay, ack).await
            } else {
                let some: Vec<BatchItem> = indexes.iter().map(|&i| items[i].clone()).collect();
                self.store.schedule_many(&some, max_delay, ack).await
            };
            // Too far ahead is an answer about one message, not a failed call.
            outcomes
                .into_iter()
                .map(|outcome| match outcome {
                    Err(StoreError::TooFar(detail)) => Ok(Err(detail)),
                    other => other.map(Ok),
                })
                .collect()
        })
        .await;
        let (mut scheduled, mut duplicates) = (0u64, 0u64);
        let mut left = Vec::new();
        let mut first_error = None;
        for (entry, outcome) in from.into_iter().zip(outcomes) {
            match outcome {
                Isolated::Done(Ok(Scheduled::Scheduled { .. } | Scheduled::Replaced { .. })) => {
                    scheduled += 1
                }
                Isolated::Done(Ok(Scheduled::Duplicate { .. })) => duplicates += 1,
                Isolated::Done(Err(detail)) => {
                    rejects.push((entry, format!("{AT_FIELD}: {detail}")))
                }
                Isolated::Transient(e) => {
                    left.push(entry);
                    first_error.get_or_insert(e);
                }
                Isolated::Fault(e) => {
                    tracing::warn!(entry = %entry.id, error = %e, "inbox entry fails to schedule on its own; rejected");
                    rejects.push((entry, format!("cannot be scheduled: {e}")));
                }
            }
        }
        metrics::counter!(m::INBOX_ENTRIES, "outcome" => "scheduled").increment(scheduled);
        metrics::counter!(m::INBOX_ENTRIES, "outcome" => "duplicate").increment(duplicates);
        self.reject(&rejects, &mut left, &mut first_error).await;
        first_error.map(|e| (left, e))
    }

    /// Writes the rejections, isolating one that fails on its own as scheduling
    /// does. Such an entry is rejected again without its fields; if even that fails,
    /// it stays pending (logged) until taken over after `reclaim_after`, never
    /// holding up the entries after it. Entries a transient error left pending are
    /// added to `left`.
    async fn reject<'e>(
        &self,
        rejects: &[(&'e InboxEntry, String)],
        left: &mut Vec<&'e InboxEntry>,
        first_error: &mut Option<StoreError>,
    ) {
        if rejects.is_empty() {
            return;
        }
        let limit = self.copy_limit();
        let rejections: Vec<Rejection> = rejects
            .iter()
            .map(|(entry, reason)| {
                tracing::debug!(entry = %entry.id, reason, "inbox entry rejected");
                Rejection::new(entry, reason.clone(), limit)
            })
            .collect();
        let rejections = &rejections;
        let outcomes = isolate(rejections.len(), |indexes: Vec<usize>| async move {
            let done = if indexes.len() == rejections.len() {
                self.store
                    .reject_inbox_entries(&self.queue, rejections)
                    .await
            } else {
                let some: Vec<Rejection> = indexes.iter().map(|&i| rejections[i].clone()).collect();
                self.store.reject_inbox_entries(&self.queue, &some).await
            };
            vec![done.map(|_| ()); indexes.len()]
        })
        .await;
        let mut rejected = 0u64;
        for ((entry, _), (rejection, outcome)) in
            rejects.iter().zip(rejections.iter().zip(outcomes))
        {
            let error = match outcome {
                Isolated::Done(()) => {
                    rejected += 1;
                    continue;
                }
                Isolated::Transient(e) => {
                    left.push(entry);
                    first_error.get_or_insert(e);
                    continue;
                }
                Isolated::Fault(e) if rejection.has_fields() => {
                    let bare = Rejection::without_fields(
                        entry,
                        format!(
                            "{}; its fields could not be copied to the rejected stream ({e})",
                            rejection.reason()
                        ),
                    );
                    match self.store.reject_inbox_entries(&self.queue, &[bare]).await {
                        Ok(_) => {
                            tracing::warn!(entry = %entry.id, error = %e, "inbox entry rejected without its fields: they could not be copied");
                            rejected += 1;
                            continue;
                        }
                        Err(e) if e.is_transient() => {
                            left.push(entry);
                            first_error.get_or_insert(e);
                            continue;
                        }
                        Err(e) => e,
                    }
                }
                Isolated::Fault(e) => e,
            };
            metrics::counter!(m::INBOX_ERRORS).increment(1);
            tracing::error!(entry = %entry.id, error = %error, rejected_stream = %self.queue.rejected_stream, "inbox entry cannot be rejected; it stays pending and is tried again once idle for inbox.reclaim_after");
        }
        metrics::counter!(m::INBOX_ENTRIES, "outcome" => "rejected").increment(rejected);
    }

    /// How large an entry may be and still have its fields copied into its
    /// rejection: what a message may hold, plus the reserved fields.
    fn copy_limit(&self) -> CopyLimit {
        let limits = &self.config().api.limits;
        CopyLimit {
            pairs: limits.max_fields + RESERVED.len(),
            bytes: limits.max_message_bytes + RESERVED_BYTES,
        }
    }
}

/// How one item of a batch ended after [`isolate`].
#[derive(Debug)]
enum Isolated<T> {
    Done(T),
    /// Redis did not take the call now; the item is not at fault.
    Transient(StoreError),
    /// The item failed alone, for reasons of its own.
    Fault(StoreError),
}

/// Calls `call` on items `0..n` and isolates the ones at fault: the items of a
/// failed call (any error but a transient one) are tried again in halves until
/// each failure is pinned on one item. `call` answers for each index it is given,
/// in order, and a failed call fails every item it carried. Outcomes come back in
/// index order. Items that succeeded are never sent again, so `n` items with one at
/// fault cost about 2 log2(n) calls.
async fn isolate<T, F, Fut>(n: usize, call: F) -> Vec<Isolated<T>>
where
    F: Fn(Vec<usize>) -> Fut,
    Fut: Future<Output = Vec<Result<T, StoreError>>>,
{
    let mut out: Vec<Option<Isolated<T>>> = (0..n).map(|_| None).collect();
    let mut groups = vec![(0..n).collect::<Vec<usize>>()];
    while let Some(group) = groups.pop() {
        if group.is_empty() {
            continue;
        }
        let alone = group.len() == 1;
        let mut answers = call(group.clone()).await.into_iter();
        let mut failed = Vec::new();
        for i in group {
            let answer = answers
                .next()
                .unwrap_or_else(|| Err(StoreError::Reply("no answer for a batch item".into())));
            match answer {
                Ok(done) => out[i] = Some(Isolated::Done(done)),
                Err(e) if e.is_transient() => out[i] = Some(Isolated::Transient(e)),
                Err(e) if alone => out[i] = Some(Isolated::Fault(e)),
                Err(e) => failed.push((i, e)),
            }
        }
        match failed.len() {
            0 => {}
            // The only item of its call that failed: the call carried it alone.
            1 => {
                let (i, e) = failed.remove(0);
                out[i] = Some(Isolated::Fault(e));
            }
            len => {
                let mut first: Vec<usize> = failed.into_iter().map(|(i, _)| i).collect();
                let second = first.split_off(len / 2);
                groups.push(second);
                groups.push(first);
            }
        }
    }
    out.into_iter()
        .map(|o| o.expect("every item answered"))
        .collect()
}

/// Turns an inbox entry into a message, or says why it cannot be one, naming the field.
pub fn parse_entry(entry: &InboxEntry, config: &Config) -> Result<NewMessage, String> {
    let Some(raw) = &entry.fields else {
        return Err("entry deleted from the inbox before it was scheduled".into());
    };
    let mut reserved: Vec<(&str, String)> = Vec::new();
    let mut fields = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        let name = std::str::from_utf8(name)
            .map_err(|_| format!("field name {:?}: not UTF-8", String::from_utf8_lossy(name)))?;
        let value =
            String::from_utf8(value.clone()).map_err(|_| format!("{name}: value is not UTF-8"))?;
        if let Some(&known) = RESERVED.iter().find(|&&r| r == name) {
            if reserved.iter().any(|(n, _)| *n == known) {
                return Err(format!("{known}: given more than once"));
            }
            reserved.push((known, value));
        } else if name.starts_with(RESERVED_PREFIX) {
            return Err(format!(
                "{name}: unknown reserved field (known: {})",
                RESERVED.join(", ")
            ));
        } else {
            fields.push((name.to_owned(), value));
        }
    }
    let get = |name: &str| {
        reserved
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    };

    let stream =
        get(STREAM_FIELD).ok_or_else(|| format!("{STREAM_FIELD}: required (the target stream)"))?;
    crate::message::validate_stream(stream).map_err(|e| format!("{STREAM_FIELD}: {e}"))?;
    if let Some(refusal) = config.target_refusal(stream) {
        return Err(format!("{STREAM_FIELD}: {refusal}"));
    }
    let due = match (get(DELAY_FIELD), get(AT_FIELD)) {
        (Some(_), Some(_)) => return Err(format!("{DELAY_FIELD}, {AT_FIELD}: give one, not both")),
        (None, None) => return Err(format!("{DELAY_FIELD} or {AT_FIELD}: required")),
        (Some(delay), None) => Due::In(parse_duration_field(DELAY_FIELD, delay)?),
        (None, Some(at)) => Due::At(epoch_ms(at)?),
    };
    let id = match get(ID_FIELD) {
        Some(id) => MessageId::parse(id).map_err(|e| format!("{ID_FIELD}: {e}"))?,
        None => MessageId::parse(&entry.id).map_err(|e| format!("inbox entry id: {e}"))?,
    };
    let priority = match get(PRIORITY_FIELD) {
        None => 0,
        Some(p) => p
            .trim()
            .parse::<u8>()
            .ok()
            .filter(|&p| p <= crate::message::MAX_PRIORITY)
            .ok_or_else(|| format!("{PRIORITY_FIELD} {p:?}: must be an integer from 0 to 9"))?,
    };
    let ttl = get(TTL_FIELD)
        .map(|t| parse_duration_field(TTL_FIELD, t))
        .transpose()?;
    if fields.is_empty() {
        return Err(format!(
            "no message fields: the entry holds only {RESERVED_PREFIX}* fields"
        ));
    }
    let msg = NewMessage {
        id,
        stream: stream.to_owned(),
        fields,
        due,
        priority,
        ttl,
    };
    msg.validate(
        &config.api.limits,
        &crate::message::OwnFields::of(&config.forwarder),
    )
    .map_err(|e| e.to_string())?;
    Ok(msg)
}

/// Epoch milliseconds, or an RFC 3339 time.
fn epoch_ms(value: &str) -> Result<u64, String> {
    let value = value.trim();
    if value.starts_with('-') {
        return Err(format!("{AT_FIELD} {value:?}: must not be negative"));
    }
    if let Ok(ms) = value.parse::<u64>() {
        return Ok(ms);
    }
    let ts: jiff::Timestamp = value
        .parse()
        .map_err(|_| format!("{AT_FIELD} {value:?}: not epoch milliseconds or an RFC 3339 time"))?;
    u64::try_from(ts.as_millisecond()).map_err(|_| format!("{AT_FIELD} {value:?}: before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::from_toml("[streams]\nallow = [\"orders*\"]", std::iter::empty()).unwrap()
    }

    fn entry(fields: &[(&str, &str)]) -> InboxEntry {
        InboxEntry {
            id: "1700000000000-0".into(),
            fields: Some(
                fields
                    .iter()
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                    .collect(),
            ),
        }
    }

    /// A parsed message: id, due time, message fields.
    type Parsed<'a> = (&'a str, Due, &'a [(&'a str, &'a str)]);

    #[track_caller]
    fn check(fields: &[(&str, &str)], expected: Result<Parsed<'_>, &str>) {
        let got = parse_entry(&entry(fields), &config());
        match (got, expected) {
            (Ok(msg), Ok((id, due, message_fields))) => {
                assert_eq!(msg.id.as_str(), id);
                assert_eq!(msg.due, due);
                let want: Vec<(String, String)> = message_fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                assert_eq!(msg.fields, want);
            }
            (Err(reason), Err(part)) => {
                assert!(reason.contains(part), "{reason:?} should contain {part:?}")
            }
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    #[test]
    #[rustfmt::skip]
    fn entries() {
        let ms = Duration::from_millis;
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1500"), ("a", "1")], Ok(("1700000000000-0", Due::In(ms(1500)), &[("a", "1")])));
        check(&[("a", "1"), ("delayq-stream", "orders"), ("delayq-delay", "20m"), ("b", "2")], Ok(("1700000000000-0", Due::In(ms(1_200_000)), &[("a", "1"), ("b", "2")])));
        check(&[("delayq-stream", "orders"), ("delayq-at", "1800000000000"), ("delayq-id", "o-1"), ("a", "1")], Ok(("o-1", Due::At(1_800_000_000_000), &[("a", "1")])));
        check(&[("delayq-stream", "orders"), ("delayq-at", "2027-01-15T08:00:00Z"), ("a", "1")], Ok(("1700000000000-0", Due::At(1_800_000_000_000), &[("a", "1")])));
        check(&[("delayq-delay", "1s"), ("a", "1")], Err("delayq-stream: required"));
        check(&[("delayq-stream", "billing"), ("delayq-delay", "1s"), ("a", "1")], Err("not allowed (allowed: orders*)"));
        check(&[("delayq-stream", "orders"), ("a", "1")], Err("delayq-delay or delayq-at: required"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-at", "1"), ("a", "1")], Err("give one, not both"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "-5"), ("a", "1")], Err("delayq-delay \"-5\": must not be negative"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "soon"), ("a", "1")], Err("delayq-delay: \"soon\" is not a duration"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "400days"), ("a", "1")], Err("max_delay"));
        check(&[("delayq-stream", "orders"), ("delayq-at", "tomorrow"), ("a", "1")], Err("delayq-at \"tomorrow\": not epoch milliseconds"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-id", "a b"), ("a", "1")], Err("delayq-id: id \"a b\""));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-priority", "10"), ("a", "1")], Err("delayq-priority \"10\": must be an integer from 0 to 9"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-ttl", "-1s"), ("a", "1")], Err("delayq-ttl \"-1s\": must not be negative"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-dealy", "1s"), ("a", "1")], Err("delayq-dealy: unknown reserved field"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s"), ("delayq-delay", "2s"), ("a", "1")], Err("delayq-delay: given more than once"));
        check(&[("delayq-stream", "orders"), ("delayq-delay", "1s")], Err("no message fields"));
        check(&[("delayq-stream", "delayq:inbox"), ("delayq-delay", "1s"), ("a", "1")], Err("delayq's own keys"));
        check(&[("delayq-stream", "a b"), ("delayq-delay", "1s"), ("a", "1")], Err("delayq-stream: stream \"a b\""));
    }

    /// Runs [`isolate`] on `n` items against a call that fails as a whole when it
    /// carries one of `poison`, and answers a transient error for each of
    /// `transient` otherwise; checks which items end at fault and which transient,
    /// that the others are done, and that it took at most `max_calls` calls.
    #[track_caller]
    fn check_isolate(
        n: usize,
        poison: &[usize],
        transient: &[usize],
        (faults, transients): (&[usize], &[usize]),
        max_calls: usize,
    ) {
        let calls = std::cell::Cell::new(0);
        let outcomes = futures::executor::block_on(isolate(n, |group: Vec<usize>| {
            calls.set(calls.get() + 1);
            let answers: Vec<Result<usize, StoreError>> =
                if group.iter().any(|i| poison.contains(i)) {
                    let e = StoreError::Redis(redis::make_extension_error(
                        "ERR".into(),
                        Some("poison".into()),
                    ));
                    group.iter().map(|_| Err(e.clone())).collect()
                } else {
                    group
                        .iter()
                        .map(|&i| match transient.contains(&i) {
                            true => Err(StoreError::Busy("not now".into())),
                            false => Ok(i),
                        })
                        .collect()
                };
            std::future::ready(answers)
        }));
        let (mut got_faults, mut got_transients) = (Vec::new(), Vec::new());
        for (i, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Isolated::Done(done) => assert_eq!(done, i, "item {i} answered for another"),
                Isolated::Transient(_) => got_transients.push(i),
                Isolated::Fault(_) => got_faults.push(i),
            }
        }
        assert_eq!(
            (&got_faults[..], &got_transients[..]),
            (faults, transients),
            "{n} items, poison {poison:?}"
        );
        assert!(
            calls.get() <= max_calls,
            "{} calls for {n} items, poison {poison:?}",
            calls.get()
        );
    }

    #[test]
    #[rustfmt::skip]
    fn failed_calls_are_split_until_the_item_at_fault_is_found() {
        check_isolate(0, &[], &[], (&[], &[]), 0);
        check_isolate(8, &[], &[], (&[], &[]), 1);
        check_isolate(1, &[0], &[], (&[0], &[]), 1);
        check_isolate(8, &[5], &[], (&[5], &[]), 7);
        check_isolate(8, &[0, 7], &[], (&[0, 7], &[]), 11);
        check_isolate(4, &[0, 1, 2, 3], &[], (&[0, 1, 2, 3], &[]), 7);
        check_isolate(500, &[123], &[], (&[123], &[]), 19);
        check_isolate(3, &[], &[1], (&[], &[1]), 1);
        check_isolate(6, &[2], &[4], (&[2], &[4]), 9);
    }

    #[test]
    fn deleted_and_binary_entries_are_refused() {
        let deleted = InboxEntry {
            id: "1-0".into(),
            fields: None,
        };
        assert!(
            parse_entry(&deleted, &config())
                .unwrap_err()
                .contains("deleted")
        );
        let binary = InboxEntry {
            id: "1-0".into(),
            fields: Some(vec![
                (b"delayq-stream".to_vec(), b"orders".to_vec()),
                (b"delayq-delay".to_vec(), b"1".to_vec()),
                (b"p".to_vec(), vec![0xff, 0xfe]),
            ]),
        };
        assert_eq!(
            parse_entry(&binary, &config()).unwrap_err(),
            "p: value is not UTF-8"
        );
    }

    mod props {
        use proptest::prelude::*;

        use super::*;
        use crate::message::props::text;

        /// Field lists a producer could XADD: delayq's reserved names (with values
        /// that parsers look at, or anything) mixed with arbitrary fields.
        fn fields() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
            let name = prop_oneof![
                prop::sample::select(
                    &[
                        "delayq-stream",
                        "delayq-delay",
                        "delayq-at",
                        "delayq-id",
                        "delayq-priority",
                        "delayq-ttl",
                        "delayq-other",
                        "a",
                    ][..]
                )
                .prop_map(str::to_owned),
                text(),
            ];
            let value = prop_oneof![
                Just("orders".to_owned()),
                "[0-9]{1,25}",
                "-?[0-9]{1,4}(ms|s|m|h|d|y)?",
                "20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](Z|[+-][01][0-9]:00)",
                text(),
            ];
            let pair = (
                name,
                prop_oneof![value.prop_map(String::into_bytes), any::<Vec<u8>>()],
            );
            prop::collection::vec(pair.prop_map(|(k, v)| (k.into_bytes(), v)), 0..12)
        }

        proptest! {
            /// Whatever an entry holds, parsing answers (a message or a reason) and a
            /// message it accepts is one the rules allow.
            #[test]
            fn any_entry_is_a_message_or_a_reason(fields in fields()) {
                let entry = InboxEntry { id: "1700000000000-0".into(), fields: Some(fields) };
                let config = config();
                if let Ok(msg) = parse_entry(&entry, &config) {
                    prop_assert!(config.target_refusal(&msg.stream).is_none());
                    prop_assert!(msg.priority <= 9);
                    prop_assert!(!msg.fields.is_empty());
                    prop_assert!(msg.fields.iter().all(|(k, _)| !k.starts_with(RESERVED_PREFIX)));
                }
            }

            /// A valid entry becomes its message: the producer's fields in order, the
            /// delay as sent, the entry id as the message id.
            #[test]
            fn valid_entries_round_trip(
                delay in 0u64..86_400_000,
                own in prop::collection::vec(("[a-z][a-z0-9_]{0,8}", "[ -~]{0,20}"), 1..8),
            ) {
                let mut fields = vec![
                    (b"delayq-stream".to_vec(), b"orders".to_vec()),
                    (b"delayq-delay".to_vec(), delay.to_string().into_bytes()),
                ];
                fields.extend(own.iter().map(|(k, v)| (k.clone().into_bytes(), v.clone().into_bytes())));
                let entry = InboxEntry { id: "1700000000000-0".into(), fields: Some(fields) };
                let msg = parse_entry(&entry, &config()).unwrap();
                prop_assert_eq!(msg.id.as_str(), "1700000000000-0");
                prop_assert_eq!(msg.due, Due::In(Duration::from_millis(delay)));
                prop_assert_eq!(msg.fields, own);
            }

            /// Epoch milliseconds read back as themselves; RFC 3339 times as theirs.
            #[test]
            fn due_times_round_trip(ms in 0u64..=253_402_300_799_999) {
                prop_assert_eq!(epoch_ms(&ms.to_string()), Ok(ms));
                let ts = jiff::Timestamp::from_millisecond(ms as i64).unwrap();
                prop_assert_eq!(epoch_ms(&ts.to_string()), Ok(ms));
            }

            /// Numbers past 64 bits and negative times are refused, never wrapped.
            #[test]
            fn out_of_range_due_times_are_refused(n in crate::message::props::beyond_u64(), neg in 1u64..) {
                prop_assert!(epoch_ms(&n).is_err());
                let negative = format!("-{neg}");
                prop_assert!(epoch_ms(&negative).is_err());
            }
        }
    }
}

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
//! original fields, to the rejected stream (also acknowledged atomically). Entries an
//! instance read and never acknowledged (it died) are taken over by any live instance
//! once they have been idle for `inbox.reclaim_after`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::{Config, InboxConfig};
use crate::message::{Due, MessageId, NewMessage, parse_duration_field};
use crate::metrics as m;
use crate::store::{
    BatchItem, InboxAck, InboxEntry, InboxQueue, InboxReader, ScheduleMode, Scheduled, Store,
    StoreError,
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

/// Reads the inbox and schedules what it holds until `cancel`; does nothing when the
/// inbox is disabled. Errors are logged and retried with backoff; the read and the
/// batches in flight when `cancel` comes are finished.
pub async fn run(config: Arc<Config>, store: Store, cancel: CancellationToken) {
    let Some(inbox) = config.inbox.clone() else {
        return;
    };
    let queue = inbox.queue();
    let worker = Worker {
        config: config.clone(),
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
    config: Arc<Config>,
    inbox: InboxConfig,
    queue: InboxQueue,
    store: Store,
}

impl Worker {
    /// One connection's life: own leftovers first, then new entries, taking over
    /// abandoned ones every half `reclaim_after`. Returns Ok only when cancelled.
    async fn consume(
        &self,
        cancel: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<(), StoreError> {
        let mut reader = self
            .store
            .inbox_reader(&self.queue, &self.config.node_id)
            .await?;
        let batch = self.inbox.batch_size;
        // What this consumer held before (a restart under the same node id, or a batch
        // that failed): entries that fail again stay pending and come back here.
        loop {
            let entries = reader.own_pending(batch).await?;
            if entries.is_empty() {
                break;
            }
            self.handle(&entries).await?;
        }
        backoff.reset();
        let reclaim_every = (self.inbox.reclaim_after / 2)
            .clamp(Duration::from_millis(50), Duration::from_secs(10));
        let block = reclaim_every.min(MAX_BLOCK);
        let mut next_reclaim = Instant::now();
        // Batches being scheduled while the next one is read, so Redis is not left idle
        // while this process parses; a failed one fails the connection's life, and its
        // entries, still pending, are read again first.
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
                self.reclaim(&mut reader).await?;
                next_reclaim = Instant::now() + reclaim_every;
            }
            // Never abandoned half-way (not even for cancellation): entries a read
            // returns are pending for this consumer and must be handled.
            let entries = reader.next(batch, block).await?;
            if !entries.is_empty() {
                in_flight.push(async move { self.handle(&entries).await });
            }
        }
    }

    /// Takes over and handles every entry idle longer than `reclaim_after`.
    async fn reclaim(&self, reader: &mut InboxReader) -> Result<(), StoreError> {
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
                self.handle(&entries).await?;
            }
            if next == "0-0" || next.is_empty() {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Schedules the valid entries (acknowledging each with its message) and rejects
    /// the rest. An error leaves the entries it concerns pending, to be read again.
    async fn handle(&self, entries: &[InboxEntry]) -> Result<(), StoreError> {
        let mut items = Vec::with_capacity(entries.len());
        let mut from = Vec::with_capacity(entries.len());
        let mut rejects: Vec<(&InboxEntry, String)> = Vec::new();
        for entry in entries {
            match parse_entry(entry, &self.config) {
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
        let ack = InboxAck {
            stream: &self.queue.stream,
            group: &self.queue.group,
        };
        let outcomes = self
            .store
            .schedule_many(&items, self.config.api.limits.max_delay, Some(ack))
            .await;
        let (mut scheduled, mut duplicates, mut first_error) = (0u64, 0u64, None);
        for (entry, outcome) in from.into_iter().zip(outcomes) {
            match outcome {
                Ok(Scheduled::Scheduled { .. } | Scheduled::Replaced { .. }) => scheduled += 1,
                Ok(Scheduled::Duplicate { .. }) => duplicates += 1,
                Err(StoreError::TooFar(detail)) => {
                    rejects.push((entry, format!("{AT_FIELD}: {detail}")))
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        metrics::counter!(m::INBOX_ENTRIES, "outcome" => "scheduled").increment(scheduled);
        metrics::counter!(m::INBOX_ENTRIES, "outcome" => "duplicate").increment(duplicates);
        if !rejects.is_empty() {
            for (entry, reason) in &rejects {
                tracing::debug!(entry = %entry.id, reason, "inbox entry rejected");
            }
            self.store
                .reject_inbox_entries(&self.queue, &rejects)
                .await?;
            metrics::counter!(m::INBOX_ENTRIES, "outcome" => "rejected")
                .increment(rejects.len() as u64);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
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
}

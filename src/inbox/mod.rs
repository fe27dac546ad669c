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
//! | `delayq-key` | business key (`[A-Za-z0-9._:-]{1,128}`), to list or cancel by |
//!
//! Every other field is the message, forwarded verbatim and in order. Every instance
//! (leader or not) reads the inbox through one consumer group, under its node id, and
//! schedules each batch with [`Store::schedule_many`], which acknowledges each entry in
//! the same script that stores its message: an entry is acknowledged exactly when it is
//! scheduled (a marked read's, `delayq_client::store::InboxRead`, all settled at once).
//! An entry that cannot be scheduled goes, with its reason and original fields, to the
//! rejected stream (also acknowledged atomically); an entry too large to copy there
//! (more field/value pairs than `api.max_fields` plus the seven reserved ones, or more
//! bytes than `api.max_message_bytes` plus 4 KiB) goes with its id and reason only.
//! Entries an instance read and never acknowledged (it died) are taken over by any live
//! instance once idle for `inbox.reclaim_after`.
//!
//! Poison input is isolated, never retried forever: a call that fails for any reason
//! but a transient one (Redis unreachable, slow, or refusing writes for now) is split
//! in halves until the entry at fault is found, which is rejected while the others
//! go on; transient failures are retried on the entries held, without reading them
//! again; and an entry handed out more than [`MAX_ATTEMPTS`] times is rejected untried
//! (one that could not be read even on its own, unread: the entry is acknowledged and
//! left in the inbox, pending in the kept group, where its fields can still be read).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::complaint::Complaint;
use crate::config::{Config, InboxConfig};
use crate::message::{Due, MessageId, MessageKey, NewMessage, parse_duration_field};
use crate::metrics as m;
use crate::store::{
    BatchItem, CopyLimit, EntryFields, InboxAck, InboxEntry, InboxQueue, InboxRead, InboxReader,
    MAX_PER_CALL, Rejection, ScheduleMode, Scheduled, Store, StoreError,
};

mod entry;
mod isolate;
mod retry;
mod whole;

pub use entry::parse_entry;
use entry::*;
use isolate::*;

/// Longest a read waits for new entries before the loop looks at cancellation and
/// abandoned entries again (and so the longest a stop waits for an idle reader).
const MAX_BLOCK: Duration = Duration::from_millis(500);
/// Batches scheduled at once by one instance, while it reads the next.
const MAX_IN_FLIGHT: usize = 3;
/// Most times an entry is handed out (read again by a process that starts, or taken
/// over from an instance that stopped) without leaving the inbox: handed out once
/// more, it is rejected without another try. A transient error does not use an
/// attempt: the reader retries the entries it holds instead of reading them again,
/// and a reader that starts over within one process reads its own entries quietly.
pub const MAX_ATTEMPTS: u64 = 5;

/// What the inbox's retries log: one line per condition (see `complaint`), for the
/// reader and for the batches in flight.
static READ_FAILED: Complaint =
    Complaint::new("inbox read or batch failed", "the inbox is read again");
static BATCH_FAILED: Complaint = Complaint::new(
    "inbox batch failed; retrying its entries",
    "inbox batches are scheduled again",
);

/// Reads the inbox and schedules what it holds until `cancel`; does nothing when the
/// inbox is disabled. Errors are logged and retried with backoff; the read and the
/// batches in flight when `cancel` comes are finished.
pub async fn run(
    live: watch::Receiver<Arc<Config>>,
    ingest: crate::ingest::Ingest,
    cancel: CancellationToken,
) {
    let Some(inbox) = live.borrow().inbox.clone() else {
        return;
    };
    let queue = inbox.queue();
    let worker = Worker {
        live,
        inbox,
        queue,
        store: ingest.store().clone(),
        ingest,
    };
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut first = true;
    // Entries a read asks for: halved by each life that ends in error, doubled back
    // by each read that answers, so that a batch too large to read in time (large
    // entries, a loaded machine) is read in parts rather than tried again whole.
    let mut count = worker.inbox.batch_size;
    // An entry of its own a life was reading alone when it ended (see
    // `Worker::own_pending_quietly`).
    let mut suspect = None;
    while !cancel.is_cancelled() {
        let life = worker
            .consume(&cancel, &mut backoff, first, &mut count, &mut suspect)
            .await;
        first = false;
        if life.is_err() {
            count = (count / 2).max(1);
        }
        match life {
            Ok(()) => return,
            Err(e) => {
                metrics::counter!(m::INBOX_ERRORS).increment(1);
                let delay = backoff.next_delay();
                if let Some(said) = READ_FAILED.failed() {
                    tracing::warn!(error = %e, retry_in = ?delay, inbox = %worker.queue.stream, "{said}");
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Waits for the batches in flight, returning the first one's error (cancelled while
/// it waited to retry). A connection's life ends only once they have finished,
/// however it ends: they schedule through the store's own connections, and one
/// dropped half-way would leave its entries pending, to be read again on the next
/// start (see `Worker::consume` for how that reading keeps their attempts).
async fn finish<F>(in_flight: &mut FuturesUnordered<F>) -> Result<(), StoreError>
where
    F: Future<Output = Result<(), StoreError>>,
{
    while let Some(done) = in_flight.next().await {
        done?;
    }
    Ok(())
}

struct Worker {
    /// The running configuration: a reload's allow list applies to the next batch.
    live: watch::Receiver<Arc<Config>>,
    /// Fixed at start (a reload never changes `[inbox]`).
    inbox: InboxConfig,
    queue: InboxQueue,
    store: Store,
    /// Schedules: journal first while the journal is on.
    ingest: crate::ingest::Ingest,
}

impl Worker {
    fn config(&self) -> Arc<Config> {
        self.live.borrow().clone()
    }

    /// One connection's life: own leftovers first, then new entries, taking over
    /// abandoned ones every half `reclaim_after`. Returns Ok only when cancelled.
    /// The process's first life reads its leftovers with `XREADGROUP`, which counts
    /// as handing each out once more: what a process left pending when it ended
    /// (say, an entry that crashes it) uses an attempt each start. A later life,
    /// after an error in this process, reads them quietly: they were not attempted
    /// meanwhile, and a Redis too slow to answer for a while must not use up the
    /// attempts of valid entries (see `Worker::own_pending_quietly`).
    async fn consume(
        &self,
        cancel: &CancellationToken,
        backoff: &mut Backoff,
        first: bool,
        count: &mut usize,
        suspect: &mut Option<String>,
    ) -> Result<(), StoreError> {
        let node = self.config().node_id.clone();
        let mut reader = self.store.inbox_reader(&self.queue, &node).await?;
        // Marked reads an earlier life left unfinished go entry by entry, as its
        // other leftovers do.
        for read in reader.own_reads().await? {
            self.store
                .release_inbox_read(&self.queue, &read, &node, 0, Duration::ZERO)
                .await?;
        }
        let batch = self.inbox.batch_size;
        let grow = |count: &mut usize| *count = (*count * 2).min(batch);
        // What this consumer held before (a restart under the same node id), page by
        // page: an entry that stays pending (its rejection could not be written) is
        // passed, not read again in a loop.
        let mut after = "0".to_owned();
        loop {
            let (last, entries, deliveries) = if first {
                let entries = reader.own_pending(&after, *count).await?;
                let Some(last) = entries.last() else {
                    break;
                };
                let last = last.id.clone();
                let deliveries = reader.deliveries(&entries).await?;
                (last, entries, deliveries)
            } else {
                match self
                    .own_pending_quietly(&mut reader, &after, *count, suspect)
                    .await?
                {
                    Some(read) => read,
                    None => break,
                }
            };
            grow(count);
            after = last;
            if !entries.is_empty() {
                self.handle(&entries, Some(&deliveries), cancel).await?;
            }
        }
        backoff.reset();
        if let Some(said) = READ_FAILED.recovered() {
            tracing::info!(inbox = %self.queue.stream, "{said}");
        }
        let reclaim_every = (self.inbox.reclaim_after / 2)
            .clamp(Duration::from_millis(50), Duration::from_secs(10));
        let block = reclaim_every.min(MAX_BLOCK);
        let mut next_reclaim = Instant::now();
        let mut marked = false;
        // Batches being scheduled while the next one is read, so Redis is not left idle
        // while this process parses; one ends in error only when cancelled while it
        // waits to retry, its entries still pending for the next start.
        let mut in_flight = FuturesUnordered::new();
        let served: Result<(), StoreError> = async {
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
                    return Ok(());
                }
                if Instant::now() >= next_reclaim {
                    self.reclaim(&mut reader, cancel).await?;
                    marked = self.reads_marked(&mut reader, marked).await?;
                    next_reclaim = Instant::now() + reclaim_every;
                }
                // Never abandoned half-way (not even for cancellation): entries a read
                // returns are pending for this consumer and must be handled. The
                // batches in flight go on meanwhile.
                let asked = *count;
                let reader = &mut reader;
                let read = async move {
                    if marked {
                        reader.next_marked(asked, block).await
                    } else {
                        let entries = reader.next(asked, block).await?;
                        Ok(InboxRead {
                            entries,
                            marked: None,
                        })
                    }
                };
                tokio::pin!(read);
                let read = loop {
                    tokio::select! {
                        read = &mut read => {
                            let read = read?;
                            grow(count);
                            break read;
                        }
                        Some(done) = in_flight.next(), if !in_flight.is_empty() => done?,
                    }
                };
                if !read.entries.is_empty() {
                    let way = if read.marked.is_some() {
                        "marked"
                    } else {
                        "entries"
                    };
                    metrics::counter!(m::INBOX_READS, "way" => way).increment(1);
                }
                if !read.entries.is_empty() || read.marked.is_some() {
                    in_flight.push(async move { self.handle_read(read, cancel).await });
                }
            }
        }
        .await;
        // However the loop ended (cancelled, or the reader failed), the batches in
        // flight finish first (see `finish`); a batch's error comes before the loop's.
        finish(&mut in_flight).await.and(served)
    }

    /// Up to `count` of this consumer's entries after `after`, read without handing
    /// them out again: the id of the last one listed (None when none is left), the
    /// entries to handle and how often each was handed out.
    ///
    /// A life that ends while it reads one entry alone leaves that entry in
    /// `suspect`, and the next life counts one more attempt of it before reading it
    /// (`XCLAIM … RETRYCOUNT`, which reads nothing): an entry too large to read
    /// within `redis.timeout` uses its attempts within this process, as a process
    /// start would. An entry handed out more than [`MAX_ATTEMPTS`] times is not read
    /// again: it comes [`EntryFields::Unread`], to be rejected untried like any other
    /// (and left in the inbox, see [`Rejection::new`]).
    async fn own_pending_quietly(
        &self,
        reader: &mut InboxReader,
        after: &str,
        count: usize,
        suspect: &mut Option<String>,
    ) -> Result<Option<(String, Vec<InboxEntry>, HashMap<String, u64>)>, StoreError> {
        let mut listed = reader.own_pending_listed(after, count).await?;
        let Some((last, _)) = listed.last() else {
            return Ok(None);
        };
        let last = last.clone();
        if let Some(id) = suspect.take()
            && let Some((first, handed_out)) = listed.first_mut()
            && *first == id
        {
            *handed_out += 1;
            reader.set_handed_out(first, *handed_out).await?;
        }
        let (given_up, to_read): (Vec<_>, Vec<_>) = listed
            .iter()
            .partition(|&&(_, handed_out)| handed_out > MAX_ATTEMPTS);
        let to_read: Vec<&str> = to_read.iter().map(|(id, _)| id.as_str()).collect();
        if let [alone] = to_read[..] {
            *suspect = Some(alone.to_owned());
        }
        let mut entries = reader.entries(&to_read).await?;
        *suspect = None;
        entries.extend(given_up.into_iter().map(|(id, _)| InboxEntry {
            id: id.clone(),
            fields: EntryFields::Unread,
        }));
        Ok(Some((last, entries, listed.into_iter().collect())))
    }

    /// Takes over and handles every entry idle longer than `reclaim_after`.
    async fn reclaim(
        &self,
        reader: &mut InboxReader,
        cancel: &CancellationToken,
    ) -> Result<(), StoreError> {
        let mut cursor = "-".to_owned();
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
            if next.is_empty() {
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
                if let Some(said) = BATCH_FAILED.recovered() {
                    tracing::info!(inbox = %self.queue.stream, "{said}");
                }
                return Ok(());
            };
            let what = format!("{} entries", left.len());
            self.wait_to_retry(&mut backoff, error, &what, cancel)
                .await?;
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
                let mut reason = format!(
                    "handed out {n} times without being scheduled or rejected (at most {MAX_ATTEMPTS} attempts): given up"
                );
                if entry.fields == EntryFields::Unread {
                    let (stream, id) = (&self.queue.stream, &entry.id);
                    let kept = self.queue.kept_group();
                    reason += &format!(
                        " unread, the last times failing to be read; the entry is left in the inbox, acknowledged and kept (XRANGE {stream} {id} {id}; XACK {stream} {kept} {id} lets it go)"
                    );
                }
                rejects.push((entry, reason));
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
            read: None,
        });
        let max_delay = self.config().api.limits.max_delay;
        let came = &crate::journal::Came::node("inbox", &self.config().node_id);
        let items = &items;
        let outcomes = isolate(items.len(), |indexes: Vec<usize>| async move {
            let outcomes = if indexes.len() == items.len() {
                self.ingest.schedule_many(items, max_delay, ack, came).await
            } else {
                let some: Vec<BatchItem> = indexes.iter().map(|&i| items[i].clone()).collect();
                self.ingest.schedule_many(&some, max_delay, ack, came).await
            };
            // Too far ahead is an answer about one message, not a failed call.
            outcomes
                .into_iter()
                .map(|outcome| match outcome {
                    Err(e @ StoreError::TooFar { .. }) => Ok(Err(e.to_string())),
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

//! The journal's keeper: a leader-only worker that runs while `[journal]` is on.
//!
//! - **Outbox → journal.** Every script that finishes a message (forward, expiry,
//!   dead letter, cancel, redelivery's dead letter) or moves its due time writes the
//!   change to its shard's outbox in the same call; the keeper copies each owned
//!   shard's outbox into the journal (idempotent updates by id) and then drops what
//!   it copied, fenced by the term's epoch. A change is never lost between Redis
//!   and the journal: a keeper that dies before the drop leaves it for the next
//!   leader, which copies it again. The lag (change in Redis → journal commit) is a
//!   metric.
//! - **Loss of Redis's data.** The journal's marker token sits in Redis
//!   (`<prefix>:journal`). The term starts held (no forwarding, no redelivery)
//!   until the keeper has seen the marker; it checks again every 100 ms. A missing
//!   marker while the journal holds messages not finished (or schedules, or paused
//!   streams) means Redis lost its
//!   data: forwarding stays held (so nothing restored is overtaken by a message
//!   pushed later), `delayq_journal_redis_data_lost` is 1, an error is logged, and
//!   with `journal.auto_restore` (the default) the keeper restores, overdue
//!   messages included, then writes the marker back; otherwise it waits for
//!   `delayq restore`, which writes it back.
//! - **Reconciliation.** Every 10 s, messages scheduled in the journal, past due
//!   and last written a minute ago or more are looked up in Redis: finished there,
//!   the journal learns it; unknown there (a push whose Redis call failed after the
//!   journal took it, or writes a Redis failover lost), they are scheduled again.
//! - **Retention.** Every minute, finished messages older than
//!   `journal.retention` are deleted in batches.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::term::Term;
use crate::complaint::Complaint;
use crate::config::Config;
use crate::journal::{Journal, WRITE_TIMEOUT, Who, now_ms};
use crate::message::MessageId;
use crate::metrics as m;
use crate::restore::{RestoreError, RestoreOptions, RestoreReport, restore};
use crate::store::{OutboxCode, OutboxLine, RecordState, Status, Store, StoreError};

/// Outbox items (script calls' changes) copied per shard and round.
const ITEMS_PER_ROUND: usize = 64;
/// Transactions a round's lines are split into at most, and the fewest lines
/// worth a transaction of their own.
const COPY_IN_FLIGHT: usize = 4;
const COPY_MIN_LINES: usize = 2000;
/// How often the outbox is copied when it was found empty.
const COPY_EVERY: Duration = Duration::from_millis(100);
/// How often the marker is read: a loss is seen within this of Redis losing its
/// data, which bounds the restored messages counted as possibly sent before.
pub const MARKER_EVERY: Duration = Duration::from_millis(100);
const MARKER_RETRY: Duration = Duration::from_secs(1);
const RECONCILE_EVERY: Duration = Duration::from_secs(10);
/// A message scheduled in the journal is looked up in Redis once it is this far
/// past due and unchanged this long.
const RECONCILE_AFTER: Duration = Duration::from_secs(60);
const RECONCILE_PAGE: usize = 500;
const TRIM_EVERY: Duration = Duration::from_secs(60);
const TRIM_BATCH: usize = 5000;

// What the keeper's retries log: one line per condition for the keepers of every
// term (one per election group: the place of a failure is the term's, see
// `Term::place`).
static COPY_FAILED: Complaint = Complaint::new(
    "cannot copy the outbox into the journal; retrying (changes wait in Redis)",
    "the journal takes the outbox again",
);
static MARKER_UNCHECKED: Complaint = Complaint::new(
    "cannot check the journal's marker in Redis",
    "the journal's marker is checked again",
);
static RESTORE_FAILED: Complaint =
    Complaint::new("restore failed; trying again", "restoring works again");
static RECONCILE_FAILED: Complaint = Complaint::new(
    "reconciliation of the journal with Redis failed; trying again",
    "reconciliation of the journal with Redis works again",
);
static TRIM_FAILED: Complaint = Complaint::new(
    "cannot trim the journal; trying again in a minute",
    "trimming the journal works again",
);

/// Runs the keeper's loops until the term ends.
pub async fn run(term: Term, live: watch::Receiver<Arc<Config>>, store: Store, journal: Journal) {
    let config = live.borrow().clone();
    tokio::join!(
        copy_outbox(&term, &config, &store, &journal),
        watch_marker(&term, &config, &store, &journal),
        reconcile(&term, &config, &store, &journal),
        trim(&term, &config, &journal),
    );
}

/// Sleeps `d`; false once the term is over.
async fn pause(term: &Term, d: Duration) -> bool {
    tokio::select! {
        _ = term.ended() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

async fn copy_outbox(term: &Term, config: &Config, store: &Store, journal: &Journal) {
    let lag = metrics::histogram!(m::JOURNAL_LAG);
    let changes = metrics::counter!(m::JOURNAL_CHANGES);
    // This term's own changes are this node's, whether or not its record is written.
    let mut nodes = NodesOfEpochs::default();
    nodes.known.insert(term.epoch(), config.node_id.clone());
    loop {
        let copied = match copy_round(term, store, journal, &lag, &mut nodes).await {
            Ok(n) => {
                if let Some(said) = COPY_FAILED.recovered_on(term.place()) {
                    tracing::info!("{said}");
                }
                changes.increment(n as u64);
                n
            }
            Err(CopyError::Fenced(held)) => return term.fenced("the journal outbox", held),
            Err(CopyError::Other(e)) => {
                metrics::counter!(m::JOURNAL_ERRORS, "op" => "copy").increment(1);
                if let Some(said) = COPY_FAILED.failed_on(term.place()) {
                    tracing::warn!(error = %e, "{said}");
                }
                0
            }
        };
        let wait = if copied > 0 {
            Duration::ZERO
        } else {
            COPY_EVERY
        };
        if !pause(term, wait).await {
            return;
        }
    }
}

enum CopyError {
    Fenced(u64),
    Other(String),
}

/// The node that led each epoch, as the leadership history says: read again, at
/// most once a round, when an item names an epoch not known yet (a term's record
/// may be written a moment after its first changes).
#[derive(Default)]
struct NodesOfEpochs {
    known: std::collections::HashMap<u64, String>,
    read_this_round: bool,
}

impl NodesOfEpochs {
    async fn of(&mut self, store: &Store, epoch: u64) -> Option<String> {
        if !self.known.contains_key(&epoch)
            && !self.read_this_round
            && let Ok(terms) = store.terms().await
        {
            self.read_this_round = true;
            self.known
                .extend(terms.into_iter().map(|t| (t.epoch, t.node_id)));
        }
        self.known.get(&epoch).cloned()
    }
}

/// One round over the owned shards in use; the changes it copied.
async fn copy_round(
    term: &Term,
    store: &Store,
    journal: &Journal,
    lag: &metrics::Histogram,
    nodes: &mut NodesOfEpochs,
) -> Result<usize, CopyError> {
    let other = |e: &dyn std::fmt::Display| CopyError::Other(e.to_string());
    nodes.read_this_round = false;
    let shards = store.owned_in_use().await.map_err(|e| other(&e))?;
    let items = store
        .outbox_items(&shards, ITEMS_PER_ROUND)
        .await
        .map_err(|e| other(&e))?;
    // The lines of each shard and epoch (an item a leader wrote opens with
    // `@<epoch>`; a producer's names none), for the transition log's "who".
    let mut groups: Vec<(Who, Vec<OutboxLine>)> = Vec::new();
    let mut count = 0;
    // When each item's first change was made, for the lag once it is committed.
    let mut made = Vec::new();
    for (&shard, shard_items) in shards.iter().zip(&items) {
        for item in shard_items {
            let mut texts = item.split('\n').peekable();
            let epoch = texts
                .next_if(|t| t.starts_with('@'))
                .and_then(|t| t[1..].parse::<u64>().ok());
            let who = Who {
                node: match epoch {
                    Some(epoch) => nodes.of(store, epoch).await,
                    None => None,
                },
                shard: Some(shard),
                epoch,
                token: None,
            };
            let at = match groups.iter().position(|(w, _)| *w == who) {
                Some(at) => at,
                None => {
                    groups.push((who, Vec::new()));
                    groups.len() - 1
                }
            };
            let first = groups[at].1.len();
            for text in texts {
                match OutboxLine::parse(text) {
                    Some(line) => groups[at].1.push(line),
                    None => tracing::error!(
                        line = text,
                        "an outbox line this delayq does not write; skipped"
                    ),
                }
            }
            if let Some(line) = groups[at].1.get(first) {
                made.push(line.at_ms);
            }
            count += groups[at].1.len() - first;
        }
    }
    if count > 0 {
        // In a few transactions at once (each line's row is its own: they do not
        // contend), so that a burst of deliveries is journaled at MySQL's pace.
        let per = count.div_ceil(COPY_IN_FLIGHT).max(COPY_MIN_LINES);
        let applied = futures::future::try_join_all(
            groups
                .iter()
                .flat_map(|(who, lines)| lines.chunks(per).map(move |c| journal.apply_as(c, who))),
        );
        match tokio::time::timeout(WRITE_TIMEOUT, applied).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(other(&e)),
            Err(_) => return Err(other(&"no commit in time")),
        }
        let now = now_ms();
        for at in made {
            lag.record(now.saturating_sub(at) as f64 / 1000.0);
        }
    }
    let mut left = 0;
    for (shard, taken) in shards.iter().zip(&items) {
        if taken.is_empty() {
            continue;
        }
        match store.outbox_ack(*shard, term.epoch(), taken.len()).await {
            Ok(n) => left += n,
            Err(StoreError::Fenced { held, .. }) => return Err(CopyError::Fenced(held)),
            Err(e) => return Err(other(&e)),
        }
    }
    metrics::gauge!(m::JOURNAL_OUTBOX).set(left as f64);
    Ok(count)
}

/// Releases the term's hold while Redis has the marker; on a loss, holds and
/// restores (or waits for an operator's restore).
async fn watch_marker(term: &Term, config: &Config, store: &Store, journal: &Journal) {
    let Some(settings) = &config.journal else {
        return;
    };
    let lost = metrics::gauge!(m::JOURNAL_REDIS_LOST);
    let mut reported = false;
    // When Redis was first seen without the marker (Redis's clock).
    let mut lost_seen_ms = None;
    loop {
        let checked = check_marker(store, journal).await;
        // Quickly while the marker is there; a loss, or a check that failed, is
        // looked at again (and the journal asked again) after a second.
        let wait = match &checked {
            Ok(Marker::Present) => MARKER_EVERY,
            _ => MARKER_RETRY,
        };
        if checked.is_ok()
            && let Some(said) = MARKER_UNCHECKED.recovered_on(term.place())
        {
            tracing::info!("{said}");
        }
        match checked {
            Ok(Marker::Present) => {
                if reported {
                    tracing::info!("Redis has the journal's marker again: forwarding resumes");
                    reported = false;
                }
                lost.set(0.0);
                lost_seen_ms = None;
                term.hold(false);
            }
            Ok(Marker::Lost { unfinished }) => {
                term.hold(true);
                lost.set(1.0);
                if lost_seen_ms.is_none() {
                    lost_seen_ms = store.now_ms().await.ok();
                }
                if !reported {
                    tracing::error!(
                        unfinished,
                        auto_restore = settings.auto_restore,
                        "Redis has lost its data: the journal holds {unfinished} messages not finished, schedules or paused streams; \
                         forwarding is held until they are restored{}",
                        if settings.auto_restore {
                            " (restoring now)"
                        } else {
                            " (run delayq restore --include-overdue)"
                        }
                    );
                    reported = true;
                }
                if settings.auto_restore {
                    match restore_now(config, store, journal, None, lost_seen_ms, term.epoch())
                        .await
                    {
                        Ok(report) => {
                            // The restore wrote the marker back (see `restore`).
                            if let Some(said) = RESTORE_FAILED.recovered_on(term.place()) {
                                tracing::info!("{said}");
                            }
                            tracing::warn!(?report, "restored from the journal");
                            continue;
                        }
                        Err(e) => {
                            metrics::counter!(m::JOURNAL_ERRORS, "op" => "restore").increment(1);
                            if let Some(said) = RESTORE_FAILED.failed_on(term.place()) {
                                tracing::warn!(error = %e, "{said}");
                            }
                        }
                    }
                }
            }
            Err(e) => {
                // Forwarding goes on while the marker was seen last; a term that has
                // not seen it yet stays held.
                metrics::counter!(m::JOURNAL_ERRORS, "op" => "marker").increment(1);
                if let Some(said) = MARKER_UNCHECKED.failed_on(term.place()) {
                    tracing::warn!(error = %e, "{said}");
                }
            }
        }
        if !pause(term, wait).await {
            return;
        }
    }
}

/// The keeper's restores: of every message, or of `id`, overdue ones included
/// (they are what Redis lost), without progress.
async fn restore_now(
    config: &Config,
    store: &Store,
    journal: &Journal,
    id: Option<MessageId>,
    lost_seen_ms: Option<u64>,
    epoch: u64,
) -> Result<RestoreReport, RestoreError> {
    let options = RestoreOptions {
        include_overdue: true,
        dry_run: false,
        id,
        lost_seen_ms,
        records_retention: config.records.retention,
        by: Who {
            node: Some(config.node_id.clone()),
            epoch: Some(epoch),
            ..Who::default()
        },
    };
    restore(
        store,
        journal,
        &options,
        config.api.limits.max_delay,
        &|_, _| {},
    )
    .await
}

enum Marker {
    Present,
    /// Gone while the journal holds `unfinished` things to restore (messages not
    /// finished, schedules, paused streams).
    Lost {
        unfinished: u64,
    },
}

/// Whether Redis still holds the journal's data. A missing marker with nothing
/// to restore in the journal (a first start) is written, not a loss.
async fn check_marker(store: &Store, journal: &Journal) -> Result<Marker, String> {
    if store
        .journal_marker()
        .await
        .map_err(|e| e.to_string())?
        .is_some()
    {
        return Ok(Marker::Present);
    }
    let token = journal.marker().await.map_err(|e| e.to_string())?;
    match mark_if_nothing_to_restore(store, journal, &token).await? {
        0 => {
            tracing::info!("the journal's marker is in Redis");
            Ok(Marker::Present)
        }
        unfinished => Ok(Marker::Lost { unfinished }),
    }
}

/// Writes `token` as Redis's journal marker if the journal holds nothing to
/// restore (no message not finished, no schedule, no paused stream); how much it
/// holds (0: the marker is there, written now or by a restore since the caller
/// read none). The marker goes to Redis
/// provisionally before the journal is counted and is confirmed after: a loss of
/// Redis's data in between takes the provisional value with it, the confirmation
/// fails, and the marker stays missing for the next check to find the loss (a
/// push taken meanwhile is not hidden by a marker written into an empty Redis).
pub async fn mark_if_nothing_to_restore(
    store: &Store,
    journal: &Journal,
    token: &str,
) -> Result<u64, String> {
    let Some(provisional) = store
        .set_provisional_journal_marker(token)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(0);
    };
    let unfinished = journal
        .count_restorable()
        .await
        .map_err(|e| e.to_string())?;
    if unfinished > 0 {
        return Ok(unfinished);
    }
    match store.confirm_journal_marker(&provisional, token).await {
        Ok(true) => Ok(0),
        Ok(false) => {
            Err("Redis lost its data while the journal's marker was written: checking again".into())
        }
        Err(e) => Err(e.to_string()),
    }
}

async fn reconcile(term: &Term, config: &Config, store: &Store, journal: &Journal) {
    let mut after: Option<(u64, String, String)> = None;
    loop {
        if !pause(term, RECONCILE_EVERY).await {
            return;
        }
        term.unheld().await;
        match reconcile_page(config, store, journal, after.as_ref(), term.epoch()).await {
            Ok(next) => {
                after = next;
                if let Some(said) = RECONCILE_FAILED.recovered_on(term.place()) {
                    tracing::info!("{said}");
                }
            }
            Err(e) => {
                metrics::counter!(m::JOURNAL_ERRORS, "op" => "reconcile").increment(1);
                if let Some(said) = RECONCILE_FAILED.failed_on(term.place()) {
                    tracing::warn!(error = %e, "{said}");
                }
            }
        }
    }
}

/// Looks up one page of stale messages; the page's end, or None at the end.
async fn reconcile_page(
    config: &Config,
    store: &Store,
    journal: &Journal,
    after: Option<&(u64, String, String)>,
    epoch: u64,
) -> Result<Option<(u64, String, String)>, String> {
    let now = store.now_ms().await.map_err(|e| e.to_string())?;
    let before = now.saturating_sub(RECONCILE_AFTER.as_millis() as u64);
    let page = journal
        .stale(after, before, before, RECONCILE_PAGE)
        .await
        .map_err(|e| e.to_string())?;
    let Some(last) = page.last() else {
        return Ok(None);
    };
    let next = Some((last.2, last.0.as_str().to_owned(), last.1.clone()));
    // A record in Redis lasts `records.retention`: a message past due longer than
    // that and unknown to Redis may have been delivered and forgotten. Such a one
    // is left for an operator's restore (`--include-overdue`).
    let horizon = now.saturating_sub(config.records.retention.as_millis() as u64);
    let mut learned = Vec::new();
    let mut missing = Vec::new();
    let found = store.statuses(page.iter().map(|(id, _, _)| id)).await;
    for ((id, stream, due), status) in page.into_iter().zip(found) {
        match status.map_err(|e| e.to_string())? {
            Status::Done(record) => learned.push(OutboxLine {
                code: match record.state {
                    RecordState::Delivered => OutboxCode::Delivered,
                    RecordState::Expired => OutboxCode::Expired,
                    RecordState::Dead => OutboxCode::Dead,
                    RecordState::Cancelled => OutboxCode::Cancelled,
                },
                id: id.as_str().to_owned(),
                at_ms: record.at_ms,
                entry: record.entry_id,
                stream: Some(stream),
                attempt: None,
            }),
            Status::Unknown if due > horizon => missing.push(id),
            Status::Unknown | Status::Scheduled(_) | Status::Corrupt(_) => {}
        }
    }
    journal.apply(&learned).await.map_err(|e| e.to_string())?;
    for id in &missing {
        let report = restore_now(config, store, journal, Some(id.clone()), None, epoch)
            .await
            .map_err(|e| e.to_string())?;
        tracing::warn!(
            id = id.as_str(),
            restored = report.restored,
            "a message the journal holds was unknown to Redis past its due time: scheduled again"
        );
    }
    if !learned.is_empty() {
        tracing::info!(
            messages = learned.len(),
            "the journal learned finished messages from Redis's records"
        );
    }
    Ok(next)
}

async fn trim(term: &Term, config: &Config, journal: &Journal) {
    let Some(settings) = &config.journal else {
        return;
    };
    let trimmed = metrics::counter!(m::JOURNAL_TRIMMED);
    loop {
        if !pause(term, TRIM_EVERY).await {
            return;
        }
        let now = now_ms();
        let before = now.saturating_sub(settings.retention.as_millis() as u64);
        let steps_before = now.saturating_sub(settings.transitions_retention.as_millis() as u64);
        loop {
            // Finished messages, then steps of the transition log, in batches.
            let done = match journal.trim(before, TRIM_BATCH).await {
                Ok(n) if n < TRIM_BATCH as u64 => journal
                    .trim_transitions(steps_before, TRIM_BATCH)
                    .await
                    .map(|steps| (n, steps)),
                Ok(n) => Ok((n, TRIM_BATCH as u64)),
                Err(e) => Err(e),
            };
            match done {
                Ok((n, steps)) => {
                    if let Some(said) = TRIM_FAILED.recovered_on(term.place()) {
                        tracing::info!("{said}");
                    }
                    trimmed.increment(n);
                    let more = n >= TRIM_BATCH as u64 || steps >= TRIM_BATCH as u64;
                    if !more || !pause(term, Duration::from_millis(50)).await {
                        break;
                    }
                }
                Err(e) => {
                    metrics::counter!(m::JOURNAL_ERRORS, "op" => "trim").increment(1);
                    if let Some(said) = TRIM_FAILED.failed_on(term.place()) {
                        tracing::warn!(error = %e, "{said}");
                    }
                    break;
                }
            }
        }
    }
}

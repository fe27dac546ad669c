//! Restore: every message the journal holds not finished and Redis does not hold
//! is scheduled again, with its id and its journaled due time, and (a full
//! restore) every stream the journal has as paused is paused again. Shared by `delayq
//! restore`, `POST /v1/admin/restore[/{id}]` and the keeper's automatic restore.
//!
//! A restore schedules through the store's idempotent schedule call (as new, by
//! id), page by page in due order, so that it is safe to run again, to run while
//! the leader forwards, and to run on several nodes at once: a message Redis still
//! holds (pending, or on record as finished) is a duplicate there and stays as it
//! is. Messages the journal says are finished are never read. The only messages a
//! restore can send twice are those delivered but not yet journaled as such when
//! Redis lost its data (the outbox's lag): they were due before Redis was seen
//! without its data (or, where nobody saw when, before the restore began), and the
//! report counts such restored messages as `possibly_duplicate`.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::journal::State;
use crate::journal::{Journal, JournalError};
use crate::message::{Due, MessageId, NewMessage};
use crate::store::{BatchItem, Cancelled, Scheduled, Status, Store, StoreError};

/// Messages read from the journal, and scheduled, at a time.
const PAGE: usize = 5000;
/// Pages being scheduled at once while the next is read.
const PAGES_IN_FLIGHT: usize = 4;

/// What to restore.
#[derive(Clone, Debug, Default)]
pub struct RestoreOptions {
    /// Also messages whose due time has passed (they go out at once); otherwise
    /// those are counted as `overdue` and left.
    pub include_overdue: bool,
    /// Count only: nothing is scheduled.
    pub dry_run: bool,
    /// This message only.
    pub id: Option<MessageId>,
    /// When Redis was first seen without its data (Redis's clock, ms): a message
    /// due later cannot have been delivered before the loss. The keeper, which
    /// checks every [`MARKER_EVERY`](crate::leader::keeper::MARKER_EVERY), knows it.
    pub lost_seen_ms: Option<u64>,
    /// `records.retention`: how long the record of a message the restore cancels
    /// again (see `settle`) is kept.
    pub records_retention: Duration,
    /// Who restores (its messages' transition logs say so).
    pub by: crate::journal::Who,
}

/// What a restore found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RestoreReport {
    /// Messages the journal holds not finished, looked at.
    pub journaled: u64,
    /// Scheduled again (with `dry_run`: would be).
    pub restored: u64,
    /// Redis holds them scheduled already.
    pub already_present: u64,
    /// Redis has them on record as finished (the journal will learn it from the
    /// outbox).
    pub finished_in_redis: u64,
    /// Past their due time and not restored (`include_overdue` false).
    pub overdue: u64,
    /// Restored although due before Redis was seen without its data (before the
    /// restore began, where that is not known): the only ones a consumer may have
    /// received already (delivered but not yet journaled as such). An upper bound:
    /// a message can have been delivered only once due and before the loss.
    pub possibly_duplicate: u64,
    /// Refused by Redis (a due time beyond `api.limits.max_delay`, a stream it
    /// cannot hold); left in the journal.
    pub refused: u64,
    /// Streams the journal has as paused, paused (again) in Redis by a full
    /// restore.
    pub streams_paused: u64,
    /// Recurring schedules the journal holds and Redis did not, put back by a full
    /// restore (with a dry run: the journal's schedules), each made as far as the
    /// journal has its occurrences' messages.
    pub schedules_restored: u64,
    /// Changed once more to what the journal says after the pages were read: a
    /// cancel, reschedule or replay answered just before Redis lost its data whose
    /// journal write came after the restore read the message (see `settle`).
    pub settled: u64,
    pub dry_run: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    #[error("redis: {0}")]
    Store(#[from] StoreError),
    /// Not run: it would send messages a second time (see [`check_safe`]).
    #[error("{0}")]
    Unsafe(String),
    /// A full restore ran, but Redis lost its data again meanwhile (see
    /// `mark_restored`): the marker stays missing, and the restore is to run again.
    #[error(
        "Redis lost its data again during the restore: the journal's marker is not written back; run the restore again"
    )]
    Interrupted,
}

/// Refuses an operator's restore (not a dry run) that could send delivered
/// messages again: with `records.retention = 0s` Redis keeps no record of a
/// delivered message, so one delivered but not yet copied to the journal looks
/// lost to a restore while a leader forwards. Safe once forwarding is held, which
/// the journal's marker gone from Redis (Redis lost its data) means.
pub async fn check_safe(
    store: &Store,
    retention: Duration,
    options: &RestoreOptions,
) -> Result<(), RestoreError> {
    if options.dry_run || !retention.is_zero() || store.journal_marker().await?.is_none() {
        return Ok(());
    }
    Err(RestoreError::Unsafe(
        "records.retention is 0s, so Redis keeps no record of what it delivered, and a \
         message delivered but not yet journaled would be sent again: restore only after \
         Redis lost its data (the leader then holds forwarding), or with a retention"
            .to_owned(),
    ))
}

/// Longest wait for one of the journal's answers (a page of 5000 rows, the marker):
/// a MySQL that takes the connection but never answers (hung, stopped) fails the
/// restore, which can be run again, rather than hold it without end.
const JOURNAL_ANSWER: Duration = Duration::from_secs(10);
/// Longest wait for the count of unfinished messages, which only the progress
/// shows: without it the total is what was read so far.
const JOURNAL_COUNT: Duration = Duration::from_secs(5);

/// `read`, failed when the journal does not answer within `JOURNAL_ANSWER`.
pub async fn answered<T>(
    read: impl std::future::Future<Output = crate::journal::Result<T>>,
) -> Result<T, RestoreError> {
    match tokio::time::timeout(JOURNAL_ANSWER, read).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(RestoreError::Journal(JournalError::Mysql(format!(
            "no answer within {}s",
            JOURNAL_ANSWER.as_secs()
        )))),
    }
}

/// Restores per `options`; `progress(done, total)` after each page.
pub async fn restore(
    store: &Store,
    journal: &Journal,
    options: &RestoreOptions,
    max_delay: Duration,
    progress: &(dyn Fn(u64, u64) + Send + Sync),
) -> Result<RestoreReport, RestoreError> {
    let mut report = RestoreReport {
        dry_run: options.dry_run,
        ..RestoreReport::default()
    };
    let began = store.now_ms().await?;
    let mut restored = Restored::new();
    if let Some(id) = &options.id {
        let messages = answered(journal.unfinished_by_id(id)).await?;
        let page = restore_page(store.clone(), messages, began, options.clone(), max_delay);
        let (page, copies) = page.await?;
        report.add(&page);
        settle(
            store,
            journal,
            began,
            &copies,
            options,
            max_delay,
            &mut report,
        )
        .await?;
        log_restored(journal, &copies, began, options).await?;
        progress(report.journaled, report.journaled);
        return Ok(report);
    }
    // A full restore ends by writing the journal's marker back, which ends a hold
    // on forwarding; it begins by writing it provisionally (see `mark_restored`).
    let marking = if options.dry_run {
        None
    } else {
        let token = answered(journal.marker()).await?;
        let begun = store.set_provisional_journal_marker(&token).await?;
        Some((token, begun))
    };
    let total = match tokio::time::timeout(JOURNAL_COUNT, journal.count_unfinished()).await {
        Ok(total) => total?,
        Err(_) => 0,
    };
    let mut after: Option<(u64, String, String)> = None;
    // Pages are read one after the other (each starts where the last ended) and
    // scheduled several at once: the schedule calls are idempotent by id, so
    // their order does not matter.
    let mut in_flight = tokio::task::JoinSet::new();
    let mut failed = None;
    loop {
        let page = answered(journal.unfinished(after.as_ref(), PAGE)).await?;
        let Some(last) = page.last() else { break };
        after = Some((
            last.due.as_ms(),
            last.id.as_str().to_owned(),
            last.stream.clone(),
        ));
        let full = page.len() == PAGE;
        while in_flight.len() >= PAGES_IN_FLIGHT {
            merge(
                in_flight.join_next().await,
                &mut report,
                &mut restored,
                &mut failed,
            );
            progress(report.journaled, total.max(report.journaled));
        }
        if failed.is_some() {
            break;
        }
        in_flight.spawn(restore_page(
            store.clone(),
            page,
            began,
            options.clone(),
            max_delay,
        ));
        if !full {
            break;
        }
    }
    while !in_flight.is_empty() {
        merge(
            in_flight.join_next().await,
            &mut report,
            &mut restored,
            &mut failed,
        );
        progress(report.journaled, total.max(report.journaled));
    }
    if let Some(e) = failed {
        return Err(e);
    }
    settle(
        store,
        journal,
        began,
        &restored,
        options,
        max_delay,
        &mut report,
    )
    .await?;
    // The streams an operator paused, paused again before forwarding resumes
    // (pausing is the safe way: their messages wait).
    let paused = answered(journal.paused()).await?;
    report.streams_paused = paused.len() as u64;
    if !options.dry_run {
        store.pause_streams(&paused).await?;
    }
    log_restored(journal, &restored, began, options).await?;
    report.schedules_restored = restore_schedules(store, journal, options.dry_run).await?;
    crate::metrics::journal_restored(report.restored, options.dry_run);
    if let Some((token, begun)) = marking {
        mark_restored(store, &token, begun).await?;
    }
    Ok(report)
}

/// Writes the journal's marker back after a full restore. The restore began by
/// writing it provisionally (`begun`; None when a final marker was there already,
/// a restore with nothing lost): it is made final only if Redis kept it through
/// the restore. A loss of Redis's data during the restore takes the provisional
/// marker with it, and with it some of what the restore wrote; the marker then
/// stays missing, so that forwarding stays held and the keeper's next check finds
/// the loss, instead of a marker written into an emptied Redis hiding it. A final
/// marker another restore wrote meanwhile is left as it is.
async fn mark_restored(
    store: &Store,
    token: &str,
    begun: Option<String>,
) -> Result<(), RestoreError> {
    let Some(provisional) = begun else {
        store.set_journal_marker(token).await?;
        return Ok(());
    };
    if store.confirm_journal_marker(&provisional, token).await?
        || store.journal_marker().await?.is_some()
    {
        return Ok(());
    }
    Err(RestoreError::Interrupted)
}

/// A "restored" step in the transition log of each message put back, at the time
/// the restore began (Redis's clock).
async fn log_restored(
    journal: &Journal,
    restored: &Restored,
    began: u64,
    options: &RestoreOptions,
) -> Result<(), RestoreError> {
    if options.dry_run || restored.is_empty() {
        return Ok(());
    }
    let messages: Vec<(&str, &str)> = restored
        .keys()
        .map(|(id, stream)| (id.as_str(), stream.as_str()))
        .collect();
    answered(journal.restored(&messages, began, &options.by)).await
}

/// Puts back every schedule the journal holds and Redis does not, made as far as
/// its latest occurrence the journal has a message of (each occurrence is
/// journaled before it is pushed): the leader goes on from the next one, so none
/// is made twice. Returns how many were put back (a dry run: how many the journal
/// holds).
async fn restore_schedules(
    store: &Store,
    journal: &Journal,
    dry_run: bool,
) -> Result<u64, RestoreError> {
    let definitions = answered(journal.schedules()).await?;
    if dry_run {
        return Ok(definitions.len() as u64);
    }
    let mut restored = 0;
    for json in definitions {
        let spec: crate::schedule::ScheduleSpec = match serde_json::from_str(&json) {
            Ok(spec) => spec,
            Err(e) => {
                tracing::warn!(error = %e, "a schedule in the journal is unreadable; left out");
                continue;
            }
        };
        let made = match spec.validate(|_| Ok(())) {
            Ok(when) => answered(journal.last_occurrence(&spec.id))
                .await?
                .map(|last| crate::store::ScheduleState {
                    next: when.next_after(last).unwrap_or(i64::MAX),
                    last: Some(last),
                    missed: 0,
                }),
            Err(_) => None,
        };
        if store.restore_schedule(&spec, made).await? {
            tracing::info!(schedule = spec.id, last = ?made.and_then(|m| m.last), "schedule restored from the journal");
            restored += 1;
        }
    }
    Ok(restored)
}

/// A page's outcome, as its task ends.
type PageDone =
    Option<Result<Result<(RestoreReport, Restored), RestoreError>, tokio::task::JoinError>>;

/// Adds a page's counts to `report` and its copies to `restored`, or keeps its
/// error (the first one).
fn merge(
    joined: PageDone,
    report: &mut RestoreReport,
    restored: &mut Restored,
    failed: &mut Option<RestoreError>,
) {
    match joined {
        Some(Ok(Ok((page, copies)))) => {
            report.add(&page);
            restored.extend(copies);
        }
        Some(Ok(Err(e))) => {
            failed.get_or_insert(e);
        }
        Some(Err(e)) => {
            failed.get_or_insert(RestoreError::Store(StoreError::Reply(format!(
                "a restore task ended: {e}"
            ))));
        }
        None => {}
    }
}

impl RestoreReport {
    fn add(&mut self, page: &RestoreReport) {
        self.journaled += page.journaled;
        self.restored += page.restored;
        self.already_present += page.already_present;
        self.finished_in_redis += page.finished_in_redis;
        self.overdue += page.overdue;
        self.possibly_duplicate += page.possibly_duplicate;
        self.refused += page.refused;
        self.settled += page.settled;
    }
}

/// The copies a restore scheduled: (id, stream) → the due time it scheduled it at
/// (a journal keeps a row per id and stream: an id moved to another stream leaves
/// its old row finished).
type Restored = HashMap<(String, String), u64>;

/// One page's counts, and the copies it scheduled.
async fn restore_page(
    store: Store,
    page: Vec<NewMessage>,
    began: u64,
    options: RestoreOptions,
    max_delay: Duration,
) -> Result<(RestoreReport, Restored), RestoreError> {
    let mut restored = Restored::new();
    let mut report = RestoreReport::default();
    let report = &mut report;
    report.journaled += page.len() as u64;
    let mut wanted = Vec::with_capacity(page.len());
    // Due by the time the loss was seen: perhaps delivered before it.
    let sent_by = options.lost_seen_ms.map_or(began, |seen| seen.min(began));
    for msg in page {
        if msg.due.as_ms() <= began && !options.include_overdue {
            report.overdue += 1;
        } else {
            let maybe_sent = msg.due.as_ms() <= sent_by;
            wanted.push((msg, maybe_sent));
        }
    }
    if options.dry_run {
        let found = store.statuses(wanted.iter().map(|(msg, _)| &msg.id)).await;
        for ((_, maybe_sent), status) in wanted.iter().zip(found) {
            match status? {
                Status::Scheduled(_) | Status::Corrupt(_) => report.already_present += 1,
                Status::Done(_) => report.finished_in_redis += 1,
                Status::Unknown => {
                    report.restored += 1;
                    report.possibly_duplicate += u64::from(*maybe_sent);
                }
            }
        }
        return Ok((std::mem::take(report), restored));
    }
    let items: Vec<BatchItem> = wanted
        .iter()
        .map(|(msg, _)| BatchItem::new(msg.clone()))
        .collect();
    let outcomes = store.schedule_many(&items, max_delay, None).await;
    for ((msg, maybe_sent), outcome) in wanted.iter().zip(outcomes) {
        match outcome {
            Ok(Scheduled::Scheduled { .. } | Scheduled::Replaced { .. }) => {
                report.restored += 1;
                report.possibly_duplicate += u64::from(*maybe_sent);
                restored.insert(
                    (msg.id.as_str().to_owned(), msg.stream.clone()),
                    msg.due.as_ms(),
                );
            }
            Ok(Scheduled::Duplicate { state, .. }) if state == "scheduled" => {
                report.already_present += 1
            }
            Ok(Scheduled::Duplicate { .. }) => report.finished_in_redis += 1,
            // Stored on the master, not yet confirmed by replicas: restored all the
            // same. The journal still holds it, and the marker, written after the
            // restore on the same master, reaches a replica only after it: a
            // failover that loses the message loses the marker too, and the next
            // leader restores again. Waiting for replicas here would hold
            // forwarding for as long as none is in sync.
            Err(StoreError::NotReplicated { .. }) => {
                report.restored += 1;
                report.possibly_duplicate += u64::from(*maybe_sent);
                restored.insert(
                    (msg.id.as_str().to_owned(), msg.stream.clone()),
                    msg.due.as_ms(),
                );
            }
            Err(StoreError::TooFar { .. } | StoreError::BadStream(_)) => report.refused += 1,
            Err(e) => return Err(e.into()),
        }
    }
    Ok((std::mem::take(report), restored))
}

/// Margin on the change window for reading it on two clocks: Redis's here, the
/// answering node's monotonic clock there.
const SETTLE_MARGIN: Duration = Duration::from_millis(250);

/// The changes answered around the loss, read again once they are all in. A
/// cancel, reschedule or dead-letter replay that Redis made just before it lost
/// its data, and that the journal took only after the pages above were read,
/// would be undone by the restore (the message back, or at its old time) or lost
/// (a replayed dead letter the journal still had as dead). Every change answered
/// as journaled is in the journal within the change window of being sent to
/// Redis (`api::durable`), so once Redis's clock is that far past `began`, the
/// journal's rows last changed (by Redis's clock) from `began` less the window
/// to `began` hold every such change: a copy this restore scheduled is cancelled
/// or moved to match its row, and a row scheduled that Redis knows nothing of is
/// scheduled (by id; overdue ones only as the options say), counted in
/// `restored` and `possibly_duplicate` as the pages' are.
///
/// Changes made after `began` went to Redis as it is now, but one can still race
/// a page: a page read before a cancel (or reschedule) and scheduled after it puts
/// the message back (Redis takes a cancelled id pushed again as new) or at its old
/// time. So the rows changed from `began` until the pages were all scheduled are
/// read too, once the change window has passed that point: a copy Redis still
/// holds as this restore made it is cancelled or moved to match. A copy changed in
/// Redis since the restore made it is left as it is, and rows of messages this
/// restore did not schedule are not looked at.
async fn settle(
    store: &Store,
    journal: &Journal,
    began: u64,
    restored: &Restored,
    options: &RestoreOptions,
    max_delay: Duration,
    report: &mut RestoreReport,
) -> Result<(), RestoreError> {
    if options.dry_run {
        return Ok(());
    }
    let sent_by = options.lost_seen_ms.map_or(began, |seen| seen.min(began));
    let window = crate::journal::change_window(store.replicas_wait()) + SETTLE_MARGIN;
    let window_ms = window.as_millis() as u64;
    // Every page is scheduled by now.
    let mut now = store.now_ms().await?;
    let scheduled_by = now.max(began);
    while now < scheduled_by + window_ms {
        tokio::time::sleep(Duration::from_millis(scheduled_by + window_ms - now)).await;
        now = store.now_ms().await?;
    }
    let before = answered(journal.changed_between(began.saturating_sub(window_ms), began)).await?;
    let during = answered(journal.changed_between(began, scheduled_by)).await?;
    let rows = before
        .into_iter()
        .map(|row| (row, false))
        .chain(during.into_iter().map(|row| (row, true)));
    for (row, after_began) in rows {
        let copy = restored.get(&(row.id.clone(), row.stream.clone())).copied();
        if after_began && copy.is_none() {
            continue;
        }
        // Redis holds the very copy this restore made: same stream, same due time.
        let ours = async |id: &MessageId| -> Result<bool, RestoreError> {
            Ok(match store.get(id).await? {
                Status::Scheduled(held) => held.stream == row.stream && Some(held.due_ms) == copy,
                _ => false,
            })
        };
        let Ok(id) = MessageId::parse(&row.id) else {
            continue;
        };
        match (row.state, row.scheduled) {
            (State::Scheduled, Some(msg)) if copy.is_none() => {
                let other = options.id.as_ref().is_some_and(|only| *only != id);
                let overdue = msg.due.as_ms() <= began && !options.include_overdue;
                if other || overdue || !matches!(store.get(&id).await?, Status::Unknown) {
                    continue;
                }
                let maybe_sent = msg.due.as_ms() <= sent_by;
                let item = BatchItem::new(msg);
                let scheduled = store.schedule_many(&[item], max_delay, None).await;
                if let Some(Ok(Scheduled::Scheduled { .. } | Scheduled::Replaced { .. })) =
                    scheduled.into_iter().next()
                {
                    tracing::info!(%id, "restore: scheduled, as the journal has it since");
                    report.settled += 1;
                    report.restored += 1;
                    report.possibly_duplicate += u64::from(maybe_sent);
                }
            }
            (State::Scheduled, _) => {
                if copy != Some(row.due_ms) && ours(&id).await? {
                    store
                        .reschedule(&id, Due::At(row.due_ms), max_delay)
                        .await?;
                    tracing::info!(%id, due_ms = row.due_ms, "restore: moved, as the journal has it since");
                    report.settled += 1;
                }
            }
            _ => {
                if copy.is_some() && ours(&id).await? {
                    let cancelled = store.cancel(&id, options.records_retention).await?;
                    tracing::info!(%id, ?cancelled, "restore: cancelled, as the journal has it since");
                    report.settled += u64::from(cancelled == Cancelled::Cancelled);
                }
            }
        }
    }
    Ok(())
}

//! How the daemon takes a push: into the journal first (`[journal]` on), then into
//! Redis. A push is confirmed only once both have it; the journal's group commit
//! lets concurrent pushes share one transaction. With the journal on, Redis's time
//! is read first: it stamps the journal's rows, and a relative delay is made an
//! absolute due time from it for both, so that the two agree on it.
//!
//! Partial failures, and how each converges:
//! - the journal refuses or does not answer in time: nothing was stored, the push
//!   fails with `NotJournaled` (503, or the inbox entry is read again);
//! - the journal has it, Redis then fails: the push fails (503) as without a
//!   journal; a retry with the same id is a duplicate in both. Not retried, the
//!   message may still be delivered, once: the keeper's reconciliation finds it
//!   scheduled in the journal, past due and unknown to Redis, and schedules it;
//! - Redis refuses it for good (a due time too far, a stream it cannot hold): the
//!   journal's row is discarded;
//! - Redis answers it as a duplicate of a message of another stream (one Redis): the
//!   row the push wrote for its own stream is removed.

use std::time::Duration;

use crate::journal::{Came, Committer, Journal};
use crate::message::{Due, NewMessage};
use crate::store::{BatchItem, InboxAck, Result, ScheduleMode, Scheduled, Store, StoreError};

/// The store, and the journal's committer while the journal is on. Cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    store: Store,
    journal: Option<Committer>,
}

impl Ingest {
    pub fn new(store: Store, journal: Option<Committer>) -> Ingest {
        Ingest { store, journal }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The journal, while it is on.
    pub fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref().map(Committer::journal)
    }

    /// [`Store::schedule`], journaled first (`came`: how, for its transition log).
    pub async fn schedule(
        &self,
        msg: &NewMessage,
        mode: ScheduleMode,
        max_delay: Duration,
        came: &Came,
    ) -> Result<Scheduled> {
        let Some(journal) = &self.journal else {
            return self.store.schedule(msg, mode, max_delay).await;
        };
        let at = self.store.now_ms().await?;
        let msg = &NewMessage {
            due: absolute(msg.due, at),
            ..msg.clone()
        };
        journal
            .scheduled(&[(msg, mode == ScheduleMode::Replace)], at, came)
            .await
            .map_err(|e| StoreError::NotJournaled(e.to_string()))?;
        let outcome = self.store.schedule(msg, mode, max_delay).await;
        if is_refusal(&outcome) {
            self.forget(vec![(msg.clone(), at)], Forget::Refused);
        } else if is_duplicate(&outcome) {
            self.forget(vec![(msg.clone(), at)], Forget::Duplicate);
        }
        outcome
    }

    /// [`Store::schedule_many`], journaled first: if the journal does not take the
    /// batch, no message of it is stored.
    pub async fn schedule_many(
        &self,
        items: &[BatchItem],
        max_delay: Duration,
        ack: Option<InboxAck<'_>>,
        came: &Came,
    ) -> Vec<Result<Scheduled>> {
        let Some(journal) = &self.journal else {
            return self.store.schedule_many(items, max_delay, ack).await;
        };
        let at = match self.store.now_ms().await {
            Ok(at) => at,
            Err(e) => return items.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut items = items.to_vec();
        for item in &mut items {
            item.msg.due = absolute(item.msg.due, at);
        }
        let rows: Vec<(&NewMessage, bool)> = items
            .iter()
            .map(|i| (&i.msg, i.mode == ScheduleMode::Replace))
            .collect();
        if let Err(e) = journal.scheduled(&rows, at, came).await {
            let e = StoreError::NotJournaled(e.to_string());
            return items.iter().map(|_| Err(e.clone())).collect();
        }
        let outcomes = self.store.schedule_many(&items, max_delay, ack).await;
        for (why, answered) in [
            (
                Forget::Refused,
                is_refusal as fn(&Result<Scheduled>) -> bool,
            ),
            (Forget::Duplicate, is_duplicate),
        ] {
            let rows: Vec<(NewMessage, u64)> = items
                .iter()
                .zip(&outcomes)
                .filter(|(_, o)| answered(o))
                .map(|(i, _)| (i.msg.clone(), at))
                .collect();
            if !rows.is_empty() {
                self.forget(rows, why);
            }
        }
        outcomes
    }

    /// Removes the journal's rows of pushes Redis refused for good (a row left
    /// behind is scheduled by nobody: restore and reconciliation meet the same
    /// refusal), or answered as duplicates of a message of another stream (see
    /// `Journal::retire_duplicates`), in the background.
    fn forget(&self, rows: Vec<(NewMessage, u64)>, why: Forget) {
        let Some(journal) = self.journal() else {
            return;
        };
        let journal = journal.clone();
        tokio::spawn(async move {
            let rows: Vec<(&NewMessage, u64)> = rows.iter().map(|(m, at)| (m, *at)).collect();
            let done = match why {
                Forget::Refused => journal.discard(&rows).await,
                Forget::Duplicate => journal.retire_duplicates(&rows).await,
            };
            if let Err(e) = done {
                tracing::warn!(error = %e, messages = rows.len(), ?why, "cannot remove pushes' rows from the journal");
            }
        });
    }
}

/// Why the journal's rows of pushes are removed after Redis answered them.
#[derive(Clone, Copy, Debug)]
enum Forget {
    Refused,
    Duplicate,
}

/// A due time made absolute, a relative delay counted from `now_ms` (Redis's time
/// read before the journal takes the push), so that the journal and Redis hold the
/// same due time however long the journal's commit took.
fn absolute(due: Due, now_ms: u64) -> Due {
    match due {
        Due::In(delay) => Due::At(now_ms.saturating_add(delay.as_millis() as u64)),
        at => at,
    }
}

/// Whether Redis answered a push as a duplicate of a message it holds.
fn is_duplicate(outcome: &Result<Scheduled>) -> bool {
    matches!(outcome, Ok(Scheduled::Duplicate { .. }))
}

/// Whether Redis refused a push for good (the same push is refused again).
fn is_refusal(outcome: &Result<Scheduled>) -> bool {
    matches!(
        outcome,
        Err(StoreError::TooFar { .. } | StoreError::BadStream(_))
    )
}

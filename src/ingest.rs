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
//!   journal's row is discarded.

use std::time::Duration;

use crate::journal::{Committer, Journal};
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

    /// [`Store::schedule`], journaled first.
    pub async fn schedule(
        &self,
        msg: &NewMessage,
        mode: ScheduleMode,
        max_delay: Duration,
    ) -> Result<Scheduled> {
        let Some(journal) = &self.journal else {
            return self.store.schedule(msg, mode, max_delay).await;
        };
        let at = self.store.now_ms().await?;
        let msg = &due_from(msg, at);
        journal
            .scheduled(&[(msg, mode == ScheduleMode::Replace)], at)
            .await
            .map_err(|e| StoreError::NotJournaled(e.to_string()))?;
        let outcome = self.store.schedule(msg, mode, max_delay).await;
        if is_refusal(&outcome) {
            self.discard(vec![(msg.clone(), at)]);
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
    ) -> Vec<Result<Scheduled>> {
        let Some(journal) = &self.journal else {
            return self.store.schedule_many(items, max_delay, ack).await;
        };
        let at = match self.store.now_ms().await {
            Ok(at) => at,
            Err(e) => return items.iter().map(|_| Err(e.clone())).collect(),
        };
        let items: Vec<BatchItem> = items
            .iter()
            .map(|i| BatchItem {
                msg: due_from(&i.msg, at),
                ..i.clone()
            })
            .collect();
        let rows: Vec<(&NewMessage, bool)> = items
            .iter()
            .map(|i| (&i.msg, i.mode == ScheduleMode::Replace))
            .collect();
        if let Err(e) = journal.scheduled(&rows, at).await {
            let e = StoreError::NotJournaled(e.to_string());
            return items.iter().map(|_| Err(e.clone())).collect();
        }
        let outcomes = self.store.schedule_many(&items, max_delay, ack).await;
        let refused: Vec<(NewMessage, u64)> = items
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| is_refusal(o))
            .map(|(i, _)| (i.msg.clone(), at))
            .collect();
        if !refused.is_empty() {
            self.discard(refused);
        }
        outcomes
    }

    /// Removes the journal's rows of pushes Redis refused for good, in the
    /// background (a row left behind is scheduled by nobody: restore and
    /// reconciliation meet the same refusal).
    fn discard(&self, refused: Vec<(NewMessage, u64)>) {
        let Some(journal) = self.journal() else {
            return;
        };
        let journal = journal.clone();
        tokio::spawn(async move {
            let rows: Vec<(&NewMessage, u64)> = refused.iter().map(|(m, at)| (m, *at)).collect();
            if let Err(e) = journal.discard(&rows).await {
                tracing::warn!(error = %e, messages = rows.len(), "cannot discard refused pushes from the journal");
            }
        });
    }
}

/// `msg` due at an absolute time, a relative delay counted from `now_ms` (Redis's
/// time read before the journal takes it), so that the journal and Redis hold the
/// same due time however long the journal's commit took.
fn due_from(msg: &NewMessage, now_ms: u64) -> NewMessage {
    let due = match msg.due {
        Due::In(delay) => Due::At(now_ms.saturating_add(delay.as_millis() as u64)),
        at => at,
    };
    NewMessage { due, ..msg.clone() }
}

/// Whether Redis refused a push for good (the same push is refused again).
fn is_refusal(outcome: &Result<Scheduled>) -> bool {
    matches!(
        outcome,
        Err(StoreError::TooFar { .. } | StoreError::BadStream(_))
    )
}

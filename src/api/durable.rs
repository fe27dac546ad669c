//! Changes Redis made that are told to the journal before they are answered (a
//! cancel, a reschedule, a replay, a pause or resume), so that neither a push of
//! the same id sent after the answer nor a restore after a loss of Redis's data
//! meets the journal as it was. Bounded, and never failing the change: Redis made
//! it, and the outbox (or, for a pause, the next change) carries it to the journal
//! regardless. The answer says when the journal did not take it in time.

use std::future::Future;
use std::time::Duration;

use crate::journal::{Journal, Result};
use crate::store::OutboxLine;

/// Longest a change's answer waits for the journal (MySQL hung).
pub const JOURNAL_CHANGE_WAIT: Duration = Duration::from_secs(1);

/// Whether `write` told the journal in time (and, where it says, that the journal
/// now holds the change as it must).
pub async fn journaled(write: impl Future<Output = Result<bool>>) -> bool {
    match tokio::time::timeout(JOURNAL_CHANGE_WAIT, write).await {
        Ok(Ok(taken)) => taken,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "a change answered before the journal took it");
            false
        }
        Err(_) => {
            tracing::warn!("a change answered before the journal took it (no commit within 1s)");
            false
        }
    }
}

/// [`journaled`] for an outbox line of the change (copied again later, harmlessly).
pub async fn journaled_line(journal: &Journal, line: OutboxLine) -> bool {
    journaled(async { journal.apply(&[line]).await.map(|()| true) }).await
}

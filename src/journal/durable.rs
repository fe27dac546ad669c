//! Changes Redis made that are told to the journal before they are answered (a
//! cancel, a reschedule, a replay, a pause or resume), so that neither a push of
//! the same id sent after the answer nor a restore after a loss of Redis's data
//! meets the journal as it was. Bounded, and never failing the change: Redis made
//! it, and the outbox (or, for a pause, the next change) carries it to the journal
//! regardless. The answer says when the journal did not take it in time.
//!
//! "In time" is counted from before the change was sent to Redis (`sent`), with
//! the replicas' wait on top: a change answered as journaled is in the journal
//! within [`crate::journal::change_window`] of reaching Redis, and a restore after
//! a loss of Redis's data waits that long before it reads the journal's latest
//! changes (see `restore::settle`).

use std::future::Future;
use std::time::Instant;

use super::{Journal, Result, Who, change_window};
use crate::store::{OutboxLine, Store};

/// Whether `write` told the journal in time (and, where it says, that the journal
/// now holds the change as it must): within the change window of `sent`, the
/// moment the change was sent to Redis.
pub async fn journaled(
    store: &Store,
    sent: Instant,
    write: impl Future<Output = Result<bool>>,
) -> bool {
    let deadline = sent + change_window(store.replicas_wait());
    match tokio::time::timeout_at(deadline.into(), write).await {
        Ok(Ok(taken)) => taken,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "a change answered before the journal took it");
            false
        }
        Err(_) => {
            tracing::warn!("a change answered before the journal took it (no commit in time)");
            false
        }
    }
}

/// [`journaled`] for an outbox line of the change `who` made (copied again later,
/// harmlessly: the copy fills in the shard).
pub async fn journaled_line(
    store: &Store,
    sent: Instant,
    journal: &Journal,
    line: OutboxLine,
    who: &Who,
) -> bool {
    journaled(store, sent, async {
        journal.apply_as(&[line], who).await.map(|()| true)
    })
    .await
}

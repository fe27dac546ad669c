//! Transactions InnoDB ends as a deadlock's victim, run again. A deadlock (error
//! 1213) rolls the victim's whole transaction back, so running it again from the
//! start is safe, and it then waits for the locks of the transaction that won.
//! Pushes write their rows in the order they came and the outbox's copies lock
//! rows in key order, so two of them touching the same rows at once can meet so;
//! without this, that push would answer 503 `journal_unavailable`.

use std::future::Future;

use super::{JournalError, Result};

/// How many times a transaction is run in all while it ends as a deadlock's victim.
const TRIES: u32 = 4;

/// MySQL's and MariaDB's error for a deadlock's victim (`ER_LOCK_DEADLOCK`).
pub(super) const DEADLOCK: u16 = 1213;

/// Runs `work` (one whole transaction) until it ends other than as a deadlock's
/// victim, [`TRIES`] times at most; `op` names it in the log and the metric
/// (`push` or `copy`).
pub(super) async fn retried<T, F, Fut>(op: &'static str, mut work: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut tries = 1;
    loop {
        match work().await {
            Err(JournalError::Deadlock(e)) if tries < TRIES => {
                tries += 1;
                metrics::counter!(crate::metrics::JOURNAL_DEADLOCKS, "op" => op).increment(1);
                tracing::info!(error = %e, op, tries, "a journal transaction was a deadlock's victim: run again");
            }
            done => return done,
        }
    }
}

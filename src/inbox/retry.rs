//! The wait between two tries of the same entries or read, after a transient error.

use super::*;

impl Worker {
    /// Counts and logs a failed try of `what` (said once for the condition, see
    /// `complaint`), then waits out `backoff`'s next delay; the error back, to end
    /// the try, when `cancel` comes first.
    pub(super) async fn wait_to_retry(
        &self,
        backoff: &mut Backoff,
        error: StoreError,
        what: &str,
        cancel: &CancellationToken,
    ) -> Result<(), StoreError> {
        metrics::counter!(m::INBOX_ERRORS).increment(1);
        let delay = backoff.next_delay();
        if let Some(said) = BATCH_FAILED.failed() {
            tracing::warn!(error = %error, retrying = what, retry_in = ?delay, inbox = %self.queue.stream, "{said}");
        }
        tokio::select! {
            _ = cancel.cancelled() => Err(error),
            _ = tokio::time::sleep(delay) => Ok(()),
        }
    }
}

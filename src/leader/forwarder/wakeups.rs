//! Wake-ups: the schedule script's announcements that a shard's earliest due time
//! moved earlier, turned into a notification of that shard's loop.

use super::*;

pub(super) static WAKEUPS_LOST: Complaint = Complaint::new(
    "cannot subscribe to wake-ups; forwarding on timers until it works",
    "subscribed to wake-ups again",
);

/// Turns the schedule script's announcements into per-shard wake-ups. After every
/// (re)subscription all shards are woken, since announcements may have been missed.
pub(super) async fn dispatch_wakeups(
    store: Store,
    wakers: Arc<Vec<Notify>>,
    cancel: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    while !cancel.is_cancelled() {
        match store.wakeups().await {
            Ok(mut wakeups) => {
                backoff.reset();
                if let Some(said) = WAKEUPS_LOST.recovered() {
                    tracing::info!("{said}");
                }
                wakers.iter().for_each(Notify::notify_one);
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        shard = wakeups.next() => match shard {
                            Some(shard) => {
                                if let Some(w) = wakers.get(shard as usize) { w.notify_one() }
                                if store.is_cluster() {
                                    discover_waker(&wakers).notify_one();
                                }
                            }
                            None => break,
                        }
                    }
                }
                if let Some(said) = WAKEUPS_LOST.failed() {
                    tracing::warn!(error = %"the subscription was lost", "{said}");
                }
            }
            Err(e) => {
                if let Some(said) = WAKEUPS_LOST.failed() {
                    tracing::warn!(error = %e, "{said}");
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

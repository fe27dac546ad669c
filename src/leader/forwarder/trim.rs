//! Trimming delivery records past their retention, every `records.trim_interval`.

use super::*;

pub(super) static TRIM_FAILED: Complaint = Complaint::across(
    "shard",
    "trimming records failed; next round will retry",
    "trimming records works again",
);

/// Forgets delivery, expiry and cancellation records past their retention.
pub(super) async fn trim_records(store: Store, term: Term, every: Duration) {
    const LIMIT: usize = 1000;
    loop {
        tokio::select! {
            _ = term.ended() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let shards = match store.owned_in_use().await {
            Ok(shards) => shards,
            Err(e) => {
                if let Some(said) = TRIM_FAILED.failed() {
                    tracing::warn!(error = %e, "{said}");
                }
                continue;
            }
        };
        let mut failed = false;
        for shard in shards {
            loop {
                if term.is_over() {
                    return;
                }
                match store.trim_records(shard, term.epoch(), LIMIT).await {
                    Ok(trimmed) => {
                        metrics::counter!(m::RECORDS_TRIMMED).increment(trimmed.forgotten);
                        // Again while records, finished lists or the key index had
                        // more to drop than one call takes.
                        if (trimmed.looked_at as usize) < LIMIT
                            && !trimmed.more_to_unlist
                            && trimmed.keys_pruned == 0
                        {
                            break;
                        }
                    }
                    Err(StoreError::Fenced { held, .. }) => return term.fenced("trimming", held),
                    Err(e) => {
                        failed = true;
                        if let Some(said) = TRIM_FAILED.failed_on(shard.into()) {
                            tracing::warn!(shard, error = %e, "{said}");
                        }
                        break;
                    }
                }
            }
        }
        if !failed && let Some(said) = TRIM_FAILED.recovered() {
            tracing::info!("{said}");
        }
    }
}

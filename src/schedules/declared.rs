//! Schedules declared in the configuration file (`[[schedules]]`), reconciled
//! into Redis at start and whenever a reload (SIGHUP) changes the list: each
//! declared one added, or changed where it differs (made afresh from then on),
//! and every declared one no longer listed deleted. Every node does it with its
//! own file, so the nodes' lists should agree; the last node to start or reload
//! decides. The API shows declared schedules and refuses to change them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::journal::Journal;
use crate::schedule::ScheduleSpec;
use crate::store::{Store, StoreError};

/// What one reconcile did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    pub added: usize,
    pub changed: usize,
    pub deleted: usize,
}

/// Reconciles the running configuration's declared schedules now and after every
/// reload that changes them, retrying with a backoff while Redis fails, until
/// `cancel`.
pub async fn run(
    mut live: watch::Receiver<Arc<Config>>,
    store: Store,
    journal: Option<Journal>,
    cancel: CancellationToken,
) {
    let mut done: Option<Vec<ScheduleSpec>> = None;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let declared = live.borrow_and_update().schedules.clone();
        if done.as_ref() != Some(&declared) {
            match reconcile(&store, journal.as_ref(), &declared).await {
                Ok(did) => {
                    if did != Reconciled::default() {
                        tracing::info!(
                            declared = declared.len(),
                            added = did.added,
                            changed = did.changed,
                            deleted = did.deleted,
                            "declared schedules reconciled"
                        );
                    }
                    done = Some(declared);
                    backoff.reset();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconciling the declared schedules failed; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => continue,
                    }
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = live.changed() => if changed.is_err() { return },
        }
    }
}

/// Makes Redis hold exactly `declared` among its declared schedules.
pub async fn reconcile(
    store: &Store,
    journal: Option<&Journal>,
    declared: &[ScheduleSpec],
) -> Result<Reconciled, StoreError> {
    let stored = store.schedule_specs().await?;
    let now = store.now_ms().await?;
    let mut did = Reconciled::default();
    for wanted in declared {
        let found = stored.iter().map(|(s, _)| s).find(|s| s.id == wanted.id);
        if found.is_some_and(|s| same(s, wanted)) {
            continue;
        }
        if found.is_some_and(|s| !s.declared) {
            tracing::warn!(
                schedule = wanted.id,
                "a declared schedule replaces the one of its id made through the API"
            );
        }
        let spec = ScheduleSpec {
            created_at: found.filter(|s| s.declared).map_or(now, |s| s.created_at),
            since: now,
            ..wanted.clone()
        };
        // A new one only if no node added it meanwhile (two nodes starting at
        // once): the first one's stays, with its creation time.
        let written = match found {
            Some(_) => super::put(store, journal, &spec).await?,
            None => super::add(store, journal, &spec).await?,
        };
        if let Err(e) = written.replicated {
            tracing::warn!(schedule = spec.id, error = %e, "a declared schedule stored, not yet confirmed by replicas");
        }
        match (found, written.changed) {
            (Some(_), _) => did.changed += 1,
            (None, true) => did.added += 1,
            (None, false) => {}
        }
    }
    for (gone, _) in stored
        .iter()
        .filter(|(s, _)| s.declared && !declared.iter().any(|d| d.id == s.id))
    {
        super::delete(store, journal, &gone.id).await?;
        tracing::info!(
            schedule = gone.id,
            "declared schedule no longer declared: deleted"
        );
        did.deleted += 1;
    }
    Ok(did)
}

/// Whether two schedules are the same definition, whenever each was stored.
fn same(a: &ScheduleSpec, b: &ScheduleSpec) -> bool {
    let bare = |s: &ScheduleSpec| ScheduleSpec {
        created_at: 0,
        since: 0,
        ..s.clone()
    };
    bare(a) == bare(b)
}

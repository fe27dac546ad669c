//! A schedule's definition changed: in Redis first (with `redis.min_replicas_acked`,
//! confirmed by that many replicas), then in the journal within the change window,
//! so that a restore after Redis lost its data puts back what was answered.

use std::time::Instant;

use crate::journal::{Journal, durable};
use crate::schedule::ScheduleSpec;
use crate::store::{ScheduleChanged, Store, StoreError};

/// What a change did: whether it changed anything (a new schedule, one deleted),
/// whether the journal did not take it in time, and whether enough replicas
/// confirmed it (made either way).
#[derive(Debug)]
pub struct Written {
    pub changed: bool,
    pub not_journaled: bool,
    pub replicated: Result<(), StoreError>,
}

/// Stores `spec` (new, or changed: made afresh from its `since`).
pub async fn put(
    store: &Store,
    journal: Option<&Journal>,
    spec: &ScheduleSpec,
) -> Result<Written, StoreError> {
    let sent = Instant::now();
    let made = store.put_schedule(spec).await?;
    Ok(written(store, journal, sent, &spec.id, Some(spec), made).await)
}

/// Stores `spec` only if no schedule of its id exists (`changed` false, and
/// nothing written nor journaled, when one does).
pub async fn add(
    store: &Store,
    journal: Option<&Journal>,
    spec: &ScheduleSpec,
) -> Result<Written, StoreError> {
    let sent = Instant::now();
    let made = store.add_schedule(spec).await?;
    if !made.changed {
        return Ok(Written {
            changed: false,
            not_journaled: false,
            replicated: made.replicated,
        });
    }
    Ok(written(store, journal, sent, &spec.id, Some(spec), made).await)
}

/// Deletes schedule `id` (its messages already made stay scheduled).
pub async fn delete(
    store: &Store,
    journal: Option<&Journal>,
    id: &str,
) -> Result<Written, StoreError> {
    let sent = Instant::now();
    let gone = store.delete_schedule(id).await?;
    Ok(written(store, journal, sent, id, None, gone).await)
}

/// What a change `made` in Redis at `sent` did, once the journal (when on) took
/// `id`'s definition (`spec`; None: deleted) or the change window passed.
async fn written(
    store: &Store,
    journal: Option<&Journal>,
    sent: Instant,
    id: &str,
    spec: Option<&ScheduleSpec>,
    made: ScheduleChanged,
) -> Written {
    let json = spec.map(|s| serde_json::to_string(s).expect("a schedule serializes"));
    Written {
        changed: made.changed,
        not_journaled: !journaled(store, journal, sent, id, json.as_deref(), made.at_ms).await,
        replicated: made.replicated,
    }
}

/// Whether the journal (when on) took `id`'s definition (None: deleted) within the
/// change window of `sent`.
async fn journaled(
    store: &Store,
    journal: Option<&Journal>,
    sent: Instant,
    id: &str,
    definition: Option<&str>,
    at_ms: u64,
) -> bool {
    let Some(journal) = journal else {
        return true;
    };
    let write = async {
        journal
            .set_schedule(id, definition, at_ms)
            .await
            .map(|()| true)
    };
    durable::journaled(store, sent, write).await
}

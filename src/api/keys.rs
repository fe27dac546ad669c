//! `/v1/streams/{stream}/keys/{key}`: the messages a producer pushed to a stream
//! with one business key, listed (pending first, then those finished while their
//! records are kept) or cancelled together.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::input::{StrictQuery, blank_as_none, page_limit};
use super::reach::Reach;
use super::streams::checked_stream;
use super::{ApiError, AppState, ErrorBody};
use crate::journal::durable;
use crate::message::MessageKey;
use crate::metrics as m;
use crate::store::{KeyedMessage, KeyedState, OutboxCode, OutboxLine};

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 10_000;

/// The stream and the business key named in the path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct KeyPath {
    /// The target stream; must match `streams.allow`.
    pub stream: String,
    /// The business key the messages were pushed with.
    #[param(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub key: String,
}

/// A page of a key's messages.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct KeyQuery {
    /// Start after this place (the `next` of the page before).
    #[serde(default, deserialize_with = "blank_as_none")]
    after: Option<String>,
    /// At most this many messages: 1 to 10000 (default 100).
    #[param(minimum = 1, maximum = 10000)]
    #[serde(default, deserialize_with = "blank_as_none")]
    limit: Option<usize>,
}

/// One message of a key.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyMessage {
    id: String,
    /// `scheduled`, `held` (due, waiting for its stream's rate limit or pause),
    /// `delivered`, `expired`, `dead` or `cancelled`.
    state: String,
    /// Pending: its due time, epoch milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    deliver_at: Option<u64>,
    /// Pending: its priority.
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<u8>,
    /// Finished: when, epoch milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<u64>,
    /// Finished: the stream entry written, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    entry_id: Option<String>,
}

/// A page of a key's messages: pending ones first, soonest due first; then those
/// finished while their records are kept (`records.retention`), latest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyMessages {
    stream: String,
    key: String,
    messages: Vec<KeyMessage>,
    /// The `after` of the next page; null when this one reached the end.
    #[schema(required)]
    next: Option<String>,
}

/// What cancelling a key did.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyCancelAnswer {
    stream: String,
    key: String,
    /// Pending messages cancelled now (0 when a repeated cancel finds none left).
    cancelled: usize,
    /// The key's messages on record as delivered already.
    delivered: u64,
    /// The journal (`[journal]`) did not take the cancellations within 1 s: Redis
    /// has them and the journal gets them when it answers, but a loss of Redis's
    /// data before then would undo them. Repeating the cancel is safe.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    not_journaled: bool,
}

/// A key's messages in a stream
#[utoipa::path(
    get,
    path = "/v1/streams/{stream}/keys/{key}",
    operation_id = "listKey",
    params(KeyPath, KeyQuery),
    responses(
        (status = 200, description = "a page of the key's messages: pending first (soonest due first), then finished while records are kept (latest first); next: cursor or null", body = KeyMessages),
        (status = 400, description = "query cannot be parsed, or names an unknown parameter (bad_query)", body = ErrorBody),
        (status = 403, description = "stream not allowed (stream_not_allowed), or out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 422, description = "a bad key, cursor or limit; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    reach: Reach,
    Path(KeyPath { stream, key }): Path<KeyPath>,
    StrictQuery(query): StrictQuery<KeyQuery>,
) -> Result<Json<KeyMessages>, ApiError> {
    let key = checked(&state, &reach, &stream, &key)?;
    let limit = page_limit(query.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let after = query.after.as_deref().map(Place::parse).transpose()?;
    let found = state.store.key_messages(&stream, &key).await?;
    let (page, next) = Place::page(found, after, limit);
    Ok(Json(KeyMessages {
        stream,
        key: key.as_str().to_owned(),
        messages: page.into_iter().map(shown).collect(),
        next,
    }))
}

/// Cancel every pending message of a key in a stream
#[utoipa::path(
    delete,
    path = "/v1/streams/{stream}/keys/{key}",
    operation_id = "cancelKey",
    params(KeyPath),
    responses(
        (status = 200, description = "the key's pending messages cancelled (one atomic step per shard), with how many had been delivered already; a repeated cancel cancels nothing more", body = KeyCancelAnswer),
        (status = 403, description = "stream not allowed (stream_not_allowed), or out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 422, description = "a bad stream or key; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unreachable, or the replicas did not confirm (redis.min_replicas_acked): repeat it", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn cancel(
    State(state): State<AppState>,
    reach: Reach,
    Path(KeyPath { stream, key }): Path<KeyPath>,
) -> Result<Json<KeyCancelAnswer>, ApiError> {
    let key = checked(&state, &reach, &stream, &key)?;
    let sent = std::time::Instant::now();
    let done = state
        .store
        .cancel_key(&stream, &key, state.config.records.retention)
        .await?;
    metrics::counter!(m::CANCELLED).increment(done.cancelled.len() as u64);
    let mut not_journaled = false;
    if let Some(journal) = state.ingest.journal()
        && !done.cancelled.is_empty()
    {
        let lines: Vec<OutboxLine> = done
            .cancelled
            .iter()
            .map(|(id, at_ms)| OutboxLine {
                code: OutboxCode::Cancelled,
                id: id.clone(),
                at_ms: *at_ms,
                entry: None,
                stream: Some(stream.clone()),
                attempt: None,
            })
            .collect();
        not_journaled = !durable::journaled(&state.store, sent, async {
            let who = crate::journal::Who::api(&state.config.node_id, &reach.who);
            journal.apply_as(&lines, &who).await.map(|()| true)
        })
        .await;
    }
    tracing::info!(%stream, key = key.as_str(), cancelled = done.cancelled.len(), "key cancelled");
    Ok(Json(KeyCancelAnswer {
        stream,
        key: key.as_str().to_owned(),
        cancelled: done.cancelled.len(),
        delivered: done.delivered,
        not_journaled,
    }))
}

/// The path's stream and key, checked: a valid stream the configuration allows and
/// the token reaches, and a valid key.
fn checked(
    state: &AppState,
    reach: &Reach,
    stream: &str,
    key: &str,
) -> Result<MessageKey, ApiError> {
    checked_stream(stream, state, reach)?;
    Ok(MessageKey::parse(key)?)
}

fn shown(m: KeyedMessage) -> KeyMessage {
    let pending = m.state.is_pending();
    KeyMessage {
        id: m.id,
        state: m.state.as_str().to_owned(),
        deliver_at: pending.then_some(m.at_ms),
        priority: m.priority,
        at: (!pending).then_some(m.at_ms),
        entry_id: m.entry_id,
    }
}

/// A message's place in the listing, which is also the page cursor's text:
/// `0.<due ms>.<id>` for a pending message, `1.<ms before u64::MAX>.<id>` for a
/// finished one (latest first).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Place(u8, u64, String);

impl Place {
    pub(super) fn of(m: &KeyedMessage) -> Place {
        match m.state {
            KeyedState::Scheduled | KeyedState::Held => Place(0, m.at_ms, m.id.clone()),
            KeyedState::Done(_) => Place(1, u64::MAX - m.at_ms, m.id.clone()),
        }
    }

    /// The page of `found` after `after` (all of them in listing order), at most
    /// `limit`, and the next page's cursor when there are more.
    pub(super) fn page(
        mut found: Vec<KeyedMessage>,
        after: Option<Place>,
        limit: usize,
    ) -> (Vec<KeyedMessage>, Option<String>) {
        found.sort_by_cached_key(Place::of);
        let start = after.map_or(0, |after| found.partition_point(|m| Place::of(m) <= after));
        let mut page: Vec<KeyedMessage> = found.into_iter().skip(start).take(limit + 1).collect();
        let next = (page.len() > limit).then(|| Place::of(&page[limit - 1]).to_string());
        page.truncate(limit);
        (page, next)
    }

    pub(super) fn parse(text: &str) -> Result<Place, ApiError> {
        let bad = || ApiError::invalid(format!("after {text:?}: not a cursor this list gave"));
        let mut parts = text.splitn(3, '.');
        let group = parts
            .next()
            .and_then(|g| g.parse::<u8>().ok())
            .filter(|&g| g <= 1);
        let ms = parts.next().and_then(|ms| ms.parse::<u64>().ok());
        let id = parts.next().filter(|id| !id.is_empty());
        match (group, ms, id) {
            (Some(group), Some(ms), Some(id)) => Ok(Place(group, ms, id.to_owned())),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn keyed(id: &str, state: KeyedState, at_ms: u64) -> KeyedMessage {
        KeyedMessage {
            id: id.to_owned(),
            state,
            at_ms,
            priority: None,
            entry_id: None,
        }
    }

    #[test]
    fn pending_come_first_soonest_due_then_finished_latest_first() {
        use crate::store::RecordState::{Cancelled, Delivered};
        let mut all = [
            keyed("a", KeyedState::Done(Delivered), 10),
            keyed("b", KeyedState::Scheduled, 50),
            keyed("c", KeyedState::Done(Cancelled), 30),
            keyed("d", KeyedState::Held, 20),
        ];
        all.sort_by_cached_key(Place::of);
        let order: Vec<&str> = all.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(order, ["d", "b", "c", "a"]);
    }

    proptest! {
        #[test]
        fn a_cursor_reads_back_as_its_place(
            group in 0u8..=1, ms in any::<u64>(), id in "[A-Za-z0-9._:-]{1,40}",
        ) {
            let place = Place(group, ms, id);
            prop_assert_eq!(Place::parse(&place.to_string()).ok(), Some(place));
        }

        #[test]
        fn any_text_is_a_cursor_or_refused_by_name(text in delayq_harness::props::text()) {
            if let Err(e) = Place::parse(&text) {
                prop_assert!(e.detail.starts_with("after "), "{}", e.detail);
            }
        }
    }
}

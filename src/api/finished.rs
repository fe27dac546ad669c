//! `GET /v1/streams/{stream}/finished`: a stream's messages that finished while their
//! records are kept (delivered, expired, dead, cancelled), newest first, paged; by
//! state, and by business key.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::input::{StrictQuery, blank_as_none, page_limit};
use super::keys::Place;
use super::reach::Reach;
use super::streams::{StreamPath, checked_stream};
use super::{ApiError, AppState, ErrorBody};
use crate::message::MessageKey;
use crate::store::{FinishedCursor, FinishedMessage, KeyedState, Record, RecordState};

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;

/// A page of a stream's finished messages.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FinishedQuery {
    /// Only these states, comma-separated: `delivered`, `expired`, `dead`,
    /// `cancelled` (default: all).
    #[serde(default, deserialize_with = "blank_as_none")]
    state: Option<String>,
    /// Only the messages pushed with this business key.
    #[param(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    #[serde(default, deserialize_with = "blank_as_none")]
    key: Option<String>,
    /// Start after this place (the `next` of the page before, with the same
    /// `state` and `key`).
    #[serde(default, deserialize_with = "blank_as_none")]
    after: Option<String>,
    /// At most this many messages: 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "blank_as_none")]
    limit: Option<usize>,
}

/// One finished message.
#[derive(Debug, Serialize, ToSchema)]
pub struct Finished {
    id: String,
    /// `delivered`, `expired`, `dead` or `cancelled`.
    state: String,
    /// When it finished, epoch milliseconds (Redis's clock).
    at: u64,
    /// The stream entry written: in the stream (delivered), or in the dead-letter
    /// stream (expired, dead); none for a cancellation.
    #[serde(skip_serializing_if = "Option::is_none")]
    entry_id: Option<String>,
    /// The stream that entry is in.
    #[serde(skip_serializing_if = "Option::is_none")]
    written_to: Option<String>,
    /// The attempt that finished it (1, and one more for each redelivery).
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u64>,
    /// When attempt 1 reached the stream, for one delivered or dead after more.
    #[serde(skip_serializing_if = "Option::is_none")]
    first_delivered_at: Option<u64>,
    /// Delivered: how long after its due time (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    lateness_ms: Option<u64>,
}

/// A page of a stream's finished messages, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct FinishedMessages {
    stream: String,
    messages: Vec<Finished>,
    /// The `after` of the next page; null when this one reached the oldest on record.
    #[schema(required)]
    next: Option<String>,
}

/// A stream's finished messages
#[utoipa::path(
    get,
    path = "/v1/streams/{stream}/finished",
    operation_id = "listFinished",
    params(StreamPath, FinishedQuery),
    responses(
        (status = 200, description = "a page of the stream's messages that finished while records are kept (`records.retention`), newest first; next: cursor or null", body = FinishedMessages),
        (status = 400, description = "query cannot be parsed, or names an unknown parameter (bad_query)", body = ErrorBody),
        (status = 403, description = "stream not allowed (stream_not_allowed), or out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 422, description = "a bad state, key, cursor or limit; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    reach: Reach,
    Path(StreamPath { stream }): Path<StreamPath>,
    StrictQuery(query): StrictQuery<FinishedQuery>,
) -> Result<Json<FinishedMessages>, ApiError> {
    checked_stream(&stream, &state, &reach)?;
    let limit = page_limit(query.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let states = states(query.state.as_deref())?;
    let (messages, next) = match query.key {
        Some(key) => {
            let key = MessageKey::parse(&key)?;
            let after = query.after.as_deref().map(Place::parse).transpose()?;
            by_key(&state, &stream, &key, &states, after, limit).await?
        }
        None => {
            let after = query
                .after
                .as_deref()
                .map(|text| {
                    FinishedCursor::parse(text).ok_or_else(|| {
                        ApiError::invalid(format!("after {text:?}: not a cursor this list gave"))
                    })
                })
                .transpose()?;
            let page = state
                .store
                .finished(&stream, after.as_ref(), limit, &states)
                .await?;
            let shown = page.messages.into_iter().map(shown).collect();
            (shown, page.next.map(|c| c.to_string()))
        }
    };
    Ok(Json(FinishedMessages {
        stream,
        messages,
        next,
    }))
}

/// The `state` parameter: the states named, or none for all.
fn states(given: Option<&str>) -> Result<Vec<RecordState>, ApiError> {
    let Some(given) = given else {
        return Ok(Vec::new());
    };
    given
        .split(',')
        .map(|s| {
            RecordState::parse(s.trim()).ok_or_else(|| {
                ApiError::invalid(format!(
                    "state {s:?}: must be delivered, expired, dead or cancelled"
                ))
            })
        })
        .collect()
}

/// A key's finished messages, from its index (see `keys`), newest first.
async fn by_key(
    state: &AppState,
    stream: &str,
    key: &MessageKey,
    states: &[RecordState],
    after: Option<Place>,
    limit: usize,
) -> Result<(Vec<Finished>, Option<String>), ApiError> {
    let found: Vec<_> = state
        .store
        .key_messages(stream, key)
        .await?
        .into_iter()
        .filter(|m| match m.state {
            KeyedState::Done(s) => states.is_empty() || states.contains(&s),
            _ => false,
        })
        .collect();
    let (page, next) = Place::page(found, after, limit);
    let shown = page
        .into_iter()
        .filter_map(|m| match m.state {
            KeyedState::Done(state) => Some(Finished {
                id: m.id,
                state: state.as_str().to_owned(),
                at: m.at_ms,
                entry_id: m.entry_id,
                written_to: None,
                attempt: None,
                first_delivered_at: None,
                lateness_ms: None,
            }),
            _ => None,
        })
        .collect();
    Ok((shown, next))
}

fn shown(m: FinishedMessage) -> Finished {
    let FinishedMessage {
        id,
        record,
        first_delivered_ms,
    } = m;
    let Record {
        state,
        stream,
        entry_id,
        at_ms,
        attempt,
        late_ms,
    } = record;
    let delivered = state == RecordState::Delivered;
    Finished {
        id,
        state: state.as_str().to_owned(),
        at: at_ms,
        written_to: stream.filter(|_| entry_id.is_some()),
        entry_id,
        attempt: (attempt > 0).then_some(attempt),
        first_delivered_at: first_delivered_ms,
        lateness_ms: delivered.then_some(late_ms.unwrap_or(0)),
    }
}

//! `/v1/streams/{stream}/dead`: a stream's dead letters, listed, replayed (scheduled
//! again, due now) and purged; which ones a replay or purge takes is
//! `selection.rs`'s.

mod selection;

pub use selection::SelectionRequest;
use selection::{parse_selection, select};

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::input::{
    StrictQuery, blank_as_none, check_stream_allowed, page_cursor, page_limit, read_json,
};
use super::reach::Reach;
use super::streams::StreamPath;
use super::{ApiError, AppState, ErrorBody};
use crate::journal::durable;
use crate::metrics as m;
use crate::store::{DeadLetter, OutboxCode, OutboxLine, Replayed};

/// Most entries one list or one `all` request goes through; the answer's `next`
/// continues from there.
const MAX_LIMIT: usize = 10_000;
const DEFAULT_LIMIT: usize = 100;
/// Page size when looking dead letters up by message id.
const SCAN_PAGE: usize = 500;
/// A replay or purge request is a list of ids at most.
const MAX_BODY: usize = 1 << 20;

/// A page of dead letters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Start after this stream entry id (the `next` of the page before).
    #[serde(default, deserialize_with = "blank_as_none")]
    after: Option<String>,
    /// At most this many entries: 1 to 10000 (default 100).
    #[param(minimum = 1, maximum = 10000)]
    #[serde(default, deserialize_with = "blank_as_none")]
    limit: Option<usize>,
}

/// A page of a stream's dead letters.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetters {
    stream: String,
    dead_letter_stream: String,
    /// Oldest first.
    entries: Vec<DeadLetterEntry>,
    /// The `after` of the next page; null at the end.
    #[schema(required)]
    next: Option<String>,
}

/// A dead letter: the message as it was sent, and what delayq added.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterEntry {
    /// The entry in the dead-letter stream.
    entry_id: String,
    /// The message id; null if the entry carries none.
    #[schema(required)]
    id: Option<String>,
    /// Why it was dead-lettered.
    #[schema(required)]
    reason: Option<String>,
    /// Deliveries tried.
    #[schema(required)]
    attempt: Option<u64>,
    /// Epoch milliseconds.
    #[schema(required)]
    first_delivery: Option<u64>,
    /// Epoch milliseconds.
    #[schema(required)]
    last_delivery: Option<u64>,
    /// Its business key, when `forwarder.key_field` (or the stream's `streams.key_field`)
    /// carries it on entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// The fields the producer sent: `[name, value]` pairs, in order.
    fields: Vec<(String, String)>,
    /// The fields delayq appended, by name.
    delayq: IndexMap<String, String>,
}

/// The answer to a replay.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReplayAnswer {
    stream: String,
    dead_letter_stream: String,
    /// Scheduled again, due now; removed from the dead-letter stream.
    replayed: Vec<ReplayedLetter>,
    /// Left in the dead-letter stream, with why.
    skipped: Vec<SkippedLetter>,
    /// Ids asked for that no dead letter carries.
    not_found: Vec<String>,
    /// With `all`: the `after` of the next page; null at the end.
    #[schema(required)]
    next: Option<String>,
    /// The dead letters the selection took (with `dry_run`: would take).
    matched: usize,
    /// Only counted: nothing was replayed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dry_run: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReplayedLetter {
    #[schema(required)]
    id: Option<String>,
    entry_id: String,
    /// Epoch milliseconds.
    deliver_at: u64,
    /// The journal (`[journal]`) did not take the replay within 1 s (or holds no
    /// body to restore the message from): a loss of Redis's data before it
    /// does would lose the replayed message, which is no longer a dead letter.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    not_journaled: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SkippedLetter {
    #[schema(required)]
    id: Option<String>,
    entry_id: String,
    /// `already scheduled`, `no longer in the dead-letter stream` or `carries no
    /// message id`.
    why: String,
}

/// The answer to a purge.
#[derive(Debug, Serialize, ToSchema)]
pub struct PurgeAnswer {
    stream: String,
    dead_letter_stream: String,
    /// Entries deleted.
    purged: u64,
    /// Ids asked for that no dead letter carries.
    not_found: Vec<String>,
    /// With `all` and `limit`: the `after` of the next page; null at the end.
    #[schema(required)]
    next: Option<String>,
    /// With `dry_run`: the dead letters the selection would purge (nothing was).
    #[serde(skip_serializing_if = "Option::is_none")]
    matched: Option<usize>,
}

/// A stream name from the path, with its dead-letter stream.
fn streams(state: &AppState, stream: &str) -> Result<(String, String), ApiError> {
    crate::message::validate_stream(stream)?;
    let config = state.current_config();
    check_stream_allowed(stream, &config)?;
    Ok((stream.to_owned(), config.dead_letter_stream(stream)))
}

fn limit(given: Option<usize>) -> Result<usize, ApiError> {
    page_limit(given, DEFAULT_LIMIT, MAX_LIMIT)
}

fn entry_cursor(after: Option<String>) -> Result<Option<String>, ApiError> {
    page_cursor("after", after)
}

impl AppState {
    /// The id, attempt and business key fields delayq appends to `stream`'s entries
    /// and dead letters ("": none).
    fn own_fields(&self, stream: &str) -> (&str, &str, &str) {
        let f = &self.config.forwarder;
        (
            f.id_field.as_deref().unwrap_or(""),
            f.attempt_field.as_deref().unwrap_or(""),
            self.config.key_field_for(stream).unwrap_or(""),
        )
    }
}

fn letter_entry(letter: DeadLetter, attempt_field: &str, key_field: &str) -> DeadLetterEntry {
    let number = |name: &str| letter.annotation(name).and_then(|v| v.parse::<u64>().ok());
    DeadLetterEntry {
        key: (!key_field.is_empty())
            .then(|| letter.annotation(key_field).map(str::to_owned))
            .flatten(),
        reason: letter.annotation("delayq-reason").map(str::to_owned),
        attempt: number(attempt_field),
        first_delivery: number("delayq-first-delivery"),
        last_delivery: number("delayq-last-delivery"),
        id: letter.message_id.as_ref().map(|id| id.as_str().to_owned()),
        entry_id: letter.entry_id,
        fields: letter.fields,
        // A name given twice keeps its last value, as a JSON object would.
        delayq: letter.annotations.into_iter().collect(),
    }
}

/// List a stream's dead letters (oldest first)
#[utoipa::path(
    get,
    path = "/v1/streams/{stream}/dead",
    operation_id = "listDead",
    params(StreamPath, ListQuery),
    responses(
        (status = 200, description = "a page of dead letters: id, reason, attempts, first and last delivery, original fields; next: cursor or null", body = DeadLetters),
        (status = 400, description = "query cannot be parsed, or names an unknown parameter (bad_query)", body = ErrorBody),
        (status = 403, description = "stream not allowed (stream_not_allowed), or out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 409, description = "the dead-letter key is not a stream", body = ErrorBody),
        (status = 422, description = "a parameter breaks a rule; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    reach: Reach,
    Path(StreamPath { stream }): Path<StreamPath>,
    StrictQuery(query): StrictQuery<ListQuery>,
) -> Result<Json<DeadLetters>, ApiError> {
    let (stream, dead_stream) = streams(&state, &stream)?;
    reach.check(&stream)?;
    let limit = limit(query.limit)?;
    let after = entry_cursor(query.after)?;
    let (letters, next) = page(&state, &stream, &dead_stream, after.as_deref(), limit).await?;
    let (_, attempt_field, key_field) = state.own_fields(&stream);
    Ok(Json(DeadLetters {
        stream,
        dead_letter_stream: dead_stream,
        entries: letters
            .into_iter()
            .map(|l| letter_entry(l, attempt_field, key_field))
            .collect(),
        next,
    }))
}

/// Up to `limit` dead letters after `after`, and the cursor of the next page (None:
/// this one reached the end).
async fn page(
    state: &AppState,
    stream: &str,
    dead_stream: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<DeadLetter>, Option<String>), ApiError> {
    let (id_field, attempt_field, key_field) = state.own_fields(stream);
    let letters = state
        .store
        .dead_letters(
            dead_stream,
            after,
            limit,
            id_field,
            attempt_field,
            key_field,
        )
        .await?;
    let next = (letters.len() == limit)
        .then(|| letters.last().map(|l| l.entry_id.clone()))
        .flatten();
    Ok((letters, next))
}

/// Schedule dead letters again, due now; removes from the dead-letter stream only what was scheduled
#[utoipa::path(
    post,
    path = "/v1/streams/{stream}/dead/replay",
    operation_id = "replayDead",
    params(StreamPath),
    request_body = SelectionRequest,
    responses(
        (status = 200, description = "replayed and skipped, per id", body = ReplayAnswer),
        (status = 400, description = "body is not JSON, or not an object", body = ErrorBody),
        (status = 403, description = "stream not allowed (stream_not_allowed), or out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 409, description = "the dead-letter key is not a stream", body = ErrorBody),
        (status = 413, description = "body too large", body = ErrorBody),
        (status = 422, description = "a field breaks a rule; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unavailable; or made, but fewer replicas than redis.min_replicas_acked confirmed it in time (not_replicated; asking again is safe)", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn replay(
    State(state): State<AppState>,
    reach: Reach,
    Path(StreamPath { stream }): Path<StreamPath>,
    body: Body,
) -> Result<Json<ReplayAnswer>, ApiError> {
    let (stream, dead_stream) = streams(&state, &stream)?;
    let (selection, dry_run) = parse_selection(&read_json(body, MAX_BODY).await?)?;
    let (letters, not_found, next) = select(&state, &stream, &dead_stream, &selection).await?;
    let (id_field, attempt_field, key_field) = state.own_fields(&stream);
    let who = crate::journal::Who::api(&state.config.node_id, &reach.who);
    let mut replayed = Vec::new();
    let mut skipped = Vec::new();
    for letter in letters.iter().filter(|_| !dry_run) {
        let id = letter.message_id.as_ref().map(|id| id.as_str().to_owned());
        let entry_id = letter.entry_id.clone();
        let sent = std::time::Instant::now();
        let why = match state
            .store
            .replay_dead_letter(
                &dead_stream,
                letter,
                &stream,
                id_field,
                attempt_field,
                key_field,
            )
            .await?
        {
            Replayed::Replayed { due_ms } => {
                metrics::counter!(m::DEAD_REPLAYED, "stream" => m::stream_label(&stream))
                    .increment(1);
                let mut not_journaled = false;
                if let (Some(journal), Some(id)) = (state.ingest.journal(), &id) {
                    let line = OutboxLine {
                        code: OutboxCode::Replayed,
                        id: id.clone(),
                        at_ms: due_ms,
                        entry: Some(due_ms.to_string()),
                        stream: Some(stream.clone()),
                        attempt: None,
                    };
                    not_journaled =
                        !durable::journaled(&state.store, sent, journal.replayed(&line, &who))
                            .await;
                }
                replayed.push(ReplayedLetter {
                    id,
                    entry_id,
                    deliver_at: due_ms,
                    not_journaled,
                });
                continue;
            }
            Replayed::AlreadyScheduled => "already scheduled",
            Replayed::Gone => "no longer in the dead-letter stream",
            Replayed::Foreign => "carries no message id",
        };
        skipped.push(SkippedLetter {
            id,
            entry_id,
            why: why.to_owned(),
        });
    }
    if !replayed.is_empty() {
        tracing::info!(%stream, %dead_stream, replayed = replayed.len(), skipped = skipped.len(), "dead letters replayed");
    }
    Ok(Json(ReplayAnswer {
        stream,
        dead_letter_stream: dead_stream,
        replayed,
        skipped,
        not_found,
        next,
        matched: letters.len(),
        dry_run,
    }))
}

/// Delete dead letters
#[utoipa::path(
    post,
    path = "/v1/streams/{stream}/dead/purge",
    operation_id = "purgeDead",
    params(StreamPath),
    request_body = SelectionRequest,
    responses(
        (status = 200, description = "purged count", body = PurgeAnswer),
        (status = 400, description = "body is not JSON, or not an object", body = ErrorBody),
        (status = 403, description = "stream not allowed (stream_not_allowed), or out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 409, description = "the dead-letter key is not a stream", body = ErrorBody),
        (status = 413, description = "body too large", body = ErrorBody),
        (status = 422, description = "a field breaks a rule; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unavailable; or made, but fewer replicas than redis.min_replicas_acked confirmed it in time (not_replicated; asking again is safe)", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn purge(
    State(state): State<AppState>,
    Path(StreamPath { stream }): Path<StreamPath>,
    body: Body,
) -> Result<Json<PurgeAnswer>, ApiError> {
    let (stream, dead_stream) = streams(&state, &stream)?;
    let (selection, dry_run) = parse_selection(&read_json(body, MAX_BODY).await?)?;
    if dry_run {
        let (letters, not_found, next) = select(&state, &stream, &dead_stream, &selection).await?;
        return Ok(Json(PurgeAnswer {
            stream,
            dead_letter_stream: dead_stream,
            purged: 0,
            not_found,
            next,
            matched: Some(letters.len()),
        }));
    }
    let (purged, not_found, next) = if selection.is_everything() {
        // Everything, in one command, however long the stream.
        (
            state.store.purge_dead_letters(&dead_stream, None).await?,
            Vec::new(),
            None,
        )
    } else {
        let (letters, not_found, next) = select(&state, &stream, &dead_stream, &selection).await?;
        let entries: Vec<String> = letters.into_iter().map(|l| l.entry_id).collect();
        (
            state
                .store
                .purge_dead_letters(&dead_stream, Some(&entries))
                .await?,
            not_found,
            next,
        )
    };
    metrics::counter!(m::DEAD_PURGED, "stream" => m::stream_label(&stream)).increment(purged);
    tracing::info!(%stream, %dead_stream, purged, "dead letters purged");
    Ok(Json(PurgeAnswer {
        stream,
        dead_letter_stream: dead_stream,
        purged,
        not_found,
        next,
        matched: None,
    }))
}

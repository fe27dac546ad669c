//! `/v1/messages/{id}`: one message by its id, looked up, cancelled or moved to a
//! new due time. The id `batch` is served at `/v1/messages/batch` too, whose POST
//! is the batch push.

use std::sync::LazyLock;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::due::{DeliverAt, parse_due};
use super::push::Pushed;
use crate::api::input::{SMALL_BODY, documented_keys, object, path_id, read_json};
use crate::api::reach::Reach;
use crate::api::{ApiError, AppState, ErrorBody};
use crate::message::{Due, MessageId};
use crate::metrics as m;
use crate::store::{Cancelled, OutboxCode, OutboxLine, RecordState, Rescheduled, Status};

/// The message named in the path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct IdPath {
    /// The message id.
    #[param(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub id: String,
}

/// A message's state: scheduled (with its details); for `records.retention` after it
/// ended, delivered, expired, dead or cancelled; or corrupt.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum MessageStatus {
    Scheduled {
        id: String,
        /// `scheduled`.
        state: String,
        stream: String,
        /// Epoch milliseconds.
        deliver_at: u64,
        priority: u8,
        /// Epoch milliseconds.
        created_at: u64,
        /// Deliveries tried so far.
        attempt: u64,
        /// Epoch milliseconds; null without a ttl.
        #[schema(required)]
        expires_at: Option<u64>,
        /// `[name, value]` pairs, in order.
        fields: Vec<(String, String)>,
        /// Its business key, if it was pushed with one.
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    Ended {
        id: String,
        /// `delivered`, `expired`, `dead` or `cancelled`.
        state: String,
        /// The stream written to: the target, its dead-letter stream, or null for a
        /// cancellation.
        #[schema(required)]
        stream: Option<String>,
        /// The entry written, if any.
        #[schema(required)]
        entry_id: Option<String>,
        /// When it ended, epoch milliseconds.
        at: u64,
        attempt: u64,
        /// Dead or expired: whether its dead letter is still in `stream`
        /// (`present`), or was purged (or trimmed by that stream's MAXLEN:
        /// `purged`); a replayed one is scheduled again instead.
        #[serde(skip_serializing_if = "Option::is_none")]
        dead_letter: Option<String>,
        /// Dead or expired: the stream it was meant for (where a replay sends it),
        /// when the settings name it.
        #[serde(skip_serializing_if = "Option::is_none")]
        target: Option<String>,
        /// The entry's fields as `stream` holds them (the producer's, then delayq's
        /// own), while it holds the entry.
        #[serde(skip_serializing_if = "Option::is_none")]
        fields: Option<Vec<(String, String)>>,
        /// Its due time (epoch ms): a delivered message's record keeps it; for the
        /// others, when the journal (`[journal]`) knows it.
        #[serde(skip_serializing_if = "Option::is_none")]
        deliver_at: Option<u64>,
        /// Delivered: how late (ms, `at` − `deliver_at`), when the due time is known.
        #[serde(skip_serializing_if = "Option::is_none")]
        lateness_ms: Option<u64>,
    },
    /// Known only to the journal (`[journal]`): Redis has forgotten it (after
    /// `records.retention`), the journal keeps it for `journal.retention`.
    Journaled {
        id: String,
        /// `scheduled`, `delivered`, `expired`, `dead` or `cancelled`.
        state: String,
        /// The target stream.
        stream: String,
        /// The entry written, if any.
        #[schema(required)]
        entry_id: Option<String>,
        /// Its due time, epoch milliseconds.
        deliver_at: u64,
        /// When the journal last changed it (its end, if it ended), epoch milliseconds.
        at: u64,
        /// `journal`.
        source: String,
    },
    /// Stored but unreadable; the forwarder will dead-letter it.
    Corrupt {
        id: String,
        /// `corrupt`.
        state: String,
        detail: String,
    },
}

/// The answer to a cancel.
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelAnswer {
    id: String,
    /// `cancelled`.
    state: String,
    /// True when it was cancelled before this request: a repeated cancel (a retry)
    /// answers as the first one did and changes nothing.
    already: bool,
    /// The journal (`[journal]`) did not take the cancel within 1 s: Redis has it
    /// and the journal gets it when it answers, but a loss of Redis's data before
    /// then would undo it. Repeating the cancel is safe.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    not_journaled: bool,
}

/// A message's state
#[utoipa::path(
    get,
    path = "/v1/messages/{id}",
    operation_id = "status",
    params(IdPath),
    responses(
        (status = 200, description = "scheduled (with details), or for records.retention after it ended: delivered, expired, dead or cancelled; then, with the journal on, what the journal knows (source: journal) for journal.retention", body = MessageStatus),
        (status = 400, description = "bad id (invalid_id), or a path that is not UTF-8", body = ErrorBody),
        (status = 404, description = "unknown (never scheduled, or its record expired)", body = ErrorBody),
        (status = 503, description = "Redis unreachable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn status(
    State(state): State<AppState>,
    reach: Reach,
    Path(IdPath { id }): Path<IdPath>,
) -> Result<Json<MessageStatus>, ApiError> {
    let id = path_id(&id)?;
    let mut found = state.store.get(&id).await?;
    // A message of a stream the token does not reach is unknown to it.
    if !reach.sees_status(&found, &state.config.forwarder.dead_letter_suffix) {
        found = Status::Unknown;
    }
    let status = match found {
        Status::Unknown => {
            if let Some(journal) = state.ingest.journal() {
                let rows = journal.lookup(&id).await.map_err(|e| {
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "journal_unavailable",
                        format!(
                            "message {id}: unknown to Redis, and the journal did not answer: {e}"
                        ),
                    )
                })?;
                if let Some(row) = rows.into_iter().find(|row| reach.sees(&row.stream)) {
                    return Ok(Json(MessageStatus::Journaled {
                        id: id.as_str().to_owned(),
                        state: row.state.as_str().to_owned(),
                        stream: row.stream,
                        entry_id: row.entry_id,
                        deliver_at: row.due_ms,
                        at: row.updated_ms,
                        source: "journal".to_owned(),
                    }));
                }
            }
            return Err(ApiError::not_found(format!(
                "message {id}: unknown (never scheduled, or its record expired)"
            )));
        }
        Status::Corrupt(why) => MessageStatus::Corrupt {
            id: id.as_str().to_owned(),
            state: "corrupt".to_owned(),
            detail: why,
        },
        Status::Scheduled(s) => MessageStatus::Scheduled {
            id: id.as_str().to_owned(),
            state: "scheduled".to_owned(),
            stream: s.stream,
            deliver_at: s.due_ms,
            priority: s.priority,
            created_at: s.created_ms,
            attempt: s.attempt,
            expires_at: s.expire_at_ms,
            fields: s.fields,
            key: s.key,
        },
        Status::Done(r) => {
            let state_name = r.state.as_str();
            let (mut dead_letter, mut target, mut fields) = (None, None, None);
            if let (Some(stream), Some(entry)) = (r.stream.as_deref(), r.entry_id.as_deref()) {
                fields = state.store.entry(stream, entry).await?;
                if matches!(state_name, "dead" | "expired") {
                    let held = fields.is_some();
                    dead_letter = Some(if held { "present" } else { "purged" }.to_owned());
                    target = target_of(&state.current_config(), stream);
                }
            }
            // A delivery's record keeps how late it was (0 unsaid), so its due time;
            // otherwise the due time is the journal's to tell (a journal that does
            // not answer leaves it out).
            let mut deliver_at = None;
            if state_name == "delivered" {
                deliver_at = Some(r.at_ms.saturating_sub(r.late_ms.unwrap_or(0)));
            } else if let Some(journal) = state.ingest.journal()
                && let Ok(rows) = journal.lookup(&id).await
            {
                deliver_at = rows.into_iter().next().map(|row| row.due_ms);
            }
            let lateness_ms = deliver_at
                .filter(|_| state_name == "delivered")
                .map(|due| r.at_ms.saturating_sub(due));
            MessageStatus::Ended {
                id: id.as_str().to_owned(),
                state: state_name.to_owned(),
                stream: r.stream,
                entry_id: r.entry_id,
                at: r.at_ms,
                attempt: r.attempt,
                dead_letter,
                target,
                fields,
                deliver_at,
                lateness_ms,
            }
        }
    };
    Ok(Json(status))
}

/// Cancel a scheduled message
#[utoipa::path(
    delete,
    path = "/v1/messages/{id}",
    operation_id = "cancel",
    params(IdPath),
    responses(
        (status = 200, description = "cancelled, now or before (`already`: a retried cancel is safe)", body = CancelAnswer),
        (status = 400, description = "bad id (invalid_id), or a path that is not UTF-8", body = ErrorBody),
        (status = 404, description = "unknown", body = ErrorBody),
        (status = 409, description = "already delivered, expired or dead (already_final)", body = ErrorBody),
        (status = 503, description = "Redis unreachable; or, with the journal, Redis lost its data and the restore has not put the message back yet (restore_pending): retry", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn cancel(
    State(state): State<AppState>,
    reach: Reach,
    Path(IdPath { id }): Path<IdPath>,
) -> Result<Json<CancelAnswer>, ApiError> {
    let id = path_id(&id)?;
    check_reach(&state, &reach, &id).await?;
    let sent = std::time::Instant::now();
    let (cancelled, at) = state
        .store
        .cancel_timed(&id, state.config.records.retention)
        .await?;
    // The journal's row is found by the message's id and stream. On Redis Cluster
    // an id names a message per slot: a cancel whose stream is not known (its
    // body unreadable) is left to the outbox's copy there.
    let mut not_journaled = false;
    if let (Some(journal), Some((at_ms, stream))) = (state.ingest.journal(), at) {
        not_journaled = if stream.is_none() && state.store.is_cluster() {
            true
        } else {
            let line = OutboxLine {
                code: OutboxCode::Cancelled,
                id: id.as_str().to_owned(),
                at_ms,
                entry: None,
                stream,
                attempt: None,
            };
            !crate::journal::durable::journaled_line(
                &state.store,
                sent,
                journal,
                line,
                &crate::journal::Who::api(&state.config.node_id, &reach.who),
            )
            .await
        };
    }
    match cancelled {
        Cancelled::Cancelled => {
            metrics::counter!(m::CANCELLED).increment(1);
            Ok(Json(CancelAnswer {
                id: id.as_str().to_owned(),
                state: "cancelled".to_owned(),
                already: false,
                not_journaled,
            }))
        }
        Cancelled::AlreadyDone(RecordState::Cancelled) => Ok(Json(CancelAnswer {
            id: id.as_str().to_owned(),
            state: "cancelled".to_owned(),
            already: true,
            not_journaled: false,
        })),
        Cancelled::AlreadyDone(done) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_final",
            format!(
                "message {id}: already {}, cannot be cancelled",
                done.as_str()
            ),
        )),
        Cancelled::Unknown => Err(unknown(&state, &id).await),
    }
}

/// For a token limited to some streams, a change to a message of another stream:
/// `404`, as for a message it does not know (one Redis read first; the change
/// itself is not bound to the stream it read).
/// The stream whose dead-letter stream is `dead`, by the settings: a stream under
/// `[delivery.streams]` naming it, or `dead` without the suffix (on Cluster, the
/// hash tag around the stream's name too).
fn target_of(config: &crate::config::Config, dead: &str) -> Option<String> {
    let stripped = dead.strip_suffix(config.forwarder.dead_letter_suffix.as_str());
    config
        .delivery
        .streams
        .iter()
        .map(|s| s.stream.clone())
        .chain(stripped.map(str::to_owned))
        .chain(
            stripped
                .and_then(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .map(str::to_owned),
        )
        .find(|target| config.dead_letter_stream(target) == dead)
}

async fn check_reach(state: &AppState, reach: &Reach, id: &MessageId) -> Result<(), ApiError> {
    if reach.is_everything() {
        return Ok(());
    }
    let found = state.store.get(id).await?;
    match reach.sees_status(&found, &state.config.forwarder.dead_letter_suffix) {
        true => Ok(()),
        false => Err(ApiError::not_found(format!("message {id}: unknown"))),
    }
}

/// The refusal of a change to a message Redis does not know: 404, unless Redis
/// lost its data (the journal's marker is gone) and the journal holds the message
/// not finished, so that the restore will put it back: then 503 `restore_pending`,
/// to be repeated once the restore ran (a change answered 404 there was lost, and
/// the message delivered at its old time).
async fn unknown(state: &AppState, id: &crate::message::MessageId) -> ApiError {
    let Some(journal) = state.ingest.journal() else {
        return ApiError::not_found(format!("message {id}: unknown"));
    };
    let restore_pending = match state.store.journal_marker().await {
        Ok(Some(_)) => false,
        Ok(None) => match journal.lookup(id).await {
            Ok(rows) => rows
                .iter()
                .any(|row| row.state == crate::journal::State::Scheduled),
            Err(e) => {
                return ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "journal_unavailable",
                    format!(
                        "message {id}: unknown to Redis, which lost its data, and the journal did not answer: {e}; retry"
                    ),
                );
            }
        },
        Err(e) => return ApiError::from(e),
    };
    if restore_pending {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "restore_pending",
            format!(
                "message {id}: Redis lost its data and the journal's restore has not put this message back yet; retry after the restore"
            ),
        )
    } else {
        ApiError::not_found(format!("message {id}: unknown"))
    }
}

fn batch_id() -> Path<IdPath> {
    Path(IdPath {
        id: "batch".to_owned(),
    })
}

/// Look up the message whose id is "batch" (as GET /v1/messages/{id})
#[utoipa::path(
    get,
    path = "/v1/messages/batch",
    operation_id = "statusOfBatchId",
    responses(
        (status = 200, description = "state", body = MessageStatus),
        (status = 404, description = "unknown", body = ErrorBody),
        (status = 503, description = "Redis unreachable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn status_of_batch(
    state: State<AppState>,
    reach: Reach,
) -> Result<Json<MessageStatus>, ApiError> {
    // The static segment wins over `{id}`: this still reaches the message "batch".
    status(state, reach, batch_id()).await
}

/// Cancel the message whose id is "batch" (as DELETE /v1/messages/{id})
#[utoipa::path(
    delete,
    path = "/v1/messages/batch",
    operation_id = "cancelBatchId",
    responses(
        (status = 200, description = "cancelled, now or before (`already`: a retried cancel is safe)", body = CancelAnswer),
        (status = 404, description = "unknown", body = ErrorBody),
        (status = 409, description = "already delivered, expired, dead or cancelled (already_final)", body = ErrorBody),
        (status = 503, description = "Redis unreachable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn cancel_of_batch(
    state: State<AppState>,
    reach: Reach,
) -> Result<Json<CancelAnswer>, ApiError> {
    cancel(state, reach, batch_id()).await
}

/// A new due time for a scheduled message: exactly one of `delay`, `delay_ms` and
/// `deliver_at`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({ "delay": "5m" }))]
pub struct RescheduleRequest {
    /// In how long from now, as text such as `"20m"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// In how many milliseconds from now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// When (a time in the past: as soon as possible).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<DeliverAt>,
}

static RESCHEDULE_KEYS: LazyLock<Vec<String>> = LazyLock::new(documented_keys::<RescheduleRequest>);

/// A reschedule body: the new due time.
fn parse_reschedule(value: &Value) -> Result<Due, ApiError> {
    let obj = object(
        value,
        &RESCHEDULE_KEYS,
        "body must be a JSON object such as {\"delay\": \"5m\"}",
    )?;
    parse_due(obj)
}

/// Move a scheduled message to a new due time (fields, priority and ttl stay)
#[utoipa::path(
    post,
    path = "/v1/messages/{id}/reschedule",
    operation_id = "reschedule",
    params(IdPath),
    request_body = RescheduleRequest,
    responses(
        (status = 200, description = "rescheduled", body = Pushed),
        (status = 400, description = "bad id (invalid_id), or body is not JSON", body = ErrorBody),
        (status = 404, description = "unknown", body = ErrorBody),
        (status = 409, description = "already delivered, expired, dead or cancelled (already_final)", body = ErrorBody),
        (status = 413, description = "body too large", body = ErrorBody),
        (status = 422, description = "bad, negative or too distant due time", body = ErrorBody),
        (status = 503, description = "Redis unreachable; or, with the journal, Redis lost its data and the restore has not put the message back yet (restore_pending): retry", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn reschedule(
    State(state): State<AppState>,
    reach: Reach,
    Path(IdPath { id }): Path<IdPath>,
    body: Body,
) -> Result<Json<Pushed>, ApiError> {
    let id = path_id(&id)?;
    let value = read_json(body, SMALL_BODY).await?;
    let due = parse_reschedule(&value)?;
    let limits = &state.config.api.limits;
    limits.check_delay(due)?;
    check_reach(&state, &reach, &id).await?;
    let sent = std::time::Instant::now();
    match state.store.reschedule(&id, due, limits.max_delay).await? {
        Rescheduled::Rescheduled {
            due_ms,
            at_ms,
            stream,
        } => {
            metrics::counter!(m::RESCHEDULED).increment(1);
            let mut answer = Pushed::scheduled(&id, due_ms);
            if let Some(journal) = state.ingest.journal() {
                let line = OutboxLine {
                    code: OutboxCode::Rescheduled,
                    id: id.as_str().to_owned(),
                    at_ms,
                    entry: Some(due_ms.to_string()),
                    stream: Some(stream),
                    attempt: None,
                };
                answer.not_journaled = !crate::journal::durable::journaled_line(
                    &state.store,
                    sent,
                    journal,
                    line,
                    &crate::journal::Who::api(&state.config.node_id, &reach.who),
                )
                .await;
            }
            Ok(Json(answer))
        }
        Rescheduled::NotScheduled(done) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_final",
            format!(
                "message {id}: already {}, cannot be rescheduled",
                done.as_str()
            ),
        )),
        Rescheduled::Unknown => Err(unknown(&state, &id).await),
    }
}

#[cfg(test)]
mod tests {
    use super::super::due::DUE_KEYS;
    use super::*;

    #[test]
    fn a_reschedule_takes_the_due_keys_and_nothing_else() {
        assert_eq!(*RESCHEDULE_KEYS, DUE_KEYS);
    }

    proptest::proptest! {
        /// What the reader takes, the documented type reads too.
        #[test]
        fn an_accepted_reschedule_is_a_documented_one(body in delayq_harness::props::json(DUE_KEYS)) {
            if parse_reschedule(&body).is_ok() {
                proptest::prop_assert!(serde_json::from_value::<RescheduleRequest>(body.clone()).is_ok(), "{}", body);
            }
        }
    }
}

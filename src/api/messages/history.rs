//! `GET /v1/messages/{id}/history`: a message's journey as the journal's transition
//! log keeps it, oldest first: pushed, rescheduled, forwarded, redelivered,
//! dead-lettered, replayed, restored, each with when, where and who.

use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;

use super::by_id::IdPath;
use crate::api::input::path_id;
use crate::api::reach::Reach;
use crate::api::{ApiError, AppState, ErrorBody};
use crate::journal::{Step, Transition};

/// One step of a message's journey.
#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryStep {
    /// `pushed`, `replaced`, `rescheduled`, `cancelled`, `forwarded`, `redelivered`,
    /// `dead_lettered`, `expired`, `replayed` or `restored`.
    step: String,
    /// The message's target stream.
    stream: String,
    /// When (epoch ms, Redis's clock).
    at: u64,
    /// The node that made it, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    /// The shard it was made in, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    shard: Option<u16>,
    /// The leader's term, for a leader's step.
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    /// The API token's name (or fingerprint), for a step asked over HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    /// Forwarded, dead-lettered, expired: the stream entry written; redelivered: the
    /// entry no consumer acknowledged.
    #[serde(skip_serializing_if = "Option::is_none")]
    entry_id: Option<String>,
    /// Pushed or replaced: how it came (`http`, `batch`, `inbox`, `schedule`).
    #[serde(skip_serializing_if = "Option::is_none")]
    via: Option<String>,
    /// Rescheduled: the new due time (epoch ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    deliver_at: Option<u64>,
    /// Forwarded: how long after its due time, when the log knows the due time
    /// (a reschedule's or a replay's before it, else the message's journal row).
    #[serde(skip_serializing_if = "Option::is_none")]
    lateness_ms: Option<u64>,
    /// Redelivered: the redelivery's attempt (the first delivery was attempt 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    /// Redelivered: `ack_timeout` (no consumer acknowledged the entry in time);
    /// dead-lettered: `corrupt`, `unwritable` or `max_attempts`.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// A message's journey.
#[derive(Debug, Serialize, ToSchema)]
pub struct History {
    id: String,
    /// Oldest first.
    steps: Vec<HistoryStep>,
}

/// A message's journey, from the journal
#[utoipa::path(
    get,
    path = "/v1/messages/{id}/history",
    operation_id = "messageHistory",
    params(IdPath),
    responses(
        (status = 200, description = "the message's steps the journal keeps (journal.transitions_retention), oldest first", body = History),
        (status = 404, description = "no step of this message is known (or none of a stream the token reaches)", body = ErrorBody),
        (status = 409, description = "no journal configured (no_journal)", body = ErrorBody),
        (status = 422, description = "a malformed id", body = ErrorBody),
        (status = 503, description = "the journal does not answer", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn history(
    State(state): State<AppState>,
    reach: Reach,
    Path(IdPath { id }): Path<IdPath>,
) -> Result<Json<History>, ApiError> {
    let id = path_id(&id)?;
    let Some(journal) = state.ingest.journal() else {
        return Err(ApiError::no_journal("it keeps messages' histories"));
    };
    let mut steps = journal.history(id.as_str()).await?;
    steps.retain(|t| reach.sees(&t.stream));
    if steps.is_empty() {
        return Err(ApiError::not_found(format!(
            "message {id}: no history in the journal"
        )));
    }
    // The due time a forward is measured against: the latest the log tells of,
    // else the journal's row (the message's due time when last pushed).
    let row_due = journal
        .lookup(&id)
        .await
        .ok()
        .and_then(|rows| rows.into_iter().next().map(|r| r.due_ms));
    Ok(Json(History {
        id: id.as_str().to_owned(),
        steps: shown(steps, row_due),
    }))
}

/// The steps as the API shows them, each forward with its lateness.
fn shown(steps: Vec<Transition>, row_due: Option<u64>) -> Vec<HistoryStep> {
    let mut due: Option<u64> = None;
    let last_forward = steps.iter().rposition(|t| t.step == Step::Forwarded);
    steps
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let detail_ms = t.detail.as_deref().and_then(|d| d.parse::<u64>().ok());
            let mut lateness_ms = None;
            match t.step {
                Step::Rescheduled => due = detail_ms,
                Step::Replayed => due = Some(t.at_ms),
                Step::Forwarded => {
                    let measured = due.or(row_due.filter(|_| Some(i) == last_forward));
                    lateness_ms = measured.map(|d| t.at_ms.saturating_sub(d));
                }
                _ => {}
            }
            let entry = matches!(
                t.step,
                Step::Forwarded | Step::Dead | Step::Expired | Step::Redelivered
            );
            let pushed = matches!(t.step, Step::Pushed | Step::Replaced);
            HistoryStep {
                step: t.step.as_str().to_owned(),
                stream: t.stream,
                at: t.at_ms,
                node: t.who.node,
                shard: t.who.shard,
                epoch: t.who.epoch,
                token: t.who.token,
                deliver_at: (t.step == Step::Rescheduled).then_some(detail_ms).flatten(),
                via: t.detail.clone().filter(|_| pushed),
                entry_id: t.detail.filter(|_| entry),
                lateness_ms,
                attempt: t.attempt,
                reason: t.reason,
            }
        })
        .collect()
}

//! `/v1/admin/restore` and `/v1/admin/restore/{id}`: schedule again what the
//! journal holds and Redis lost (see `crate::restore`). Admin scope.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::input::{SMALL_BODY, documented_keys, object, path_id, read_json_or_empty};
use crate::api::messages::by_id::IdPath;
use crate::api::reach::Reach;
use crate::api::{ApiError, AppState, ErrorBody};
use crate::restore::{RestoreError, RestoreOptions, RestoreReport, check_safe, restore};

/// What to restore.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
pub struct RestoreRequest {
    /// Also messages whose due time has passed: they go out at once (false:
    /// counted as `overdue` and left in the journal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub include_overdue: Option<bool>,
    /// Count only; nothing is scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

/// Restore every message the journal holds not finished and Redis does not
///
/// Each is scheduled again with its id and journaled due time (idempotent: what
/// Redis holds, scheduled or on record, stays as it is; finished messages are
/// never read). A full restore (not `dry_run`) writes the journal's marker back
/// to Redis, which ends a hold on forwarding after Redis lost its data. The body
/// may be empty.
#[utoipa::path(
    post,
    path = "/v1/admin/restore",
    operation_id = "restore",
    request_body(content = RestoreRequest, description = "optional"),
    responses(
        (status = 200, description = "the report", body = RestoreReport),
        (status = 400, description = "body is not JSON, or not an object", body = ErrorBody),
        (status = 409, description = "no journal configured (no_journal), or records.retention = 0s while forwarding is not held (unsafe_restore)", body = ErrorBody),
        (status = 413, description = "body too large", body = ErrorBody),
        (status = 422, description = "a field breaks a rule; the detail names it", body = ErrorBody),
        (status = 503, description = "the journal or Redis unavailable, or Redis lost its data again during the restore (restore_interrupted: run it again)", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn restore_all(
    State(state): State<AppState>,
    reach: Reach,
    body: Body,
) -> Result<Json<RestoreReport>, ApiError> {
    let value = read_json_or_empty(body, SMALL_BODY).await?;
    let obj = object(
        &value,
        &documented_keys::<RestoreRequest>(),
        "body must be a JSON object",
    )?;
    let flag = |key: &str| -> Result<bool, ApiError> {
        match obj.get(key) {
            None => Ok(false),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| ApiError::invalid(format!("{key}: must be true or false"))),
        }
    };
    let options = RestoreOptions {
        include_overdue: flag("include_overdue")?,
        dry_run: flag("dry_run")?,
        id: None,
        lost_seen_ms: None,
        records_retention: state.config.records.retention,
        by: crate::journal::Who::api(&state.config.node_id, &reach.who),
    };
    run(&state, &options).await
}

/// Restore one message from the journal
///
/// As `/v1/admin/restore`, for the message named (overdue or not).
#[utoipa::path(
    post,
    path = "/v1/admin/restore/{id}",
    operation_id = "restoreOne",
    params(IdPath),
    responses(
        (status = 200, description = "the report (restored 1, or why not)", body = RestoreReport),
        (status = 400, description = "bad id (invalid_id)", body = ErrorBody),
        (status = 404, description = "the journal holds no such message not finished", body = ErrorBody),
        (status = 409, description = "no journal configured (no_journal), or records.retention = 0s while forwarding is not held (unsafe_restore)", body = ErrorBody),
        (status = 503, description = "the journal or Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn restore_one(
    State(state): State<AppState>,
    reach: Reach,
    Path(IdPath { id }): Path<IdPath>,
) -> Result<Json<RestoreReport>, ApiError> {
    let options = RestoreOptions {
        include_overdue: true,
        dry_run: false,
        id: Some(path_id(&id)?),
        lost_seen_ms: None,
        records_retention: state.config.records.retention,
        by: crate::journal::Who::api(&state.config.node_id, &reach.who),
    };
    let report = run(&state, &options).await?;
    if report.journaled == 0 {
        return Err(ApiError::not_found(format!(
            "message {id}: the journal holds no such message not finished"
        )));
    }
    Ok(report)
}

async fn run(state: &AppState, options: &RestoreOptions) -> Result<Json<RestoreReport>, ApiError> {
    let Some(journal) = state.ingest.journal() else {
        return Err(ApiError::no_journal("there is nothing to restore from"));
    };
    let max_delay = state.config.api.limits.max_delay;
    let refused = |e| match e {
        RestoreError::Journal(e) => ApiError::from(e),
        RestoreError::Store(e) => ApiError::from(e),
        RestoreError::Unsafe(why) => ApiError::new(StatusCode::CONFLICT, "unsafe_restore", why),
        e @ RestoreError::Interrupted => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "restore_interrupted",
            e.to_string(),
        ),
    };
    check_safe(&state.store, state.config.records.retention, options)
        .await
        .map_err(refused)?;
    let report = restore(&state.store, journal, options, max_delay, &|_, _| {})
        .await
        .map_err(refused)?;
    tracing::warn!(?report, "restore from the journal, asked through the API");
    Ok(Json(report))
}

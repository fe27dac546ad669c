//! `/v1/schedules`: recurring schedules, each making a message on a calendar (a
//! cron expression in a time zone) or at a fixed interval, once per occurrence
//! through any failover (see `leader::schedules`).

use std::sync::LazyLock;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::{IntoParams, ToSchema};

use super::input::{SMALL_BODY, documented_keys, object, read_json};
use super::messages::push::parse_push;
use super::reach::Reach;
use super::{ApiError, AppState, ErrorBody};
use crate::message::parse_duration;
use crate::schedule::{DEFAULT_CATCH_UP, Misfire, ScheduleSpec, When};
use crate::store::ScheduleState;

/// Occurrences shown ahead with each schedule.
const SHOWN_AHEAD: usize = 5;

/// The schedule named in the path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SchedulePath {
    /// The schedule id.
    #[param(pattern = "^[A-Za-z0-9._:-]{1,100}$")]
    pub id: String,
}

/// A recurring schedule: the messages it makes (`stream`, `payload` or `fields`,
/// `key`) and when (`cron` with `timezone`, or `every`).
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({ "id": "nightly-report", "stream": "reports", "payload": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin" }))]
pub struct ScheduleRequest {
    /// Generated if left out (a POST); the path's (a PUT).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,100}$")]
    pub id: Option<String>,
    /// The stream each occurrence's message goes to; must match `streams.allow`.
    pub stream: String,
    /// As a push's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// As a push's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Value>,
    /// The business key of each occurrence's message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A cron expression: 5 fields (minute hour day month weekday, Sunday 0 or 7),
    /// or 6 with seconds first.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "0 3 * * *")]
    pub cron: Option<String>,
    /// The IANA zone `cron` is read in (default UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "Europe/Berlin")]
    pub timezone: Option<String>,
    /// Instead of `cron`: every this long (at least `1s`), from `start_at` or now.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "15m")]
    pub every: Option<String>,
    /// No occurrence before this: epoch ms or RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_at: Option<Value>,
    /// No occurrence after this: epoch ms or RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_at: Option<Value>,
    /// Each occurrence's message is due up to this much later (the same for an
    /// occurrence whichever node makes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    /// Occurrences missed while no node made them (all down, or paused): `skip`
    /// (the default), `once` (one message for all) or `all` (each, at most
    /// `max_catch_up`, the latest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub misfire: Option<String>,
    /// With `misfire = "all"`: at most this many (0 to 1000, default 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_catch_up: Option<u32>,
    /// Made paused: no occurrence until resumed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// A schedule as kept, with its next occurrences and the last one made.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScheduleView {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    spec: Value,
    /// Its next occurrences (epoch ms), up to five; none while paused.
    next: Vec<i64>,
    /// The last occurrence made into a message (epoch ms), if any.
    #[schema(required)]
    last: Option<i64>,
    /// Occurrences missed while no leader made them (every node down, or none
    /// leading, past the grace) since the schedule was last stored; its `misfire`
    /// policy sent some of them.
    missed: u64,
    /// A change answered before the journal took it (journal on; a restore after a
    /// loss of Redis's data may not bring it back).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    not_journaled: bool,
}

/// Every schedule.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScheduleList {
    schedules: Vec<ScheduleView>,
}

static KEYS: LazyLock<Vec<String>> = LazyLock::new(documented_keys::<ScheduleRequest>);

/// Create a recurring schedule
#[utoipa::path(
    post,
    path = "/v1/schedules",
    operation_id = "createSchedule",
    request_body = ScheduleRequest,
    responses(
        (status = 201, description = "created", body = ScheduleView),
        (status = 400, description = "body is not JSON, or not an object", body = ErrorBody),
        (status = 403, description = "stream not allowed, or out of the token's reach", body = ErrorBody),
        (status = 409, description = "a schedule of that id exists (schedule_exists), or scheduler.max_schedules are kept already (too_many_schedules)", body = ErrorBody),
        (status = 413, description = "body too large", body = ErrorBody),
        (status = 422, description = "a field breaks a rule; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unreachable; or made, but fewer replicas than redis.min_replicas_acked confirmed it in time (not_replicated; asking again is safe)", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn create(
    State(state): State<AppState>,
    reach: Reach,
    body: Body,
) -> Result<(StatusCode, Json<ScheduleView>), ApiError> {
    let value = read_json(body, SMALL_BODY).await?;
    let now = state.store.now_ms().await?;
    let spec = parse(&state, &reach, &value, None, now)?;
    if state.store.schedule_spec(&spec.id).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "schedule_exists",
            format!(
                "schedule {}: exists; PUT /v1/schedules/{} changes it",
                spec.id, spec.id
            ),
        ));
    }
    let most = state.current_config().scheduler.max_schedules;
    if state.store.schedule_count().await? >= most as u64 {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "too_many_schedules",
            format!("schedules: {most} kept already, the most scheduler.max_schedules allows"),
        ));
    }
    let written = crate::schedules::put(&state.store, state.ingest.journal(), &spec).await?;
    tracing::info!(schedule = spec.id, stream = spec.stream, "schedule created");
    written.replicated?;
    Ok((
        StatusCode::CREATED,
        Json(view(spec, None).journaled(written.not_journaled)),
    ))
}

/// Every recurring schedule, with its next occurrences
#[utoipa::path(
    get,
    path = "/v1/schedules",
    operation_id = "listSchedules",
    responses(
        (status = 200, description = "every schedule the token reaches, by id, each with its next five occurrences and the last one made", body = ScheduleList),
        (status = 503, description = "Redis unreachable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    reach: Reach,
) -> Result<Json<ScheduleList>, ApiError> {
    let schedules = state
        .store
        .schedule_specs()
        .await?
        .into_iter()
        .filter(|(spec, _)| reach.sees(&spec.stream))
        .map(|(spec, made)| view(spec, made))
        .collect();
    Ok(Json(ScheduleList { schedules }))
}

/// A recurring schedule
#[utoipa::path(
    get,
    path = "/v1/schedules/{id}",
    operation_id = "getSchedule",
    params(SchedulePath),
    responses(
        (status = 200, description = "the schedule, its next five occurrences and the last one made", body = ScheduleView),
        (status = 404, description = "no such schedule", body = ErrorBody),
        (status = 503, description = "Redis unreachable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn get(
    State(state): State<AppState>,
    reach: Reach,
    Path(SchedulePath { id }): Path<SchedulePath>,
) -> Result<Json<ScheduleView>, ApiError> {
    let (spec, made) = found(&state, &reach, &id).await?;
    Ok(Json(view(spec, made)))
}

/// Change a recurring schedule
#[utoipa::path(
    put,
    path = "/v1/schedules/{id}",
    operation_id = "putSchedule",
    params(SchedulePath),
    request_body = ScheduleRequest,
    responses(
        (status = 200, description = "changed: its occurrences are made afresh from now on", body = ScheduleView),
        (status = 400, description = "body is not JSON, or not an object", body = ErrorBody),
        (status = 403, description = "stream not allowed, or out of the token's reach", body = ErrorBody),
        (status = 404, description = "no such schedule", body = ErrorBody),
        (status = 409, description = "declared in the configuration file: it changes there (schedule_declared)", body = ErrorBody),
        (status = 413, description = "body too large", body = ErrorBody),
        (status = 422, description = "a field breaks a rule; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unreachable; or made, but fewer replicas than redis.min_replicas_acked confirmed it in time (not_replicated; asking again is safe)", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn put(
    State(state): State<AppState>,
    reach: Reach,
    Path(SchedulePath { id }): Path<SchedulePath>,
    body: Body,
) -> Result<Json<ScheduleView>, ApiError> {
    let (old, _) = changeable(&state, &reach, &id).await?;
    let value = read_json(body, SMALL_BODY).await?;
    let now = state.store.now_ms().await?;
    let spec = ScheduleSpec {
        created_at: old.created_at,
        ..parse(&state, &reach, &value, Some(&id), now)?
    };
    let written = crate::schedules::put(&state.store, state.ingest.journal(), &spec).await?;
    tracing::info!(schedule = spec.id, "schedule changed");
    written.replicated?;
    Ok(Json(view(spec, None).journaled(written.not_journaled)))
}

/// Delete a recurring schedule
#[utoipa::path(
    delete,
    path = "/v1/schedules/{id}",
    operation_id = "deleteSchedule",
    params(SchedulePath),
    responses(
        (status = 200, description = "deleted; the leader withdraws the occurrences it made ahead and that are not due yet", body = Object),
        (status = 404, description = "no such schedule", body = ErrorBody),
        (status = 409, description = "declared in the configuration file: it changes there (schedule_declared)", body = ErrorBody),
        (status = 503, description = "Redis unreachable; or made, but fewer replicas than redis.min_replicas_acked confirmed it in time (not_replicated; asking again is safe)", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn delete(
    State(state): State<AppState>,
    reach: Reach,
    Path(SchedulePath { id }): Path<SchedulePath>,
) -> Result<Json<Value>, ApiError> {
    changeable(&state, &reach, &id).await?;
    let written = crate::schedules::delete(&state.store, state.ingest.journal(), &id).await?;
    tracing::info!(schedule = id, "schedule deleted");
    written.replicated?;
    let mut answer = json!({ "id": id, "deleted": true });
    if written.not_journaled {
        answer["not_journaled"] = json!(true);
    }
    Ok(Json(answer))
}

/// Pause a recurring schedule
#[utoipa::path(
    post,
    path = "/v1/schedules/{id}/pause",
    operation_id = "pauseSchedule",
    params(SchedulePath),
    responses(
        (status = 200, description = "paused: no occurrence until resumed (those made ahead and not due yet are withdrawn)", body = ScheduleView),
        (status = 404, description = "no such schedule", body = ErrorBody),
        (status = 409, description = "declared in the configuration file: it changes there (schedule_declared)", body = ErrorBody),
        (status = 503, description = "Redis unreachable; or made, but fewer replicas than redis.min_replicas_acked confirmed it in time (not_replicated; asking again is safe)", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn pause(
    State(state): State<AppState>,
    reach: Reach,
    Path(SchedulePath { id }): Path<SchedulePath>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(&state, &reach, &id, true).await
}

/// Resume a paused recurring schedule
#[utoipa::path(
    post,
    path = "/v1/schedules/{id}/resume",
    operation_id = "resumeSchedule",
    params(SchedulePath),
    responses(
        (status = 200, description = "resumed: occurrences from now on (none of the paused time)", body = ScheduleView),
        (status = 404, description = "no such schedule", body = ErrorBody),
        (status = 409, description = "declared in the configuration file: it changes there (schedule_declared)", body = ErrorBody),
        (status = 503, description = "Redis unreachable; or made, but fewer replicas than redis.min_replicas_acked confirmed it in time (not_replicated; asking again is safe)", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn resume(
    State(state): State<AppState>,
    reach: Reach,
    Path(SchedulePath { id }): Path<SchedulePath>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(&state, &reach, &id, false).await
}

async fn set_paused(
    state: &AppState,
    reach: &Reach,
    id: &str,
    paused: bool,
) -> Result<Json<ScheduleView>, ApiError> {
    let (mut spec, _) = changeable(state, reach, id).await?;
    spec.paused = paused;
    if !paused {
        // Resumed: from now on, none of the paused time.
        spec.since = state.store.now_ms().await?;
    }
    // Stored afresh, it is made from `since` on: nothing made is known.
    let written = crate::schedules::put(&state.store, state.ingest.journal(), &spec).await?;
    tracing::info!(
        schedule = id,
        paused,
        "schedule {}",
        if paused { "paused" } else { "resumed" }
    );
    written.replicated?;
    Ok(Json(view(spec, None).journaled(written.not_journaled)))
}

/// The schedule `id`, if the token reaches its stream (404 otherwise, as for none).
async fn found(
    state: &AppState,
    reach: &Reach,
    id: &str,
) -> Result<(ScheduleSpec, Option<ScheduleState>), ApiError> {
    match state.store.schedule_spec(id).await? {
        Some((spec, made)) if reach.sees(&spec.stream) => Ok((spec, made)),
        _ => Err(ApiError::not_found(format!("schedule {id}: unknown"))),
    }
}

/// [`found`], refused when the configuration file declares it (409
/// `schedule_declared`): it changes there.
async fn changeable(
    state: &AppState,
    reach: &Reach,
    id: &str,
) -> Result<(ScheduleSpec, Option<ScheduleState>), ApiError> {
    let (spec, made) = found(state, reach, id).await?;
    if spec.declared {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "schedule_declared",
            format!(
                "schedule {id}: declared in the configuration file ([[schedules]]); change it there and reload (SIGHUP)"
            ),
        ));
    }
    Ok((spec, made))
}

impl ScheduleView {
    fn journaled(self, not_journaled: bool) -> ScheduleView {
        ScheduleView {
            not_journaled,
            ..self
        }
    }
}

fn view(spec: ScheduleSpec, made: Option<ScheduleState>) -> ScheduleView {
    let when = spec.validate(|_| Ok(())).ok();
    let next = match (&when, spec.paused) {
        (Some(when), false) => {
            let from = made.map(|m| m.next).or_else(|| spec.first(when));
            let mut next: Vec<i64> = from.into_iter().collect();
            if let Some(&first) = next.first() {
                next.extend(when.next_n(first, SHOWN_AHEAD - 1));
            }
            next.retain(|&at| spec.end_at.is_none_or(|end| at <= end as i64));
            next
        }
        _ => Vec::new(),
    };
    let last = made.and_then(|m| m.last);
    ScheduleView {
        missed: made.map_or(0, |m| m.missed),
        spec: serde_json::to_value(&spec).expect("a schedule serializes"),
        next,
        last,
        not_journaled: false,
    }
}

/// A request body as a schedule, every refusal naming its field; `id` is the
/// path's for a PUT.
fn parse(
    state: &AppState,
    reach: &Reach,
    value: &Value,
    id: Option<&str>,
    now: u64,
) -> Result<ScheduleSpec, ApiError> {
    let config = state.current_config();
    let obj = object(value, &KEYS, "body must be a JSON object")?;
    // The message part, read and checked as a push's.
    let mut push = Map::new();
    for name in ["stream", "payload", "fields", "key"] {
        if let Some(v) = obj.get(name) {
            push.insert(name.to_owned(), v.clone());
        }
    }
    push.insert("delay_ms".into(), json!(0));
    let (msg, _) = parse_push(&Value::Object(push), &config)?;
    reach.check(&msg.stream)?;
    let text = |name: &str| -> Result<Option<String>, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid(format!("{name}: must be a string"))),
        }
    };
    let duration = |name: &str| -> Result<Option<Duration>, ApiError> {
        text(name)?
            .map(|t| parse_duration(&t).map_err(|e| ApiError::invalid(format!("{name}: {e}"))))
            .transpose()
    };
    let id = match (id, text("id")?) {
        (Some(path), Some(body)) if path != body => {
            return Err(ApiError::invalid(format!(
                "id {body:?}: not the path's {path:?}"
            )));
        }
        (Some(path), _) => path.to_owned(),
        (None, Some(body)) => body,
        (None, None) => crate::message::MessageId::generate().as_str().to_owned(),
    };
    let misfire = match text("misfire")? {
        None => Misfire::Skip,
        Some(m) => Misfire::parse(&m).ok_or_else(|| {
            ApiError::invalid(format!("misfire {m:?}: must be skip, once or all"))
        })?,
    };
    let max_catch_up = match obj.get("max_catch_up") {
        None | Some(Value::Null) => DEFAULT_CATCH_UP,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ApiError::invalid(format!("max_catch_up {v}: must be 0 to 1000")))?,
    };
    let paused = match obj.get("paused") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("paused: must be true or false")),
    };
    let spec = ScheduleSpec {
        id,
        stream: msg.stream,
        fields: msg.fields,
        key: msg.key.map(|k| k.as_str().to_owned()),
        cron: text("cron")?,
        timezone: text("timezone")?,
        every: duration("every")?,
        start_at: instant(obj, "start_at")?,
        end_at: instant(obj, "end_at")?,
        jitter: duration("jitter")?,
        misfire,
        max_catch_up,
        paused,
        declared: false,
        created_at: now,
        since: now,
    };
    let _: When = spec.validate(|_| Ok(())).map_err(ApiError::invalid)?;
    Ok(spec)
}

/// `name` as an instant: epoch ms, or RFC 3339 text.
fn instant(obj: &Map<String, Value>, name: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(format!("{name} {n}: must be epoch milliseconds"))),
        Some(Value::String(s)) => s
            .parse::<jiff::Timestamp>()
            .ok()
            .and_then(|t| u64::try_from(t.as_millisecond()).ok())
            .map(Some)
            .ok_or_else(|| {
                ApiError::invalid(format!("{name} {s:?}: not an RFC 3339 time after 1970"))
            }),
        Some(_) => Err(ApiError::invalid(format!(
            "{name}: must be epoch milliseconds or an RFC 3339 time"
        ))),
    }
}

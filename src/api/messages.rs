//! `/v1/messages`: push (one or a batch), look up, cancel, reschedule.

use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::{ApiError, AppState};
use crate::config::Config;
use crate::message::{Due, Fields, MessageId, NewMessage, OwnFields, parse_duration};
use crate::metrics as m;
use crate::store::{BatchItem, Cancelled, Rescheduled, ScheduleMode, Scheduled, Status};

/// Reads a request body, refusing it past `limit` bytes with a 413 (a body that
/// breaks off is a 400).
pub(super) async fn read_json(body: Body, limit: usize) -> Result<Value, ApiError> {
    use futures::StreamExt;
    let mut chunks = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("cannot read the request body: {e}"),
            )
        })?;
        if bytes.len() + chunk.len() > limit {
            // Read the rest (up to a bound) and drop it, so that the client,
            // still sending, gets this answer instead of a reset connection.
            let mut drained = bytes.len() + chunk.len();
            while drained <= DRAIN_LIMIT {
                match chunks.next().await {
                    Some(Ok(more)) => drained += more.len(),
                    _ => break,
                }
            }
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("request body is larger than {limit} bytes"),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::malformed(format!("body is not valid JSON: {e}")))
}

/// How much of an over-long body is read and dropped before answering 413;
/// past it the connection is closed under the sender.
const DRAIN_LIMIT: usize = 8 << 20;

/// Largest body of a request that carries no message (reschedule, ack).
pub(super) const SMALL_BODY: usize = 64 * 1024;

/// Largest request body: a maximal message with room for JSON escaping and keys.
pub(super) fn body_limit(config: &Config) -> usize {
    config.api.limits.max_message_bytes * 2 + 64 * 1024
}

pub async fn push(State(state): State<AppState>, body: Body) -> Response {
    match push_inner(&state, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn push_inner(state: &AppState, body: Body) -> Result<Response, ApiError> {
    // The live configuration: the stream allow list can change on reload.
    let config = state.current_config();
    let value = read_json(body, body_limit(&config)).await?;
    let (msg, mode) = parse_push(&value, &config)?;
    let outcome = state
        .store
        .schedule(&msg, mode, state.config.api.limits.max_delay)
        .await?;
    tracing::debug!(id = msg.id.as_str(), stream = %msg.stream, ?outcome, "push");
    Ok(match outcome {
        Scheduled::Scheduled { due_ms } => {
            metrics::counter!(m::SCHEDULED).increment(1);
            (
                StatusCode::CREATED,
                Json(json!({ "id": msg.id.as_str(), "deliver_at": due_ms, "state": "scheduled" })),
            )
                .into_response()
        }
        Scheduled::Replaced { due_ms } => {
            metrics::counter!(m::SCHEDULED).increment(1);
            (StatusCode::OK, Json(json!({ "id": msg.id.as_str(), "deliver_at": due_ms, "state": "scheduled", "replaced": true }))).into_response()
        }
        Scheduled::Duplicate {
            due_ms,
            state: existing,
        } => {
            metrics::counter!(m::DUPLICATES).increment(1);
            (StatusCode::OK, Json(json!({ "id": msg.id.as_str(), "deliver_at": due_ms, "state": existing, "duplicate": true }))).into_response()
        }
    })
}

const PUSH_KEYS: &[&str] = &[
    "stream",
    "payload",
    "fields",
    "delay",
    "delay_ms",
    "deliver_at",
    "id",
    "priority",
    "ttl",
    "ttl_ms",
    "replace",
];

/// Turns a push body into a message, naming the field and the rule on any error.
pub fn parse_push(value: &Value, config: &Config) -> Result<(NewMessage, ScheduleMode), ApiError> {
    let obj = value
        .as_object()
        .ok_or_else(|| ApiError::malformed("body must be a JSON object"))?;
    if let Some(unknown) = obj.keys().find(|k| !PUSH_KEYS.contains(&k.as_str())) {
        return Err(ApiError::invalid(format!(
            "{unknown}: unknown field (known: {})",
            PUSH_KEYS.join(", ")
        )));
    }

    let stream = match obj.get("stream") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::invalid("stream: must be a string")),
        None => return Err(ApiError::invalid("stream: required")),
    };
    crate::message::validate_stream(&stream)?;
    check_stream_allowed(&stream, config)?;

    let fields = match (obj.get("payload"), obj.get("fields")) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("payload, fields: give one, not both")),
        (None, None) => return Err(ApiError::invalid("fields: required (or payload)")),
        (Some(Value::String(s)), None) => vec![("payload".to_owned(), s.clone())],
        (Some(Value::Null), None) => return Err(ApiError::invalid("payload: must not be null")),
        (Some(other), None) => vec![("payload".to_owned(), other.to_string())],
        (None, Some(fields)) => parse_fields(fields)?,
    };

    let due = parse_due(obj)?;
    let id = match obj.get("id") {
        None | Some(Value::Null) => MessageId::generate(),
        Some(Value::String(s)) => MessageId::parse(s)?,
        Some(_) => return Err(ApiError::invalid("id: must be a string")),
    };
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_u64() {
            Some(p) if p <= u64::from(crate::message::MAX_PRIORITY) => p as u8,
            _ => {
                return Err(ApiError::invalid(format!(
                    "priority {v}: must be an integer from 0 to 9"
                )));
            }
        },
    };
    let ttl = match (obj.get("ttl"), obj.get("ttl_ms")) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("ttl, ttl_ms: give one, not both")),
        (Some(v), None) => Some(human_duration("ttl", v)?),
        (None, Some(v)) => Some(Duration::from_millis(non_negative_ms("ttl_ms", v)?)),
        (None, None) => None,
    };
    let mode = match obj.get("replace") {
        None | Some(Value::Bool(false)) => ScheduleMode::New,
        Some(Value::Bool(true)) => ScheduleMode::Replace,
        Some(_) => return Err(ApiError::invalid("replace: must be true or false")),
    };
    let msg = NewMessage {
        id,
        stream,
        fields,
        due,
        priority,
        ttl,
    };
    msg.validate(&config.api.limits, &OwnFields::of(&config.forwarder))?;
    Ok((msg, mode))
}

pub(super) fn check_stream_allowed(stream: &str, config: &Config) -> Result<(), ApiError> {
    match config.target_refusal(stream) {
        Some(refusal) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "stream_not_allowed",
            refusal,
        )),
        None => Ok(()),
    }
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn parse_fields(v: &Value) -> Result<Fields, ApiError> {
    let pairs: Vec<(String, String)> = match v {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                scalar_text(v).map(|text| (k.clone(), text)).ok_or_else(|| {
                    ApiError::invalid(format!("fields.{k}: must be a string, number or boolean"))
                })
            })
            .collect::<Result<_, _>>()?,
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, pair)| match pair.as_array().map(Vec::as_slice) {
                Some([Value::String(k), v]) => {
                    scalar_text(v).map(|text| (k.clone(), text)).ok_or_else(|| {
                        ApiError::invalid(format!(
                            "fields[{i}]: value must be a string, number or boolean"
                        ))
                    })
                }
                _ => Err(ApiError::invalid(format!(
                    "fields[{i}]: must be a [name, value] pair"
                ))),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::invalid(
                "fields: must be an object or a list of [name, value] pairs",
            ));
        }
    };
    Ok(pairs)
}

fn parse_due(obj: &Map<String, Value>) -> Result<Due, ApiError> {
    let given: Vec<&str> = DUE_KEYS
        .iter()
        .copied()
        .filter(|k| obj.contains_key(*k))
        .collect();
    match given[..] {
        ["delay"] => Ok(Due::In(human_duration("delay", &obj["delay"])?)),
        ["delay_ms"] => Ok(Due::In(Duration::from_millis(non_negative_ms(
            "delay_ms",
            &obj["delay_ms"],
        )?))),
        ["deliver_at"] => parse_deliver_at(&obj["deliver_at"]),
        [] => Err(ApiError::invalid(
            "delay: required (or delay_ms, or deliver_at)",
        )),
        _ => Err(ApiError::invalid(format!(
            "{}: give only one",
            given.join(", ")
        ))),
    }
}

/// Parses `"20m"`-style text; a leading minus is called out as negative.
fn human_duration(key: &str, v: &Value) -> Result<Duration, ApiError> {
    match v {
        Value::String(s) if s.trim_start().starts_with('-') => Err(ApiError::invalid(format!(
            "{key} {s:?}: must not be negative"
        ))),
        Value::String(s) => parse_duration(s).map_err(|e| ApiError::invalid(format!("{key}: {e}"))),
        Value::Number(_) => Err(ApiError::invalid(format!(
            "{key}: must be text such as \"20m\"; for milliseconds use {key}_ms"
        ))),
        _ => Err(ApiError::invalid(format!(
            "{key}: must be text such as \"20m\""
        ))),
    }
}

fn non_negative_ms(key: &str, v: &Value) -> Result<u64, ApiError> {
    match v {
        Value::Number(n) if n.as_i64().is_some_and(|n| n < 0) => Err(ApiError::invalid(format!(
            "{key} {n}: must not be negative"
        ))),
        Value::Number(n) => n.as_u64().ok_or_else(|| {
            ApiError::invalid(format!("{key} {n}: must be a whole number of milliseconds"))
        }),
        _ => Err(ApiError::invalid(format!(
            "{key}: must be a whole number of milliseconds"
        ))),
    }
}

fn parse_deliver_at(v: &Value) -> Result<Due, ApiError> {
    match v {
        Value::Number(_) => Ok(Due::At(non_negative_ms("deliver_at", v)?)),
        Value::String(s) => {
            let ts: jiff::Timestamp = s.parse().map_err(|e| {
                ApiError::invalid(format!(
                    "deliver_at {s:?}: not an RFC 3339 time such as 2026-11-22T10:00:00Z ({e})"
                ))
            })?;
            let ms = ts.as_millisecond();
            if ms < 0 {
                return Err(ApiError::invalid(format!("deliver_at {s:?}: before 1970")));
            }
            Ok(Due::At(ms as u64))
        }
        _ => Err(ApiError::invalid(
            "deliver_at: must be epoch milliseconds or an RFC 3339 time",
        )),
    }
}

pub(super) fn path_id(id: &str) -> Result<MessageId, ApiError> {
    MessageId::parse(id)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_id", e.to_string()))
}

pub async fn status(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = path_id(&id)?;
    match state.store.get(&id).await? {
        Status::Unknown => Err(ApiError::not_found(format!(
            "message {id}: unknown (never scheduled, or its record expired)"
        ))),
        Status::Corrupt(why) => Ok(Json(
            json!({ "id": id.as_str(), "state": "corrupt", "detail": why }),
        )),
        Status::Scheduled(s) => Ok(Json(json!({
            "id": id.as_str(),
            "state": "scheduled",
            "stream": s.stream,
            "deliver_at": s.due_ms,
            "priority": s.priority,
            "created_at": s.created_ms,
            "attempt": s.attempt,
            "expires_at": s.expire_at_ms,
            "fields": s.fields.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        }))),
        Status::Done(r) => Ok(Json(json!({
            "id": id.as_str(),
            "state": r.state.as_str(),
            "stream": r.stream,
            "entry_id": r.entry_id,
            "at": r.at_ms,
            "attempt": r.attempt,
        }))),
    }
}

pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = path_id(&id)?;
    match state
        .store
        .cancel(&id, state.config.records.retention)
        .await?
    {
        Cancelled::Cancelled => {
            metrics::counter!(m::CANCELLED).increment(1);
            Ok(Json(json!({ "id": id.as_str(), "state": "cancelled" })).into_response())
        }
        Cancelled::AlreadyDone(done) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_final",
            format!(
                "message {id}: already {}, cannot be cancelled",
                done.as_str()
            ),
        )),
        Cancelled::Unknown => Err(ApiError::not_found(format!("message {id}: unknown"))),
    }
}

/// `POST /v1/messages/batch`: `{"messages": [push body, ...]}`, each item answered on
/// its own (in order, with the status a single push would have had).
pub async fn batch(State(state): State<AppState>, body: Body) -> Result<Response, ApiError> {
    // The live configuration: the stream allow list can change on reload.
    let config = state.current_config();
    let value = read_json(body, config.api.max_body_bytes).await?;
    let obj = value.as_object().ok_or_else(|| {
        ApiError::malformed("body must be a JSON object such as {\"messages\": [...]}")
    })?;
    if let Some(unknown) = obj.keys().find(|k| k.as_str() != "messages") {
        return Err(ApiError::invalid(format!(
            "{unknown}: unknown field (known: messages)"
        )));
    }
    let items = match obj.get("messages") {
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid("messages: must be a list of push bodies")),
        None => {
            return Err(ApiError::invalid(
                "messages: required (a list of push bodies)",
            ));
        }
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages: must hold at least one message",
        ));
    }
    if items.len() > config.api.max_batch {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "batch_too_large",
            format!(
                "messages: {} items is more than api.max_batch {}; split the batch",
                items.len(),
                config.api.max_batch
            ),
        ));
    }

    let mut results: Vec<Option<ItemResult>> = (0..items.len()).map(|_| None).collect();
    let mut valid = Vec::with_capacity(items.len());
    let mut positions = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match parse_push(item, &config) {
            Ok((msg, mode)) => {
                valid.push(BatchItem {
                    msg,
                    mode,
                    inbox_entry: None,
                });
                positions.push(i);
            }
            Err(e) => results[i] = Some(ItemResult::failed(i, e)),
        }
    }
    let outcomes = state
        .store
        .schedule_many(&valid, config.api.limits.max_delay, None)
        .await;
    let (mut scheduled, mut duplicates, mut unavailable) = (0u64, 0u64, 0usize);
    let stored_count = valid.len();
    for ((item, index), outcome) in valid.into_iter().zip(positions).zip(outcomes) {
        let id = item.msg.id.as_str().to_owned();
        let stored = |status, deliver_at, state: &str, duplicate, replaced| ItemResult::Stored {
            index,
            status,
            id,
            deliver_at,
            state: state.to_owned(),
            duplicate,
            replaced,
        };
        results[index] = Some(match outcome {
            Ok(Scheduled::Scheduled { due_ms }) => {
                scheduled += 1;
                stored(201, Some(due_ms), "scheduled", false, false)
            }
            Ok(Scheduled::Replaced { due_ms }) => {
                scheduled += 1;
                stored(200, Some(due_ms), "scheduled", false, true)
            }
            Ok(Scheduled::Duplicate { due_ms, state }) => {
                duplicates += 1;
                stored(200, due_ms, &state, true, false)
            }
            Err(e) => {
                if e.is_transient() {
                    unavailable += 1;
                }
                ItemResult::failed(index, ApiError::from(e))
            }
        });
    }
    if unavailable > 0 && unavailable == stored_count {
        // Nothing could be stored: one answer for the whole batch tells the client to retry it.
        return Err(ApiError::unavailable(
            "storage unavailable: no message of the batch could be stored; retry it",
        ));
    }
    metrics::counter!(m::SCHEDULED).increment(scheduled);
    metrics::counter!(m::DUPLICATES).increment(duplicates);
    let results: Vec<ItemResult> = results.into_iter().flatten().collect();
    let failed = results.len() as u64 - scheduled - duplicates;
    Ok(Json(BatchAnswer {
        scheduled,
        duplicates,
        failed,
        results,
    })
    .into_response())
}

/// The answer to a batch; typed rather than built as a JSON map, since a batch
/// answers thousands of items.
#[derive(serde::Serialize)]
struct BatchAnswer {
    scheduled: u64,
    duplicates: u64,
    failed: u64,
    results: Vec<ItemResult>,
}

/// One item's answer, with the status a single push would have had.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum ItemResult {
    Stored {
        index: usize,
        status: u16,
        id: String,
        deliver_at: Option<u64>,
        state: String,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        replaced: bool,
    },
    Failed {
        index: usize,
        status: u16,
        error: &'static str,
        detail: String,
    },
}

impl ItemResult {
    fn failed(index: usize, e: ApiError) -> Self {
        ItemResult::Failed {
            index,
            status: e.status.as_u16(),
            error: e.code,
            detail: format!("messages[{index}]: {}", e.detail),
        }
    }
}

/// The fields that say when a message is due; a request gives exactly one.
const DUE_KEYS: &[&str] = &["delay", "delay_ms", "deliver_at"];

/// `POST /v1/messages/{id}/reschedule`: a new due time (`delay`, `delay_ms` or
/// `deliver_at`) for a message still scheduled; fields, priority and ttl stay.
pub async fn reschedule(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let id = path_id(&id)?;
    let value = read_json(body, SMALL_BODY).await?;
    let obj = value.as_object().ok_or_else(|| {
        ApiError::malformed("body must be a JSON object such as {\"delay\": \"5m\"}")
    })?;
    if let Some(unknown) = obj.keys().find(|k| !DUE_KEYS.contains(&k.as_str())) {
        return Err(ApiError::invalid(format!(
            "{unknown}: unknown field (known: {})",
            DUE_KEYS.join(", ")
        )));
    }
    let due = parse_due(obj)?;
    let limits = &state.config.api.limits;
    limits.check_delay(due)?;
    match state.store.reschedule(&id, due, limits.max_delay).await? {
        Rescheduled::Rescheduled { due_ms } => {
            metrics::counter!(m::RESCHEDULED).increment(1);
            Ok(
                Json(json!({ "id": id.as_str(), "deliver_at": due_ms, "state": "scheduled" }))
                    .into_response(),
            )
        }
        Rescheduled::NotScheduled(done) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_final",
            format!(
                "message {id}: already {}, cannot be rescheduled",
                done.as_str()
            ),
        )),
        Rescheduled::Unknown => Err(ApiError::not_found(format!("message {id}: unknown"))),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::message::props::{expect, json, text};

    fn config() -> Config {
        Config::from_toml("[forwarder]\nid_field = \"msg-id\"", std::iter::empty()).unwrap()
    }

    /// A push of `x` to `orders` in 1s, with `extra`'s keys put over it (a due-time
    /// key replaces the delay).
    fn push(extra: Value) -> Result<NewMessage, ApiError> {
        let mut body = json!({ "stream": "orders", "payload": "x", "delay": "1s" });
        let extra = extra.as_object().unwrap();
        if extra.keys().any(|k| DUE_KEYS.contains(&k.as_str())) {
            body.as_object_mut().unwrap().remove("delay");
        }
        if extra.contains_key("fields") {
            body.as_object_mut().unwrap().remove("payload");
        }
        body.as_object_mut().unwrap().extend(extra.clone());
        parse_push(&body, &config()).map(|(msg, _)| msg)
    }

    #[test]
    fn own_field_names_are_refused_in_either_form() {
        for fields in [
            json!({ "a": "1", "delayq-id": "x" }),
            json!([["a", "1"], ["msg-id", "x"]]),
        ] {
            let refusal = push(json!({ "fields": fields })).unwrap_err();
            assert_eq!(refusal.status, StatusCode::UNPROCESSABLE_ENTITY);
            assert!(refusal.detail.contains("is reserved"), "{}", refusal.detail);
        }
    }

    proptest! {
        #[test]
        fn push_bodies_never_panic(body in json(PUSH_KEYS)) {
            let _ = parse_push(&body, &config());
        }

        #[test]
        fn push_fields_never_panic(fields in json(&["a", "delayq-id"]), due in json(DUE_KEYS)) {
            let _ = push(json!({ "fields": fields }));
            let _ = parse_deliver_at(&due);
        }

        #[test]
        fn deliver_at_epoch_ms_round_trips(ms: u64) {
            expect(&ms.to_string(), parse_deliver_at(&json!(ms)), Some(Due::At(ms)))?;
        }

        #[test]
        fn deliver_at_rfc3339_round_trips(ms in 0..=jiff::Timestamp::MAX.as_millisecond()) {
            let text = jiff::Timestamp::from_millisecond(ms).unwrap().to_string();
            expect(&text, parse_deliver_at(&json!(text)), Some(Due::At(ms as u64)))?;
        }

        #[test]
        fn deliver_at_before_1970_is_refused(ms in jiff::Timestamp::MIN.as_millisecond()..0) {
            let text = jiff::Timestamp::from_millisecond(ms).unwrap().to_string();
            expect(&text, parse_deliver_at(&json!(text)), None)?;
            expect(&text, parse_deliver_at(&json!(ms)), None)?;
        }

        #[test]
        fn deliver_at_text_that_is_not_a_time_is_refused(text in text()) {
            prop_assume!(text.parse::<jiff::Timestamp>().is_err());
            expect(&text, parse_deliver_at(&json!(text)), None)?;
        }

        #[test]
        fn delays_past_max_delay_are_refused_not_saturated(ms: u64) {
            let max = config().api.limits.max_delay.as_millis() as u64;
            let want = (ms <= max).then_some(Due::In(Duration::from_millis(ms)));
            expect(&ms.to_string(), push(json!({ "delay_ms": ms })).map(|m| m.due), want)?;
        }

        #[test]
        fn field_lists_round_trip(pairs in prop::collection::vec(("[a-z][a-z0-9_]{0,10}", "\\PC{0,20}"), 1..10)) {
            let got = push(json!({ "fields": pairs })).map(|m| m.fields);
            expect("fields", got, Some(pairs.clone()))?;
        }

        #[test]
        fn priorities_outside_0_to_9_are_refused(priority: i64) {
            let want = (0..=9).contains(&priority).then_some(priority as u8);
            expect(&priority.to_string(), push(json!({ "priority": priority })).map(|m| m.priority), want)?;
        }

        #[test]
        fn ttl_ms_round_trips(ms in 1u64..) {
            let want = Some(Some(Duration::from_millis(ms)));
            expect(&ms.to_string(), push(json!({ "ttl_ms": ms })).map(|m| m.ttl), want)?;
        }

        #[test]
        fn ttls_beyond_u64_milliseconds_are_refused(secs: u64) {
            let text = humantime::format_duration(Duration::from_secs(secs)).to_string();
            let fits = secs > 0 && secs.checked_mul(1000).is_some();
            let want = fits.then_some(Some(Duration::from_secs(secs)));
            expect(&text, push(json!({ "ttl": text })).map(|m| m.ttl), want)?;
        }
    }
}

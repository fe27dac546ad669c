//! `POST /v1/messages`: schedule one message. The body is read key by key so that
//! every refusal names its field and the rule; [`PushRequest`] is the documented
//! shape, and the keys it names are the only ones accepted.

use std::sync::LazyLock;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::due::{DeliverAt, human_duration, non_negative_ms, parse_due};
use super::given::{Given, Keyed};
use super::plain::{Plain, read_object};
use crate::api::input::{
    body_limit, check_stream_allowed, documented_keys, object, parse_json, read_body,
};
use crate::api::reach::{Reach, id_taken};
use crate::api::{ApiError, AppState, ErrorBody};
use crate::config::Config;
use crate::journal::Came;
use crate::message::{Fields, MessageId, MessageKey, NewMessage};
use crate::metrics as m;
use crate::store::{ScheduleMode, Scheduled};

/// A message to schedule: `payload` or `fields` (one of them), and exactly one of
/// `delay`, `delay_ms` and `deliver_at`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({ "stream": "orders", "payload": "order 42", "delay": "20m" }))]
pub struct PushRequest {
    /// The stream to XADD to when due; must match `streams.allow`.
    pub stream: String,
    /// The one-field case `payload=<value>`: text as is, any other JSON value (not
    /// null) as its JSON text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// XADDed verbatim and in order. Names beginning with `delayq-`, and the
    /// `forwarder.id_field` / `attempt_field` / `key_field` names, are refused (422).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<FieldsBody>,
    /// In how long, as text such as `"20m"`, `"1500ms"` or `"1h 30m"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "20m")]
    pub delay: Option<String>,
    /// In how many milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// When (a time in the past: as soon as possible).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<DeliverAt>,
    /// The message's id (if none is given, one that names the message's due time
    /// and priority is generated); a push with a known id is a duplicate, not a
    /// second message.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub id: Option<String>,
    /// Higher is forwarded first among messages due in the same millisecond.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<u8>,
    /// How long after it falls due the message may still be delivered, as text;
    /// past it, it goes to the dead-letter stream (`delayq-reason=expired`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// The same in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Replace the message of the same id if it is still scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replace: Option<bool>,
    /// A business key (`order-42`): the stream's messages that carry it can be
    /// listed and cancelled together (`/v1/streams/{stream}/keys/{key}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub key: Option<String>,
}

/// A message's fields: an object (in its order), or a list of `[name, value]` pairs.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum FieldsBody {
    Object(indexmap::IndexMap<String, Scalar>),
    Pairs(Vec<(String, Scalar)>),
}

/// A field's value: text (written byte for byte), or a number or boolean written as
/// its value (`1e2` as `100.0`; a number a double cannot hold exactly, past 2^53 and
/// not a 64-bit integer, is refused).
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Scalar {
    Text(String),
    #[schema(value_type = f64)]
    Number(serde_json::Number),
    Bool(bool),
}

/// The answer to a push or a reschedule.
#[derive(Debug, Serialize, ToSchema)]
pub struct Pushed {
    pub id: String,
    /// Epoch milliseconds by Redis's clock; null for a duplicate no longer scheduled.
    #[schema(required)]
    pub deliver_at: Option<u64>,
    /// `scheduled`, or for a duplicate the state of the message already known.
    pub state: String,
    /// The id was known: nothing was stored.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
    /// A message of the same id was replaced (`"replace": true`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replaced: bool,
    /// A reschedule the journal (`[journal]`) did not take within 1 s: Redis has
    /// it and the journal gets it when it answers, but a loss of Redis's data
    /// before then would undo it. Repeating the reschedule is safe.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub not_journaled: bool,
}

impl Pushed {
    pub fn scheduled(id: &MessageId, due_ms: u64) -> Self {
        Pushed {
            id: id.as_str().to_owned(),
            deliver_at: Some(due_ms),
            state: "scheduled".to_owned(),
            duplicate: false,
            replaced: false,
            not_journaled: false,
        }
    }
}

/// Schedule a message
#[utoipa::path(
    post,
    path = "/v1/messages",
    operation_id = "push",
    request_body = PushRequest,
    responses(
        (status = 201, description = "scheduled", body = Pushed),
        (status = 200, description = "duplicate (id known) or replaced", body = Pushed),
        (status = 400, description = "body is not JSON, or not an object", body = ErrorBody),
        (status = 403, description = "stream not allowed (stream_not_allowed), or out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 409, description = "the id names a message of a stream out of the token's reach (id_taken)", body = ErrorBody),
        (status = 413, description = "message over api.max_message_bytes, or body too large", body = ErrorBody),
        (status = 422, description = "a field breaks a rule; the detail names it", body = ErrorBody),
        (status = 500, description = "a fault of delayq's own", body = ErrorBody),
        (status = 503, description = "Redis unreachable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn push(State(state): State<AppState>, reach: Reach, body: Body) -> Response {
    match push_inner(&state, &reach, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn push_inner(state: &AppState, reach: &Reach, body: Body) -> Result<Response, ApiError> {
    // The live configuration: the stream allow list can change on reload.
    let config = state.current_config();
    let bytes = read_body(body, body_limit(&config)).await?;
    let (mut msg, mode) = parse_push_bytes(&bytes, &config)?;
    reach.check(&msg.stream)?;
    if mode == ScheduleMode::Fresh {
        super::place::place(&state.store, &config, vec![&mut msg]).await;
    }
    // An id made here names no message yet: only a producer's is looked up.
    if !reach.is_everything() && mode != ScheduleMode::Fresh {
        let found = state.store.get(&msg.id).await?;
        if !reach.sees_status(&found, &config.forwarder.dead_letter_suffix) {
            return Err(id_taken(msg.id.as_str()));
        }
    }
    let outcome = state
        .ingest
        .schedule(
            &msg,
            mode,
            state.config.api.limits.max_delay,
            &Came::api("http", &state.config.node_id, &reach.who),
        )
        .await?;
    tracing::debug!(id = msg.id.as_str(), stream = %msg.stream, ?outcome, "push");
    let (status, answer) = match outcome {
        Scheduled::Scheduled { due_ms } => {
            metrics::counter!(m::SCHEDULED).increment(1);
            (StatusCode::CREATED, Pushed::scheduled(&msg.id, due_ms))
        }
        Scheduled::Replaced { due_ms } => {
            metrics::counter!(m::SCHEDULED).increment(1);
            let replaced = Pushed {
                replaced: true,
                ..Pushed::scheduled(&msg.id, due_ms)
            };
            (StatusCode::OK, replaced)
        }
        Scheduled::Duplicate {
            due_ms,
            state: existing,
        } => {
            metrics::counter!(m::DUPLICATES).increment(1);
            let duplicate = Pushed {
                id: msg.id.as_str().to_owned(),
                deliver_at: due_ms,
                state: existing,
                duplicate: true,
                replaced: false,
                not_journaled: false,
            };
            (StatusCode::OK, duplicate)
        }
    };
    Ok((status, Json(answer)).into_response())
}

/// The keys a push body may hold: [`PushRequest`]'s documented properties.
pub(super) static PUSH_KEYS: LazyLock<Vec<String>> = LazyLock::new(documented_keys::<PushRequest>);

/// Turns a push body into a message, naming the field and the rule on any error.
pub(in crate::api) fn parse_push(
    value: &Value,
    config: &Config,
) -> Result<(NewMessage, ScheduleMode), ApiError> {
    let obj = object(value, &PUSH_KEYS, "body must be a JSON object")?;
    parse_push_body(obj, config)
}

/// [`parse_push`] of a body's bytes: one of the common shape ([`Plain`]) read
/// straight into its values, any other (and any that is not JSON) through the tree.
pub(super) fn parse_push_bytes(
    bytes: &[u8],
    config: &Config,
) -> Result<(NewMessage, ScheduleMode), ApiError> {
    match parse_push_json(bytes, config) {
        Some(parsed) => parsed,
        // Not JSON a tree holds: the tree's refusal says why.
        None => parse_push(&parse_json(bytes)?, config),
    }
}

/// [`parse_push_bytes`] of bytes that are JSON a tree holds; None for any other.
pub(super) fn parse_push_json(
    bytes: &[u8],
    config: &Config,
) -> Option<Result<(NewMessage, ScheduleMode), ApiError>> {
    match read_object::<Plain>(bytes) {
        Some(plain) => Some(parse_push_body(&plain, config)),
        None => serde_json::from_slice(bytes)
            .ok()
            .map(|value| parse_push(&value, config)),
    }
}

/// The rules of a push, over its keys however they were read.
fn parse_push_body(
    obj: &impl Keyed,
    config: &Config,
) -> Result<(NewMessage, ScheduleMode), ApiError> {
    let stream = match obj.get("stream") {
        Some(Given::Text(s)) => s.to_owned(),
        Some(_) => return Err(ApiError::invalid("stream: must be a string")),
        None => return Err(ApiError::invalid("stream: required")),
    };
    crate::message::validate_stream(&stream)?;
    check_stream_allowed(&stream, config)?;

    let fields = match (obj.get("payload"), obj.get("fields")) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("payload, fields: give one, not both")),
        (None, None) => return Err(ApiError::invalid("fields: required (or payload)")),
        (Some(Given::Text(s)), None) => vec![("payload".to_owned(), s.to_owned())],
        (Some(other), None) if other.is_null() => {
            return Err(ApiError::invalid("payload: must not be null"));
        }
        (Some(other), None) => {
            if let Given::Tree(tree) = other {
                exact_numbers("payload", tree)?;
            }
            vec![("payload".to_owned(), other.to_string())]
        }
        (None, Some(Given::Tree(fields))) => parse_fields(fields)?,
        (None, Some(_)) => return Err(not_fields()),
    };

    let due = parse_due(obj)?;
    // An id made here is new to Redis: stored without looking it up. Ids made in
    // one millisecond share a shard (on Redis Cluster the stream names the shard).
    let (id, made_here) = match obj.given("id") {
        None => (
            MessageId::generate_in(super::place::id_shards(config)),
            true,
        ),
        Some(Given::Text(s)) => (MessageId::parse(s)?, false),
        Some(_) => return Err(ApiError::invalid("id: must be a string")),
    };
    let priority = match obj.given("priority") {
        None => 0,
        Some(Given::Whole(p)) if p <= u64::from(crate::message::MAX_PRIORITY) => p as u8,
        Some(v) => {
            return Err(ApiError::invalid(format!(
                "priority {v}: must be an integer from 0 to 9"
            )));
        }
    };
    // An optional key given as null is not given, as for `id` and `priority`.
    let ttl = match (obj.given("ttl"), obj.given("ttl_ms")) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("ttl, ttl_ms: give one, not both")),
        (Some(v), None) => Some(human_duration("ttl", v)?),
        (None, Some(v)) => Some(Duration::from_millis(non_negative_ms("ttl_ms", v)?)),
        (None, None) => None,
    };
    let mode = match obj.given("replace") {
        None | Some(Given::Flag(false)) => ScheduleMode::New,
        Some(Given::Flag(true)) => ScheduleMode::Replace,
        Some(_) => return Err(ApiError::invalid("replace: must be true or false")),
    };
    let mode = if made_here { ScheduleMode::Fresh } else { mode };
    let key = match obj.given("key") {
        None => None,
        Some(Given::Text(s)) => Some(MessageKey::parse(s)?),
        Some(_) => return Err(ApiError::invalid("key: must be a string")),
    };
    let msg = NewMessage::new(stream, fields, due)
        .with_id(id)
        .with_priority(priority)
        .with_ttl(ttl)
        .with_key(key);
    msg.validate(&config.api.limits, &config.own_fields())?;
    Ok((msg, mode))
}

fn not_fields() -> ApiError {
    ApiError::invalid("fields: must be an object or a list of [name, value] pairs")
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Past this a number that is not a 64-bit integer loses digits (it is read as a
/// double, which holds every integer only up to 2^53).
const EXACT_UP_TO: f64 = 9_007_199_254_740_992.0;

/// Refuses a number in `v` (`what` names where) that would not be written as sent:
/// one read as a double beyond 2^53, such as an integer past 64 bits. A number is
/// written as its value (`1e2` as `100.0`); text keeps anything byte for byte.
fn exact_numbers(what: &str, v: &Value) -> Result<(), ApiError> {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() && x.abs() >= EXACT_UP_TO => Err(ApiError::invalid(format!(
                "{what}: the number {n} cannot be kept exactly (past 2^53 and not a 64-bit integer); send it as a string"
            ))),
            _ => Ok(()),
        },
        Value::Array(items) => items.iter().try_for_each(|item| exact_numbers(what, item)),
        Value::Object(map) => map.values().try_for_each(|item| exact_numbers(what, item)),
        _ => Ok(()),
    }
}

fn parse_fields(v: &Value) -> Result<Fields, ApiError> {
    let pairs: Vec<(String, String)> = match v {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                exact_numbers(&format!("fields.{k}"), v)?;
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
                    exact_numbers(&format!("fields[{i}]"), v)?;
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
        _ => return Err(not_fields()),
    };
    Ok(pairs)
}

#[cfg(test)]
pub(super) mod tests;

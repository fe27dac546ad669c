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
use crate::api::input::{body_limit, check_stream_allowed, documented_keys, object, read_json};
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
    let value = read_json(body, body_limit(&config)).await?;
    let (mut msg, mode) = parse_push(&value, &config)?;
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
        (Some(other), None) => {
            exact_numbers("payload", other)?;
            vec![("payload".to_owned(), other.to_string())]
        }
        (None, Some(fields)) => parse_fields(fields)?,
    };

    let due = parse_due(obj)?;
    // An id made here is new to Redis: stored without looking it up. Ids made in
    // one millisecond share a shard (on Redis Cluster the stream names the shard).
    let (id, made_here) = match obj.get("id") {
        None | Some(Value::Null) => (
            MessageId::generate_in(super::place::id_shards(config)),
            true,
        ),
        Some(Value::String(s)) => (MessageId::parse(s)?, false),
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
    // An optional key given as null is not given, as for `id` and `priority`.
    let given = |key: &str| obj.get(key).filter(|v| !v.is_null());
    let ttl = match (given("ttl"), given("ttl_ms")) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("ttl, ttl_ms: give one, not both")),
        (Some(v), None) => Some(human_duration("ttl", v)?),
        (None, Some(v)) => Some(Duration::from_millis(non_negative_ms("ttl_ms", v)?)),
        (None, None) => None,
    };
    let mode = match given("replace") {
        None | Some(Value::Bool(false)) => ScheduleMode::New,
        Some(Value::Bool(true)) => ScheduleMode::Replace,
        Some(_) => return Err(ApiError::invalid("replace: must be true or false")),
    };
    let mode = if made_here { ScheduleMode::Fresh } else { mode };
    let key = match given("key") {
        None => None,
        Some(Value::String(s)) => Some(MessageKey::parse(s)?),
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
        _ => {
            return Err(ApiError::invalid(
                "fields: must be an object or a list of [name, value] pairs",
            ));
        }
    };
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::super::due::DUE_KEYS;
    use super::*;
    use crate::message::Due;
    use delayq_harness::props::{expect, json};

    fn config() -> Config {
        Config::from_toml("[forwarder]\nid_field = \"msg-id\"", std::iter::empty()).unwrap()
    }

    /// The push keys, for the strategies that want them static.
    fn keys() -> &'static [&'static str] {
        static KEYS: LazyLock<Vec<&'static str>> =
            LazyLock::new(|| PUSH_KEYS.iter().map(String::as_str).collect());
        &KEYS
    }

    /// `parse_push`, checking on the way that a body it accepts is one the
    /// documented type describes.
    fn parse(body: &Value) -> Result<(NewMessage, ScheduleMode), ApiError> {
        let parsed = parse_push(body, &config());
        if parsed.is_ok() {
            let typed = serde_json::from_value::<PushRequest>(body.clone());
            assert!(typed.is_ok(), "accepted {body}, undocumented: {typed:?}");
        }
        parsed
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
        parse(&body).map(|(msg, _)| msg)
    }

    #[test]
    fn the_accepted_keys_are_the_documented_ones_in_order() {
        assert_eq!(
            keys(),
            [
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
                "key"
            ]
        );
        let refusal = push(json!({ "colour": "red" })).unwrap_err();
        assert_eq!(
            refusal.detail,
            format!("colour: unknown field (known: {})", keys().join(", "))
        );
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

    /// An optional key sent as null is the key left out.
    #[test]
    fn null_optional_keys_are_not_given() {
        let plain = push(json!({})).unwrap();
        for extra in [
            json!({ "id": null }),
            json!({ "priority": null }),
            json!({ "ttl": null }),
            json!({ "ttl_ms": null }),
            json!({ "ttl": null, "ttl_ms": null }),
        ] {
            let msg = push(extra.clone()).unwrap();
            assert_eq!(
                (msg.priority, msg.ttl),
                (plain.priority, plain.ttl),
                "{extra}"
            );
        }
        let body = json!({ "stream": "orders", "payload": "x", "delay": "1s", "id": "o-1", "replace": null });
        assert_eq!(parse(&body).unwrap().1, ScheduleMode::New);
        let both = push(json!({ "ttl": "1h", "ttl_ms": 5 })).unwrap_err();
        assert_eq!(both.detail, "ttl, ttl_ms: give one, not both");
    }

    #[test]
    fn an_id_made_here_is_fresh_and_one_given_is_not() {
        for (extra, mode) in [
            (json!({}), ScheduleMode::Fresh),
            (json!({ "id": null }), ScheduleMode::Fresh),
            (json!({ "replace": true }), ScheduleMode::Fresh),
            (json!({ "id": "o-1" }), ScheduleMode::New),
            (json!({ "id": "o-1", "replace": false }), ScheduleMode::New),
            (
                json!({ "id": "o-1", "replace": true }),
                ScheduleMode::Replace,
            ),
        ] {
            let mut body = json!({ "stream": "orders", "payload": "x", "delay": "1s" });
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            assert_eq!(parse(&body).unwrap().1, mode, "{extra}");
        }
    }

    #[test]
    fn every_form_of_each_field_is_documented() {
        for extra in [
            json!({ "payload": { "a": [1, null] } }),
            json!({ "payload": 5 }),
            json!({ "fields": { "a": "1", "b": 2.5, "c": true } }),
            json!({ "fields": [["a", "1"], ["b", -2], ["c", false]] }),
            json!({ "delay_ms": 5 }),
            json!({ "deliver_at": 1_600_000_000_000u64 }),
            json!({ "deliver_at": "2026-11-22T10:00:00Z" }),
            json!({ "id": "order-42", "priority": 9, "ttl": "1h", "replace": true }),
            json!({ "id": null, "priority": null, "ttl_ms": 1000, "replace": false }),
            json!({ "ttl": null, "ttl_ms": 1000, "replace": null }),
            json!({ "ttl": "1h", "ttl_ms": null }),
        ] {
            push(extra.clone()).unwrap_or_else(|e| panic!("{extra}: {}", e.detail));
        }
    }

    /// Numbers are written as their value; one that a double cannot hold exactly
    /// is refused, wherever it is, rather than written with other digits.
    #[test]
    fn numbers_are_written_as_their_value_or_refused() {
        #[rustfmt::skip]
        let cases: &[(&str, Option<&str>)] = &[
            (r#"{"fields": {"n": 42}}"#, Some("42")),
            (r#"{"fields": {"n": -9223372036854775808}}"#, Some("-9223372036854775808")),
            (r#"{"fields": {"n": 18446744073709551615}}"#, Some("18446744073709551615")),
            (r#"{"fields": {"n": 2.5}}"#, Some("2.5")),
            (r#"{"fields": {"n": 1e2}}"#, Some("100.0")),
            (r#"{"fields": {"n": 9007199254740991.0}}"#, Some("9007199254740991.0")),
            (r#"{"fields": {"n": 9007199254740992.0}}"#, None),
            (r#"{"fields": {"n": 18446744073709551616}}"#, None),
            (r#"{"fields": {"n": -9223372036854775809}}"#, None),
            (r#"{"fields": [["n", 12345678901234567890123]]}"#, None),
            (r#"{"payload": 12345678901234567890123}"#, None),
            (r#"{"payload": {"a": [1, {"b": 1e300}]}}"#, None),
            (r#"{"payload": {"a": [1, {"b": 1.5}]}}"#, Some(r#"{"a":[1,{"b":1.5}]}"#)),
        ];
        for (extra, want) in cases {
            let got = push(serde_json::from_str(extra).unwrap());
            match (got, want) {
                (Ok(msg), Some(text)) => assert_eq!(msg.fields[0].1, *text, "{extra}"),
                (Err(e), None) => assert!(
                    e.detail.contains("cannot be kept exactly"),
                    "{extra}: {}",
                    e.detail
                ),
                (got, want) => panic!("{extra}: {got:?}, wanted {want:?}"),
            }
        }
    }

    proptest! {
        #[test]
        fn numbers_a_double_holds_exactly_are_written_as_that_double(x in -EXACT_UP_TO..EXACT_UP_TO) {
            let body = format!(r#"{{"fields": {{"n": {x:e}}}}}"#);
            let msg = push(serde_json::from_str(&body).unwrap()).unwrap();
            prop_assert_eq!(msg.fields[0].1.parse::<f64>().unwrap(), x, "{}", body);
        }

        #[test]
        fn push_bodies_never_panic(body in json(keys())) {
            let _ = parse(&body);
        }

        #[test]
        fn push_fields_never_panic(fields in json(&["a", "delayq-id"])) {
            let _ = push(json!({ "fields": fields }));
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

//! Consumption over HTTP, for clients without Redis: `GET /v1/streams/{stream}/next`
//! long-polls a consumer group, `POST /v1/streams/{stream}/ack` acknowledges.

use std::sync::LazyLock;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::input::{
    ENTRY_ID_RULE, SMALL_BODY, StrictQuery, check_stream_allowed, documented_keys, entry_id,
    object, read_json,
};
use super::reach::Reach;
use super::{ApiError, AppState, ErrorBody};
use crate::message::parse_duration_field;

/// Wait when the request names none, unless `api.max_wait` is shorter.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
const MAX_COUNT: usize = 1000;
const MAX_ACK_IDS: usize = 10_000;

/// The stream named in the path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct StreamPath {
    /// The target stream; must match `streams.allow`.
    pub stream: String,
}

/// The parameters of a long poll. [`next`] reads them one by one from the query's
/// pairs, so that each refusal names its parameter (and a repeated one is not an
/// error); the names documented here are the only ones it accepts.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code, reason = "the handler reads the pairs; this documents them")]
pub struct NextQuery {
    /// The consumer group (created on first use, reading from the stream's start).
    group: String,
    /// The consumer within the group.
    consumer: String,
    /// How long to wait for the first entry: milliseconds or human (`"30s"`); at
    /// most `api.max_wait`; 0 answers at once.
    #[param(default = "30s")]
    wait: Option<String>,
    /// At most this many entries.
    #[param(minimum = 1, maximum = 1000, default = 1)]
    count: Option<usize>,
}

/// Entries handed to a consumer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Polled {
    stream: String,
    group: String,
    consumer: String,
    /// Empty when the wait ran out.
    messages: Vec<Entry>,
}

/// A stream entry.
#[derive(Debug, Serialize, ToSchema)]
pub struct Entry {
    /// The stream entry id, for the ack.
    #[schema(example = "1700000000000-0")]
    id: String,
    /// `[name, value]` pairs, in order.
    fields: Vec<(String, String)>,
}

/// Entries of a consumer group to acknowledge.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({ "group": "billing", "ids": ["1700000000000-0"] }))]
pub struct AckRequest {
    pub group: String,
    /// 1 to 10000 stream entry ids.
    pub ids: Vec<String>,
}

/// The answer to an ack.
#[derive(Debug, Serialize, ToSchema)]
pub struct Acked {
    stream: String,
    group: String,
    /// Entries that were pending.
    acked: u64,
}

static ACK_KEYS: LazyLock<Vec<String>> = LazyLock::new(documented_keys::<AckRequest>);

/// The path's stream, checked: a valid name the configuration allows and the token
/// reaches.
pub(super) fn checked_stream(
    stream: &str,
    state: &AppState,
    reach: &Reach,
) -> Result<(), ApiError> {
    crate::message::validate_stream(stream)?;
    check_stream_allowed(stream, &state.current_config())?;
    reach.check(stream)
}

/// A consumer group or consumer name: plain printable text.
fn name(key: &str, value: Option<&str>) -> Result<String, ApiError> {
    let value = value.ok_or_else(|| ApiError::invalid(format!("{key}: required")))?;
    if value.is_empty() || value.len() > 256 || !crate::message::is_plain(value) {
        return Err(ApiError::invalid(format!(
            "{key} {value:?}: must be 1 to 256 bytes (UTF-8), without spaces or control characters"
        )));
    }
    Ok(value.to_owned())
}

/// Long-poll a consumer group for entries
///
/// Entries not yet delivered to the group, waiting up to `wait` for the first. The
/// group is created if missing, reading from the stream's start. An entry read stays
/// pending for the consumer until acknowledged.
#[utoipa::path(
    get,
    path = "/v1/streams/{stream}/next",
    operation_id = "next",
    params(StreamPath, NextQuery),
    responses(
        (status = 200, description = "entries (an empty list when the wait ran out)", body = Polled),
        (status = 400, description = "query cannot be parsed, or names an unknown parameter (bad_query)", body = ErrorBody),
        (status = 403, description = "stream not allowed (stream_not_allowed), or out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 409, description = "the key is not a stream", body = ErrorBody),
        (status = 422, description = "a parameter breaks a rule; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unreachable, or api.max_polls polls waiting already (busy)", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn next(
    State(state): State<AppState>,
    reach: Reach,
    Path(StreamPath { stream }): Path<StreamPath>,
    StrictQuery(params): StrictQuery<Vec<(String, String)>>,
) -> Result<Json<Polled>, ApiError> {
    checked_stream(&stream, &state, &reach)?;
    // A parameter it does not take was refused before it (`query::refuse_unknown`).
    let param = |key: &str| {
        params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.trim().is_empty())
    };
    let group = name("group", param("group"))?;
    let consumer = name("consumer", param("consumer"))?;
    let max_wait = state.config.api.max_wait;
    let wait = match param("wait") {
        None => DEFAULT_WAIT.min(max_wait),
        Some(text) => {
            let wait = parse_duration_field("wait", text).map_err(ApiError::invalid)?;
            if wait > max_wait {
                return Err(ApiError::invalid(format!(
                    "wait {}: longer than api.max_wait {}",
                    crate::human::duration(wait),
                    crate::human::duration(max_wait)
                )));
            }
            wait
        }
    };
    let count = match param("count") {
        None => 1,
        Some(text) => match text.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_COUNT).contains(&n) => n,
            _ => {
                return Err(ApiError::invalid(format!(
                    "count {text:?}: must be an integer from 1 to {MAX_COUNT}"
                )));
            }
        },
    };
    let entries = state
        .store
        .read_group(&stream, &group, &consumer, count, wait)
        .await?;
    let messages = entries
        .into_iter()
        .map(|e| Entry {
            id: e.id,
            fields: e.fields,
        })
        .collect();
    Ok(Json(Polled {
        stream,
        group,
        consumer,
        messages,
    }))
}

/// Acknowledge entries read with next
#[utoipa::path(
    post,
    path = "/v1/streams/{stream}/ack",
    operation_id = "ack",
    params(StreamPath),
    request_body = AckRequest,
    responses(
        (status = 200, description = "acknowledged", body = Acked),
        (status = 400, description = "body is not JSON, or not an object", body = ErrorBody),
        (status = 403, description = "stream not allowed (stream_not_allowed), or out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 409, description = "the key is not a stream", body = ErrorBody),
        (status = 413, description = "body too large", body = ErrorBody),
        (status = 422, description = "a field breaks a rule; the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unreachable", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn ack(
    State(state): State<AppState>,
    reach: Reach,
    Path(StreamPath { stream }): Path<StreamPath>,
    body: Body,
) -> Result<Json<Acked>, ApiError> {
    checked_stream(&stream, &state, &reach)?;
    let (group, ids) = parse_ack(&read_json(body, SMALL_BODY * 16).await?)?;
    let acked = state.store.ack(&stream, &group, &ids).await?;
    Ok(Json(Acked {
        stream,
        group,
        acked,
    }))
}

/// An ack body: the group and the entry ids, each refusal naming its field.
fn parse_ack(value: &Value) -> Result<(String, Vec<String>), ApiError> {
    let obj = object(
        value,
        &ACK_KEYS,
        "body must be a JSON object such as {\"group\": \"g\", \"ids\": [\"1-0\"]}",
    )?;
    let group = match obj.get("group") {
        None => return Err(ApiError::invalid("group: required")),
        Some(Value::String(g)) => name("group", Some(g))?,
        Some(_) => return Err(ApiError::invalid("group: must be a string")),
    };
    let ids = match obj.get("ids") {
        None => {
            return Err(ApiError::invalid(
                "ids: required (a list of stream entry ids)",
            ));
        }
        Some(Value::Array(ids)) => ids,
        Some(_) => return Err(ApiError::invalid("ids: must be a list of stream entry ids")),
    };
    if ids.is_empty() || ids.len() > MAX_ACK_IDS {
        return Err(ApiError::invalid(format!(
            "ids: must hold 1 to {MAX_ACK_IDS} entry ids (got {})",
            ids.len()
        )));
    }
    let ids = ids
        .iter()
        .enumerate()
        .map(|(i, id)| match id {
            Value::String(s) if entry_id(s) => Ok(s.clone()),
            other => Err(ApiError::invalid(format!(
                "ids[{i}] {other}: {ENTRY_ID_RULE}"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((group, ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// What the reader takes, the documented type reads too.
        #[test]
        fn an_accepted_ack_is_a_documented_one(body in delayq_harness::props::json(&["group", "ids"])) {
            if parse_ack(&body).is_ok() {
                proptest::prop_assert!(serde_json::from_value::<AckRequest>(body.clone()).is_ok(), "{}", body);
            }
        }
    }

    #[test]
    fn an_ack_reads_its_group_and_ids() {
        let body = serde_json::json!({ "group": "g", "ids": ["1-0", "17"] });
        let (group, ids) = parse_ack(&body).unwrap();
        assert_eq!(
            (group.as_str(), ids),
            ("g", vec!["1-0".to_owned(), "17".to_owned()])
        );
        serde_json::from_value::<AckRequest>(body).unwrap();
    }

    #[test]
    fn the_accepted_names_are_the_documented_ones() {
        assert_eq!(*ACK_KEYS, ["group", "ids"]);
    }
}

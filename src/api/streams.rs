//! Consumption over HTTP, for clients without Redis: `GET /v1/streams/{stream}/next`
//! long-polls a consumer group, `POST /v1/streams/{stream}/ack` acknowledges.

use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::messages::{SMALL_BODY, check_stream_allowed, read_json};
use super::{ApiError, AppState};
use crate::message::parse_duration_field;

/// Wait when the request names none, unless `api.max_wait` is shorter.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
const MAX_COUNT: usize = 1000;
const MAX_ACK_IDS: usize = 10_000;
const NEXT_PARAMS: &[&str] = &["group", "consumer", "wait", "count"];

fn checked_stream(stream: &str, state: &AppState) -> Result<(), ApiError> {
    crate::message::validate_stream(stream)?;
    check_stream_allowed(stream, &state.current_config())
}

/// A consumer group or consumer name: plain printable text.
fn name(key: &str, value: Option<&str>) -> Result<String, ApiError> {
    let value = value.ok_or_else(|| ApiError::invalid(format!("{key}: required")))?;
    if value.is_empty() || value.len() > 256 || !crate::message::is_plain(value) {
        return Err(ApiError::invalid(format!(
            "{key} {value:?}: must be 1 to 256 characters, without spaces or control characters"
        )));
    }
    Ok(value.to_owned())
}

/// `GET /v1/streams/{stream}/next?group=&consumer=&wait=30s&count=1`: entries not yet
/// delivered to the group, waiting up to `wait` for the first. Each stays pending for
/// the consumer until acknowledged.
pub async fn next(
    State(state): State<AppState>,
    Path(stream): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    checked_stream(&stream, &state)?;
    let Query(params) = query.map_err(bad_query)?;
    if let Some((unknown, _)) = params
        .iter()
        .find(|(k, _)| !NEXT_PARAMS.contains(&k.as_str()))
    {
        return Err(ApiError::invalid(format!(
            "{unknown}: unknown parameter (known: {})",
            NEXT_PARAMS.join(", ")
        )));
    }
    let param = |key: &str| {
        params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
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
                    humantime::format_duration(wait),
                    humantime::format_duration(max_wait)
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
    let messages: Vec<Value> = entries
        .into_iter()
        .map(|e| json!({ "id": e.id, "fields": e.fields.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>() }))
        .collect();
    Ok(Json(
        json!({ "stream": stream, "group": group, "consumer": consumer, "messages": messages }),
    ))
}

/// A query string that cannot be read as parameters.
pub(super) fn bad_query(e: QueryRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad_query", e.body_text())
}

/// A stream entry id: `<ms>-<seq>` (or `<ms>`), each part below 2^64.
pub(super) fn entry_id(id: &str) -> bool {
    crate::message::EntryId::parse(id).is_some()
}

/// How an entry id refusal ends, after the id.
pub(super) const ENTRY_ID_RULE: &str =
    "not a stream entry id such as \"1700000000000-0\" (two whole numbers below 2^64)";

/// `POST /v1/streams/{stream}/ack` with `{"group": "g", "ids": ["1700000000000-0"]}`.
pub async fn ack(
    State(state): State<AppState>,
    Path(stream): Path<String>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    checked_stream(&stream, &state)?;
    let value = read_json(body, SMALL_BODY * 16).await?;
    let obj = value.as_object().ok_or_else(|| {
        ApiError::malformed(
            "body must be a JSON object such as {\"group\": \"g\", \"ids\": [\"1-0\"]}",
        )
    })?;
    if let Some(unknown) = obj.keys().find(|k| !["group", "ids"].contains(&k.as_str())) {
        return Err(ApiError::invalid(format!(
            "{unknown}: unknown field (known: group, ids)"
        )));
    }
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
    let acked = state.store.ack(&stream, &group, &ids).await?;
    Ok(Json(
        json!({ "stream": stream, "group": group, "acked": acked }),
    ))
}

#[cfg(test)]
mod tests {
    use super::entry_id;

    #[test]
    fn entry_ids() {
        for (id, ok) in [
            ("1700000000000-0", true),
            ("1-2", true),
            ("17", true),
            ("", false),
            ("1-", false),
            ("-1", false),
            ("a-1", false),
            ("1-2-3", false),
            ("1 -2", false),
            ("18446744073709551615-18446744073709551615", true),
            ("18446744073709551616-0", false),
            ("1-18446744073709551616", false),
            ("99999999999999999999999-0", false),
        ] {
            assert_eq!(entry_id(id), ok, "{id:?}");
        }
    }
}

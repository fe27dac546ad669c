//! What every handler reads from a request before its own rules: the body, within a
//! limit, as a JSON object holding only the keys its documented type names; a
//! message id from the path; a stream checked against the allow list.

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Query};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use utoipa::PartialSchema;
use utoipa::openapi::{RefOr, Schema};

use super::ApiError;
use crate::config::Config;
use crate::message::MessageId;

/// Reads an optional query parameter, a blank one (`?after=&limit=`) as not given:
/// a page's link with nothing after the `=` means "the default", not "zero".
pub(super) fn blank_as_none<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let text: Option<String> = serde::Deserialize::deserialize(d)?;
    match text.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// Largest body of a request that carries no message (reschedule, ack).
pub(super) const SMALL_BODY: usize = 64 * 1024;

/// Largest request body of a single push: a maximal message escaped the longest way
/// JSON allows (`\u0001` is six bytes for one, `\u00e9` six for two), with room
/// for its keys and the fields' punctuation; but never more than a batch may send
/// (`api.max_body_bytes`) unless twice the message needs more.
pub(super) fn body_limit(config: &Config) -> usize {
    let message = config.api.limits.max_message_bytes;
    let slack = 64 * 1024;
    (message * 6 + slack).min(config.api.max_body_bytes.max(message * 2 + slack))
}

/// Reads a request body, refusing it past `limit` bytes with a 413 (a body that
/// breaks off is a 400).
pub(super) async fn read_json(body: Body, limit: usize) -> Result<Value, ApiError> {
    parse_json(&read_body(body, limit).await?)
}

/// [`read_json`], an empty body (or only white space) read as `{}`.
pub(super) async fn read_json_or_empty(body: Body, limit: usize) -> Result<Value, ApiError> {
    let bytes = read_body(body, limit).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Map::new()));
    }
    parse_json(&bytes)
}

pub(super) fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::malformed(format!("body is not valid JSON: {e}")))
}

/// A request body's bytes, refused past `limit` bytes with a 413.
pub(super) async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
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
            // The rest is read and dropped before the answer goes out (see drain).
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("request body is larger than {limit} bytes"),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// The keys a body of type `T` may hold: the properties of its documented schema,
/// in the order declared. Handlers refuse any other key with this list, so what
/// the document names and what is accepted are one list.
pub(super) fn documented_keys<T: PartialSchema>() -> Vec<String> {
    match T::schema() {
        RefOr::T(Schema::Object(object)) => object.properties.keys().cloned().collect(),
        _ => panic!(
            "{} is not documented as an object with properties",
            std::any::type_name::<T>()
        ),
    }
}

/// `body` as a JSON object whose keys are all in `known` (else a 400 saying
/// `not_object`, or a 422 naming the first unknown key and the known ones).
pub(super) fn object<'a>(
    body: &'a Value,
    known: &[String],
    not_object: &str,
) -> Result<&'a Map<String, Value>, ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::malformed(not_object))?;
    if let Some(unknown) = obj.keys().find(|k| !known.contains(k)) {
        return Err(ApiError::invalid(format!(
            "{unknown}: unknown field (known: {})",
            known.join(", ")
        )));
    }
    Ok(obj)
}

/// A message id from the path.
pub(super) fn path_id(id: &str) -> Result<MessageId, ApiError> {
    MessageId::parse(id)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_id", e.to_string()))
}

/// A stream the configuration lets clients write to and read from (403 otherwise).
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

/// A query string that cannot be read as parameters: what is wrong, named by the
/// parameter (the deserializer's own words, the cause axum's rejection wraps).
fn bad_query(e: QueryRejection) -> ApiError {
    let detail = match std::error::Error::source(&e) {
        Some(cause) => cause.to_string(),
        None => e.body_text(),
    };
    ApiError::new(StatusCode::BAD_REQUEST, "bad_query", detail)
}

/// axum's `Query`, refusing (`400 bad_query`) a query whose decoded bytes are not
/// UTF-8: the plain extractor puts U+FFFD in their place, so that two different
/// names (`group=%FF`, `group=%FE`) would read as one.
pub(super) struct StrictQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for StrictQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = parts.uri.query().unwrap_or("");
        if let Err(e) = percent_encoding::percent_decode_str(raw).decode_utf8() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_query",
                format!("the query is not UTF-8 once decoded ({e})"),
            ));
        }
        let Query(query) = Query::<T>::from_request_parts(parts, state)
            .await
            .map_err(bad_query)?;
        Ok(StrictQuery(query))
    }
}

/// A page's `limit` parameter: `default` when not given, else 1 to `max`.
pub(super) fn page_limit(
    given: Option<usize>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    match given {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::invalid(format!("limit {n}: must be 1 to {max}"))),
    }
}

/// A page's cursor parameter `name`: a stream entry id, when given.
pub(super) fn page_cursor(name: &str, given: Option<String>) -> Result<Option<String>, ApiError> {
    match given {
        Some(id) if !entry_id(&id) => Err(ApiError::invalid(format!(
            "{name} {id:?}: {}",
            ENTRY_ID_RULE
        ))),
        other => Ok(other),
    }
}

/// A stream entry id: `<ms>-<seq>` (or `<ms>`), each part below 2^64.
pub(super) fn entry_id(id: &str) -> bool {
    crate::message::EntryId::parse(id).is_some()
}

/// How an entry id refusal ends, after the id.
pub(super) const ENTRY_ID_RULE: &str =
    "not a stream entry id such as \"1700000000000-0\" (two whole numbers below 2^64)";

#[cfg(test)]
mod tests {
    use super::*;

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

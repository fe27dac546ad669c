//! Errors the API returns: `{ "error": code, "detail": text }` with the status that
//! fits the cause.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::message::InvalidMessage;
use crate::store::StoreError;

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// Machine-readable code, e.g. `invalid_field`, `stream_not_allowed`,
    /// `too_large`, `missing_token`.
    pub error: String,
    /// Names the input and the rule.
    pub detail: String,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            detail: detail.into(),
        }
    }

    /// The body could not be read as JSON at all.
    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed_json", detail)
    }

    /// Well-formed JSON, but a field breaks a rule.
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }

    /// 409 `no_journal`: what is asked needs `[journal]`, which `why` names.
    pub fn no_journal(why: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "no_journal",
            format!("no journal configured (journal.url): {why}"),
        )
    }
}

/// The journal did not answer, or refused: 503, to be repeated.
impl From<crate::journal::JournalError> for ApiError {
    fn from(e: crate::journal::JournalError) -> Self {
        Self::unavailable(format!("journal: {e}"))
    }
}

impl From<InvalidMessage> for ApiError {
    fn from(e: InvalidMessage) -> Self {
        match e {
            InvalidMessage::TooLarge(detail) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", detail)
            }
            other => ApiError::invalid(other.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::TooFar {
                due_ms,
                max_delay_ms,
                now_ms,
            } => ApiError::invalid(format!(
                "deliver_at {}: more than api.max_delay ({}) after now ({}, Redis's clock)",
                crate::human::time_utc(due_ms),
                crate::human::millis(max_delay_ms),
                crate::human::time_utc(now_ms),
            )),
            StoreError::BadStream(detail) => ApiError::invalid(format!("stream: {detail}")),
            StoreError::Corrupt(detail) => ApiError::new(StatusCode::CONFLICT, "corrupt", detail),
            StoreError::Busy(detail) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", detail)
            }
            e @ StoreError::NotReplicated { .. } => {
                tracing::warn!(error = %e, "push not confirmed by enough replicas");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_replicated",
                    e.to_string(),
                )
            }
            e @ StoreError::NotJournaled(_) => {
                tracing::warn!(error = %e, "push refused: the journal did not take it");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "journal_unavailable",
                    e.to_string(),
                )
            }
            // A key of the wrong type is a conflict with what Redis holds, not an outage.
            StoreError::Redis(e) if e.code() == Some("WRONGTYPE") => ApiError::new(
                StatusCode::CONFLICT,
                "corrupt",
                format!("a key involved holds something other than delayq expects: {e}"),
            ),
            // The Redis user lacks a right: the deployment's fault, named, not delayq's.
            StoreError::Redis(e) if e.code() == Some("NOPERM") => {
                tracing::warn!(error = %e, "the Redis user may not run what delayq runs");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "redis_permission",
                    format!(
                        "the Redis user may not run what this needs (grant the rule in docs/redis-rights.md): {e}"
                    ),
                )
            }
            // Redis down, slow, or not taking writes now: retrying later may help.
            other if other.is_transient() => {
                tracing::warn!(error = %other, "request failed in Redis");
                ApiError::unavailable(format!("storage unavailable (Redis): {other}"))
            }
            // Anything else is delayq's own fault (a script error, a reply it cannot
            // read): say so, rather than blaming Redis.
            other => {
                tracing::error!(error = %other, "request failed: a fault of delayq's own");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("delayq failed in Redis: {other}"),
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            detail: self.detail,
        };
        (self.status, Json(body)).into_response()
    }
}

/// Gives every error response the JSON shape, including those axum makes itself
/// (unknown method, a path or query it cannot parse), which come as plain text.
pub(super) async fn json_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_owned();
    let reason = status.canonical_reason().unwrap_or("error");
    let code = match status {
        StatusCode::BAD_REQUEST => "bad_request".to_owned(),
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed".to_owned(),
        StatusCode::PAYLOAD_TOO_LARGE => "too_large".to_owned(),
        StatusCode::UNPROCESSABLE_ENTITY => "invalid_field".to_owned(),
        _ => reason.to_ascii_lowercase().replace([' ', '-'], "_"),
    };
    let detail = match (status, parts.headers.get(axum::http::header::ALLOW)) {
        (StatusCode::METHOD_NOT_ALLOWED, Some(allow)) => {
            format!(
                "method not allowed here (allowed: {})",
                allow.to_str().unwrap_or("?")
            )
        }
        _ if text.is_empty() => reason.to_ascii_lowercase(),
        _ => text,
    };
    let body = ErrorBody {
        error: code,
        detail,
    };
    let mut response = (status, Json(body)).into_response();
    for (name, value) in &parts.headers {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            response.headers_mut().insert(name, value.clone());
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(error: StoreError, status: u16, code: &str) {
        let api = ApiError::from(error);
        assert_eq!(
            (api.status.as_u16(), api.code),
            (status, code),
            "{}",
            api.detail
        );
    }

    #[test]
    fn only_redis_being_unavailable_is_a_503() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        check(StoreError::Redis(refused.into()), 503, "unavailable");
        check(StoreError::Busy("too many long polls".into()), 503, "busy");
        for (code, detail) in [
            (
                "NOPERM",
                "this user has no permissions to access one of the keys used as arguments",
            ),
            (
                "NOPERM",
                "this user has no permissions to run the 'xadd' command",
            ),
        ] {
            let e = redis::make_extension_error(code.to_owned(), Some(detail.to_owned()));
            check(StoreError::Redis(e), 503, "redis_permission");
        }
        for (code, detail) in [
            ("MOVED", "3999 127.0.0.1:6381"),
            ("ASK", "3999 127.0.0.1:6381"),
            ("TRYAGAIN", "Multiple keys request during rehashing of slot"),
            ("CLUSTERDOWN", "The cluster is down"),
        ] {
            let e = redis::make_extension_error(code.to_owned(), Some(detail.to_owned()));
            check(StoreError::Redis(e), 503, "unavailable");
        }
        check(
            StoreError::Reply("expected an array".into()),
            500,
            "internal",
        );
        check(
            StoreError::Corrupt("undecodable body".into()),
            409,
            "corrupt",
        );
        let too_far = StoreError::TooFar {
            due_ms: 2,
            max_delay_ms: 1,
            now_ms: 0,
        };
        check(too_far, 422, "invalid_field");
    }

    #[test]
    fn a_due_time_too_far_reads_in_calendar_time() {
        let e = ApiError::from(StoreError::TooFar {
            due_ms: 99_999_999_999_999,
            max_delay_ms: 31_536_000_000,
            now_ms: 1_795_719_824_985,
        });
        assert_eq!(
            e.detail,
            "deliver_at 5138-11-16 09:46:39.999 UTC: more than api.max_delay (365d) after now \
             (2026-11-26 19:03:44.985 UTC, Redis's clock)"
        );
    }
}
